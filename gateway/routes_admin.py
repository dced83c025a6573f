"""Health, tools, artifacts, Prometheus metrics and the engine's accounting."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from gateway.app import gw_of
from gateway.http import ApiError
from gateway.metrics import CONTENT_TYPE

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    gw = gw_of(request)
    body = {"model": gw.engine_config.model, "policy": gw.engine_config.policy}
    if gw.ready.is_set():
        return web.json_response({"status": "ok", **body})
    if gw.start_error is not None:
        return web.json_response({"status": "failed", "error": str(gw.start_error), **body}, status=503)
    return web.json_response({"status": "starting", **body}, status=503)


@routes.get("/v1/tools")
async def list_tools(request: web.Request) -> web.Response:
    gw = gw_of(request)
    hints = gw.registry.hints()
    return web.json_response({"tools": [
        {"name": ex.name, "type": ex.aug_type, "description": ex.description, "expected_s": hints[ex.name].expected_s,
         "timeout_s": gw.timeouts.get(ex.name) or gw.config.server.tool_timeout_s}
        for ex in (gw.registry.get(n) for n in gw.registry.names())]})


@routes.get("/v1/artifacts/{aid}")
async def get_artifact(request: web.Request) -> web.Response:
    item = gw_of(request).artifacts.get(request.match_info["aid"])
    if item is None:
        raise ApiError(404, "not_found", "no such artifact (it may have expired)")
    return web.Response(body=item.artifact.data, content_type=item.artifact.mime,
                        headers={"Cache-Control": "private, max-age=3600"})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    gw = gw_of(request)
    if gw.ready.is_set():
        gw.metrics.refresh(await gw.engine.stats(), gw.session_states())
    return web.Response(body=gw.metrics.render(with_vllm=gw.engine_config.log_stats), headers={"Content-Type": CONTENT_TYPE})


@routes.get("/v1/stats")
async def engine_stats(request: web.Request) -> web.Response:
    """The engine's own accounting (KV blocks by state, totals, waste), as JSON for dashboards."""
    gw = gw_of(request)
    gw.require_ready()
    stats = await gw.engine.stats()
    return web.json_response({
        "blocks": dataclasses.asdict(stats.blocks), "block_size": stats.block_size, "policy": stats.policy,
        "totals": dataclasses.asdict(stats.totals), "waste": dataclasses.asdict(stats.waste), "paused": stats.paused,
        "running": stats.running, "waiting": stats.waiting, "sessions": len(gw.sessions),
    })
