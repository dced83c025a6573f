"""The session API: create, message (streamed or not), client tool results, read, delete."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from augmentations.registry import find_tool
from gateway.agent import AgentError, AgentSession, Event
from gateway.app import gw_of
from gateway.calls import intercept_json
from gateway.http import (
    ApiError,
    error_response,
    error_status,
    field,
    int_field,
    number_field,
    read_json,
    stream_events,
)
from gateway.state import Gateway
from gateway.toolcalls import ToolChoice

routes = web.RouteTableDef()


def session_of(request: web.Request) -> AgentSession:
    return gw_of(request).session(request.match_info["sid"], request.headers.get("X-Session-Token", ""))


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
        if find_tool(name, [*server_tools, *out]) is not None:
            raise ApiError(400, "invalid_request", f"tool {name!r} is declared twice")
        exp = item.get("expected_s")
        if exp is not None and (not isinstance(exp, (int, float)) or isinstance(exp, bool) or exp < 0):
            raise ApiError(400, "invalid_request", "'expected_s' must be a non-negative number")
        out[name] = {"description": str(item.get("description") or ""), "type": str(item.get("type") or "default"), "expected_s": exp}
    return out


def parse_tool_choice(body: dict[str, Any]) -> ToolChoice:
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


def message_content(gw: Gateway, body: dict[str, Any]) -> str:
    """The required 'content' string of a message or tool result, within the configured size."""
    content: str = field(body, "content", str, required=True)
    limit = gw.config.server.max_message_chars
    if len(content) > limit:
        raise ApiError(413, "message_too_long", f"'content' has {len(content)} characters; the limit is {limit}")
    return content


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
        return error_response(error_status(last), last.get("type", "error"), last.get("message", ""), events=out)
    gw.metrics.messages.labels(route, "ok").inc()
    return web.json_response({"reply": last.get("reply"), "state": last.get("state"), "finish_reason": last.get("finish_reason"),
                              "usage": last.get("usage"), "pending_call": last.get("pending_call"),
                              "text": "".join(d["text"] for n, d in collected if n == "token"), "events": out})


@routes.post("/v1/sessions")
async def create_session(request: web.Request) -> web.Response:
    gw = gw_of(request)
    gw.require_ready()
    body = await read_json(request)
    system = field(body, "system", str)
    tool_names = field(body, "tools", list, default=None)
    tools = gw.resolve_tools(tool_names) if tool_names is not None else gw.registry.names()
    client_tools = parse_client_tools(field(body, "client_tools", list, default=[]), tools)
    max_tokens = int_field(body, "max_tokens", 1, gw.engine_config.max_model_len, default=gw.config.server.max_tokens)
    s = gw.open_session(system=system, tools=tools, client_tools=client_tools, max_tokens=int(max_tokens or 1),
                        temperature=number_field(body, "temperature", 0, 2, default=0.0), seed=field(body, "seed", int))
    return web.json_response({"id": s.id, "token": s.token, "tools": s.tools, "client_tools": list(s.client_tools),
                              "state": s.public_state()}, status=201)


@routes.get("/v1/sessions")
async def list_sessions(request: web.Request) -> web.Response:
    # Counts by state only: reading or driving a session needs its token.
    states = gw_of(request).session_states()
    return web.json_response({"sessions": len(states), "by_state": {st: states.count(st) for st in set(states)}})


@routes.get("/v1/sessions/{sid}")
async def get_session(request: web.Request) -> web.Response:
    gw = gw_of(request)
    s = session_of(request)
    s.touch()
    desc = s.describe()
    # The engine's records are the authority on what became of each pause (a policy may have
    # swapped or freed a paused context since it paused).
    desc["intercepts"] = [intercept_json(r) for r in await gw.engine.intercepts(s.id)]
    return web.json_response(desc)


@routes.delete("/v1/sessions/{sid}")
async def delete_session(request: web.Request) -> web.Response:
    s = session_of(request)
    await gw_of(request).close_session(s.id)
    return web.Response(status=204)


@routes.post("/v1/sessions/{sid}/messages")
async def post_message(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    s = session_of(request)
    body = await read_json(request)
    content = message_content(gw, body)
    if not content.strip():
        raise ApiError(400, "invalid_request", "'content' is empty")
    stream = field(body, "stream", bool, default=True)
    step_format = field(body, "format", str, default="free")
    if step_format not in ("free", "react"):
        raise ApiError(400, "invalid_request", "'format' must be free or react")
    return await respond(request, gw, s.send_message(content, parse_tool_choice(body), step_format), stream, "messages")


@routes.post("/v1/sessions/{sid}/tool_results")
async def post_tool_result(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    s = session_of(request)
    body = await read_json(request)
    call_id = field(body, "call_id", str, required=True)
    content = message_content(gw, body)
    stream = field(body, "stream", bool, default=True)
    return await respond(request, gw, s.send_tool_result(call_id, content), stream, "tool_results")
