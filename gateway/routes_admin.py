"""Health, tools, artifacts, Prometheus metrics, the engine's accounting, and the API's own document."""

from __future__ import annotations

import dataclasses
import logging

from aiohttp import web

from engine_adapter.engine import sum_integrity
from gateway.api import Api
from gateway.gateway import gw_of
from gateway.http import ApiError, json_body
from gateway.metrics import CONTENT_TYPE
from gateway.schemas import Health, RankStats, Stats, ToolInfo, ToolList

api = Api("admin")
routes = api.routes
log = logging.getLogger("infercept.gateway")


@api.route("GET", "/healthz", "Readiness: 200 once the engine answered", ok={200: Health}, errors=(503,))
async def healthz(request: web.Request) -> web.Response:
    """503 while the engine starts or restarts (with the reason), while draining for shutdown, or if it
    failed to start."""
    status, body = gw_of(request).health()
    headers = {"Retry-After": "5"} if status == 503 and body.status != "failed" else None
    return json_body(body, status=status, headers=headers)


@api.route("GET", "/v1/tools", "The server's tools", ok={200: ToolList})
async def list_tools(request: web.Request) -> web.Response:
    gw = gw_of(request)
    hints = gw.registry.hints()
    return json_body(ToolList(tools=[
        ToolInfo(name=ex.name, type=ex.aug_type, description=ex.description, expected_s=hints[ex.name].expected_s,
                 timeout_s=gw.timeouts.get(ex.name) or gw.config.server.tool_timeout_s)
        for ex in (gw.registry.get(n) for n in gw.registry.names())]))


@api.route("GET", "/v1/artifacts/{aid}", "An image or audio file a tool made", ok={200: "application/octet-stream"}, errors=(404,))
async def get_artifact(request: web.Request) -> web.Response:
    """The URL is the capability (unguessable): no key or token needed, so an <img> can load it."""
    item = await gw_of(request).artifacts.fetch(request.match_info["aid"])
    if item is None:
        raise ApiError(404, "not_found", "no such artifact (it may have expired)")
    try:
        data = await gw_of(request).artifacts.read(item)
    except FileNotFoundError:
        raise ApiError(404, "not_found", "no such artifact (it may have expired)") from None
    return web.Response(body=data, content_type=item.mime, headers={"Cache-Control": "private, max-age=3600"})


@api.route("GET", "/metrics", "Prometheus metrics (infercept's and vLLM's)", ok={200: "text/plain"})
async def metrics(request: web.Request) -> web.Response:
    gw = gw_of(request)
    if gw.ready.is_set():
        try:
            total, ranks = await gw.engine.stats_by_rank()
            gw.metrics.refresh(total, gw.session_states())
            gw.metrics.refresh_ranks(ranks, gw.engine.sessions_per_rank())
        except Exception as e:  # the engine went away under the scrape: serve the last values
            log.warning("metrics: engine stats unavailable (%s)", e)
    gw.metrics.refresh_gateway(gw.table.busy_count(), gw.store)
    return web.Response(body=gw.metrics.render(with_vllm=gw.engine_config.log_stats), headers={"Content-Type": CONTENT_TYPE})


@api.route("GET", "/v1/stats", "The engine's accounting: KV blocks by state, totals, waste", ok={200: Stats}, errors=(503,))
async def engine_stats(request: web.Request) -> web.Response:
    """For dashboards and load tests: KV blocks by state (checked: free + running + preserved == total),
    requests running and waiting in the engine, turns in progress, and the session store's commits."""
    gw = gw_of(request)
    gw.require_ready()
    stats, ranks = await gw.engine.stats_by_rank()
    checks = await gw.engine.integrity_by_rank()
    integrity = sum_integrity(checks)
    pinned = gw.engine.sessions_per_rank()
    return json_body(Stats(
        blocks=dataclasses.asdict(stats.blocks), block_size=stats.block_size, policy=stats.policy,
        totals=dataclasses.asdict(stats.totals), waste=dataclasses.asdict(stats.waste), paused=stats.paused,
        running=stats.running, waiting=stats.waiting, sessions=len(gw.sessions),
        turns_in_progress=gw.table.busy_count(), integrity=dataclasses.asdict(integrity),
        store={"path": gw.store.path, "commits": gw.store.commits, "writes": gw.store.writes},
        ranks=[RankStats(rank=r, sessions=pinned[r], blocks=dataclasses.asdict(st.blocks), paused=st.paused,
                         running=st.running, waiting=st.waiting, integrity=dataclasses.asdict(checks[r]))
               for r, st in enumerate(ranks)],
    ))
