"""The aiohttp application: agent sessions over REST with streaming, OpenAI-compatible routes,
artifacts, metrics. `create_app(gateway)` builds it; `Gateway` holds what the routes share (the
engine, the tool registry, the sessions) and owns their lifecycle.

The engine starts in the background after the HTTP server is up: `/healthz` answers 503 until the
engine has done one real round trip, and routes that need the engine answer 503 until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from augmentations.factory import build_registry, tool_key
from augmentations.registry import Registry
from engine_adapter.config import EngineConfig
from engine_adapter.engine import InterceptEngine, TurnEnd
from engine_adapter.hints import ToolHint
from gateway.agent import AgentError, AgentSession, Event
from gateway.artifacts import ArtifactStore
from gateway.config import GatewayConfig
from gateway.http import ApiError, error_response, field, int_field, read_json, stream_events
from gateway.metrics import CONTENT_TYPE, GatewayMetrics
from gateway.prompts import PromptBuilder

log = logging.getLogger("infercept.gateway")
STATIC = Path(__file__).resolve().parent / "static"
GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")


class Gateway:
    def __init__(self, engine_config: EngineConfig, config: GatewayConfig, registry: Registry | None = None,
                 timeouts: dict[str, float | None] | None = None) -> None:
        self.engine_config = engine_config
        self.config = config
        if registry is None:
            registry, timeouts = build_registry(config.augmentations)
        self.registry = registry
        self.timeouts = timeouts or {}
        self.engine = InterceptEngine(engine_config)
        self.metrics = GatewayMetrics()
        self.artifacts = ArtifactStore(config.server.artifact_store_mb * 2**20)
        self.sessions: dict[str, AgentSession] = {}
        self.prompts: PromptBuilder | None = None
        self.ready = asyncio.Event()
        self.start_error: BaseException | None = None
        self._json_parser: Any = None
        self._tasks: list[asyncio.Task[Any]] = []

    # ------------------------------------------------------------------ lifecycle
    async def start_engine(self) -> None:
        try:
            t0 = time.perf_counter()
            await self.engine.start()
            self.prompts = PromptBuilder(self.engine.tokenizer)
            # One real round trip before saying ready.
            s = self.engine.open_session(max_tokens=2)
            async for ev in s.turn("Hello"):
                if isinstance(ev, TurnEnd):
                    pass
            await s.close()
            self.ready.set()
            stats = await self.engine.stats()
            log.info("engine ready in %.1f s: model=%s policy=%s kv_blocks=%d block_size=%d tools=%s",
                        time.perf_counter() - t0, self.engine.model_path, stats["policy"], stats["blocks"]["total"],
                        stats["block_size"], ",".join(self.registry.names()))
        except BaseException as e:
            self.start_error = e
            log.exception("engine failed to start")
            raise

    async def on_startup(self, app: web.Application) -> None:
        self._tasks.append(asyncio.create_task(self._start_engine_quietly()))
        self._tasks.append(asyncio.create_task(self._expire_loop()))

    async def _start_engine_quietly(self) -> None:
        with contextlib.suppress(Exception):
            await self.start_engine()

    async def on_cleanup(self, app: web.Application) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for s in list(self.sessions.values()):
            await s.close()
        self.sessions.clear()
        await self.registry.close()
        await self.engine.shutdown()

    async def _expire_loop(self) -> None:
        idle = self.config.server.session_idle_s
        while True:
            await asyncio.sleep(min(30.0, max(0.05, idle / 4)))
            await self.expire_idle()

    async def expire_idle(self) -> int:
        now, idle, n = time.monotonic(), self.config.server.session_idle_s, 0
        for s in list(self.sessions.values()):
            waiting = s.state in ("idle", "awaiting_user") or (s._pending is not None)
            if waiting and now - s.last_active_s > idle:
                await self.close_session(s.id)
                self.metrics.sessions_expired.inc()
                n += 1
        return n

    # ------------------------------------------------------------------ sessions
    def require_ready(self) -> None:
        if not self.ready.is_set():
            msg = f"the engine failed to start: {self.start_error}" if self.start_error else "the engine is starting"
            raise ApiError(503, "not_ready", msg)

    def resolve_tools(self, names: list[Any]) -> list[str]:
        out: list[str] = []
        for n in names:
            if not isinstance(n, str):
                raise ApiError(400, "invalid_request", "'tools' must be a list of tool names")
            key = tool_key(n)
            name = self.registry.get(n).name if n in self.registry else next(
                (t for t in self.registry.names() if key is not None and tool_key(t) == key), None)
            if name is None:
                raise ApiError(400, "unknown_tool", f"unknown tool {n!r}; available: {', '.join(self.registry.names())}")
            if name not in out:
                out.append(name)
        return out

    def open_session(self, *, system: str | None, tools: list[str], client_tools: dict[str, dict[str, Any]],
                     max_tokens: int, temperature: float, seed: int | None, ephemeral: bool = False) -> AgentSession:
        if not ephemeral and len([s for s in self.sessions.values() if not s.id.startswith("chatcmpl")]) >= self.config.server.max_sessions:
            raise ApiError(429, "too_many_sessions", f"the server holds its limit of {self.config.server.max_sessions} sessions; close one")
        hints: dict[str, ToolHint] = self.registry.hints(tools)
        for name, spec in client_tools.items():
            hints[name] = ToolHint(str(spec.get("type") or "default"), spec.get("expected_s"))
        sid = ("chatcmpl-" if ephemeral else "sess-") + secrets.token_hex(12)
        es = self.engine.open_session(session_id=sid, tools=hints, max_tokens=max_tokens, temperature=temperature, seed=seed)
        s = AgentSession(self, es, system=system, tools=tools, client_tools=client_tools, max_tokens=max_tokens)
        self.sessions[sid] = s
        return s

    async def close_session(self, sid: str) -> None:
        s = self.sessions.pop(sid, None)
        if s is not None:
            await s.close()

    def session_for(self, request: web.Request) -> AgentSession:
        sid = request.match_info["sid"]
        s = self.sessions.get(sid)
        if s is None:
            raise ApiError(404, "not_found", f"no session {sid!r}")
        token = request.headers.get("X-Session-Token", "")
        if not secrets.compare_digest(token.encode(), s.token.encode()):
            raise ApiError(403, "forbidden", "missing or wrong X-Session-Token for this session")
        return s

    def parse_json_calls(self, text: str) -> list[tuple[str, str]]:
        """JSON tool calls in `text`, through vLLM's Hermes tool parser."""
        if self._json_parser is None:
            from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

            self._json_parser = ToolParserManager.get_tool_parser("hermes")(self.engine.tokenizer)
        info = self._json_parser.extract_tool_calls(text, request=None)
        return [(c.function.name, c.function.arguments) for c in info.tool_calls] if info.tools_called else []

    def session_states(self) -> list[str]:
        return [s.public_state() for s in self.sessions.values()]


# ---------------------------------------------------------------------- middlewares
@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e.status, e.kind, str(e), **e.extra)
    except AgentError as e:
        return error_response(e.status, e.kind, str(e), **e.extra)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(e.status, "http_error")
        return error_response(e.status, kind, e.reason or str(e))
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", f"{type(e).__name__}: {e}")


@web.middleware
async def auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    key = request.app[GATEWAY_KEY].config.server.api_key
    if key and request.path.startswith("/v1/") and not request.path.startswith("/v1/artifacts/"):
        got = request.headers.get("Authorization", "")
        if not got.startswith("Bearer ") or not secrets.compare_digest(got[7:].encode(), key.encode()):
            return error_response(401, "unauthorized", "a valid 'Authorization: Bearer <key>' header is required")
    return await handler(request)


# ---------------------------------------------------------------------- routes
routes = web.RouteTableDef()


def gw_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    gw = gw_of(request)
    body = {"model": gw.engine_config.model, "policy": gw.engine_config.policy}
    if gw.ready.is_set():
        return web.json_response({"status": "ok", **body})
    if gw.start_error is not None:
        return web.json_response({"status": "failed", "error": str(gw.start_error), **body}, status=503)
    return web.json_response({"status": "starting", **body}, status=503)


@routes.post("/v1/sessions")
async def create_session(request: web.Request) -> web.Response:
    gw = gw_of(request)
    gw.require_ready()
    body = await read_json(request)
    system = field(body, "system", str)
    tool_names = field(body, "tools", list, default=None)
    tools = gw.resolve_tools(tool_names) if tool_names is not None else gw.registry.names()
    client_tools = parse_client_tools(field(body, "client_tools", list, default=[]), tools)
    limit = gw.engine_config.max_model_len
    max_tokens = int_field(body, "max_tokens", 1, limit, default=gw.config.server.max_tokens)
    temperature = field(body, "temperature", (int, float), default=0.0)
    if not 0 <= temperature <= 2:
        raise ApiError(400, "invalid_request", "'temperature' must be between 0 and 2")
    seed = field(body, "seed", int)
    s = gw.open_session(system=system, tools=tools, client_tools=client_tools, max_tokens=int(max_tokens or 1),
                        temperature=float(temperature), seed=seed)
    return web.json_response({"id": s.id, "token": s.token, "tools": s.tools, "client_tools": list(s.client_tools),
                              "state": s.public_state()}, status=201)


def parse_client_tools(items: list[Any], server_tools: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
            raise ApiError(400, "invalid_request", "each client tool is a name or {name, description?, type?, expected_s?}")
        name = item["name"].strip()
        if not name.replace("_", "").replace("-", "").isalnum() or not name[0].isalpha():
            raise ApiError(400, "invalid_request", f"client tool name {name!r}: letters, digits, '_' and '-', starting with a letter")
        if name.lower() in (t.lower() for t in server_tools) or name in out:
            raise ApiError(400, "invalid_request", f"tool {name!r} is declared twice")
        exp = item.get("expected_s")
        if exp is not None and (not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp < 0):
            raise ApiError(400, "invalid_request", "'expected_s' must be a non-negative number")
        out[name] = {"description": str(item.get("description") or ""), "type": str(item.get("type") or "default"), "expected_s": exp}
    return out


@routes.get("/v1/sessions/{sid}")
async def get_session(request: web.Request) -> web.Response:
    gw = gw_of(request)
    s = gw.session_for(request)
    s.touch()
    desc = s.describe()
    desc["intercepts"] = [summarize_intercept(r) for r in await gw.engine.intercepts(s.id)]
    return web.json_response(desc)


def summarize_intercept(r: dict[str, Any]) -> dict[str, Any]:
    preserved = r.get("tokens_kept", 0) if r.get("restored_by") in ("preserve", None) else 0
    return {
        "intercept_id": r["intercept_id"], "type": r["aug_type"], "tool": r["tool"], "trigger": r["trigger"],
        "policy": r["action"], "engine_policy": r["policy"], "kv_fate": r["kv_fate"],
        "context_tokens": r["context_tokens"], "expected_duration_s": r["expected_duration_s"],
        "duration_s": r["call_duration_s"], "restored_by": r["restored_by"],
        "tokens_preserved": preserved, "tokens_swapped": r.get("tokens_swapped_in", 0),
        "tokens_recomputed": r.get("tokens_recomputed"), "tokens_prefix_hit": r.get("tokens_prefix_hit", 0),
    }


@routes.delete("/v1/sessions/{sid}")
async def delete_session(request: web.Request) -> web.Response:
    gw = gw_of(request)
    s = gw.session_for(request)
    await gw.close_session(s.id)
    return web.Response(status=204)


async def respond(request: web.Request, gw: Gateway, events: AsyncIterator[Event], stream: bool, route: str) -> web.StreamResponse:
    # The first event (or an AgentError) comes before any header is sent, so a refusal is a clean 4xx.
    try:
        first = await events.__anext__()
    except AgentError:
        gw.metrics.messages.labels(route, "refused").inc()
        raise
    async with contextlib.aclosing(events):
        if stream:
            resp = await stream_events(request, first, events)
            gw.metrics.messages.labels(route, "ok").inc()
            return resp
        collected = [first] + [ev async for ev in events]
    name, last = collected[-1]
    out = [{"event": n, **d} for n, d in collected if n != "token"]
    if name == "error":
        gw.metrics.messages.labels(route, "error").inc()
        status = 413 if last.get("type") == "context_too_long" else 500
        return error_response(status, last.get("type", "error"), last.get("message", ""), events=out)
    gw.metrics.messages.labels(route, "ok").inc()
    return web.json_response({"reply": last.get("reply"), "state": last.get("state"), "finish_reason": last.get("finish_reason"),
                              "usage": last.get("usage"), "pending_call": last.get("pending_call"),
                              "text": "".join(d["text"] for n, d in collected if n == "token"), "events": out})


def message_content(gw: Gateway, body: dict[str, Any]) -> str:
    """The required 'content' string of a message or tool result, within the configured size."""
    content: str = field(body, "content", str, required=True)
    limit = gw.config.server.max_message_chars
    if len(content) > limit:
        raise ApiError(413, "message_too_long", f"'content' has {len(content)} characters; the limit is {limit}")
    return content


@routes.post("/v1/sessions/{sid}/messages")
async def post_message(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    s = gw.session_for(request)
    body = await read_json(request)
    content = message_content(gw, body)
    if not content.strip():
        raise ApiError(400, "invalid_request", "'content' is empty")
    stream = field(body, "stream", bool, default=True)
    return await respond(request, gw, s.send_message(content, parse_tool_choice(body)), stream, "messages")


def parse_tool_choice(body: dict[str, Any]) -> str | dict[str, Any]:
    """"auto" | "required" | "none" | {"name": X} | OpenAI's {"type": "function", "function": {"name": X}}."""
    choice = field(body, "tool_choice", (str, dict), default="auto")
    if isinstance(choice, str):
        if choice not in ("auto", "required", "none"):
            raise ApiError(400, "invalid_request", "'tool_choice' must be auto, required, none or {\"name\": TOOL}")
        return choice
    name = choice.get("name") or (choice.get("function") or {}).get("name")
    if not isinstance(name, str):
        raise ApiError(400, "invalid_request", "'tool_choice' object needs a tool name")
    return {"name": name}


@routes.post("/v1/sessions/{sid}/tool_results")
async def post_tool_result(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    s = gw.session_for(request)
    body = await read_json(request)
    call_id = field(body, "call_id", str, required=True)
    content = message_content(gw, body)
    stream = field(body, "stream", bool, default=True)
    return await respond(request, gw, s.send_tool_result(call_id, content), stream, "tool_results")


@routes.get("/v1/sessions")
async def list_sessions(request: web.Request) -> web.Response:
    # Ids and states only: reading or driving a session needs its token.
    gw = gw_of(request)
    return web.json_response({"sessions": len(gw.sessions), "by_state": dict(
        (st, gw.session_states().count(st)) for st in set(gw.session_states()))})


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
    gw = gw_of(request)
    item = gw.artifacts.get(request.match_info["aid"])
    if item is None:
        raise ApiError(404, "not_found", "no such artifact (it may have expired)")
    return web.Response(body=item.artifact.data, content_type=item.artifact.mime,
                        headers={"Cache-Control": "private, max-age=3600"})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    gw = gw_of(request)
    if gw.ready.is_set():
        gw.metrics.refresh(await gw.engine.stats(), gw.session_states())
    return web.Response(body=gw.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


@routes.get("/v1/stats")
async def engine_stats(request: web.Request) -> web.Response:
    """The engine's own accounting (KV blocks by state, totals, waste), as JSON for dashboards."""
    gw = gw_of(request)
    gw.require_ready()
    stats = await gw.engine.stats()
    stats.pop("swap", None) if stats.get("swap") is None else stats["swap"].pop("recent_budgets", None)
    return web.json_response({"blocks": stats["blocks"], "block_size": stats["block_size"], "policy": stats["policy"],
                              "totals": stats["totals"], "waste": stats["waste"], "paused": stats["paused"],
                              "running": stats["running"], "waiting": stats["waiting"], "sessions": len(gw.sessions)})


def create_app(gateway: Gateway) -> web.Application:
    from gateway.openai_api import routes as openai_routes

    app = web.Application(middlewares=[errors_middleware, auth_middleware], client_max_size=4 * 2**20)
    app[GATEWAY_KEY] = gateway
    app.add_routes(routes)
    app.add_routes(openai_routes)
    if (STATIC / "index.html").is_file():
        async def index(request: web.Request) -> web.FileResponse:
            return web.FileResponse(STATIC / "index.html")

        app.router.add_get("/", index)
        app.router.add_static("/static/", STATIC)
    app.on_startup.append(gateway.on_startup)
    app.on_cleanup.append(gateway.on_cleanup)
    return app
