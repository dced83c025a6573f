"""The session API: create, message (streamed or not), client tool results, read, delete."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from augmentations.registry import find_tool
from gateway.agent import AgentError, AgentSession, Event
from gateway.api import Api
from gateway.call_parser import ToolChoice
from gateway.gateway import Gateway, gw_of
from gateway.http import ApiError, error_response, error_status, json_body, stream_batches
from gateway.records import Intercept
from gateway.schemas import (
    EVENTS,
    ClientTool,
    CreateSession,
    MessageResult,
    PostMessage,
    PostToolResult,
    SessionCounts,
    SessionCreated,
    SessionInfo,
)
from gateway.validation import parse

api = Api("sessions")
SESSION_HEADER = "X-Infercept-Session"
RETRY_RESEND_S = 2  # a turn that ended in a 503 (the engine restarting, a shutdown, the store, a takeover)
routes = api.routes
SESSION_ERRORS = (400, 403, 404, 503)  # 400: aiohttp refuses a malformed header itself
TURN_ERRORS = (*SESSION_ERRORS, 409, 410, 413, 500)


async def session_of(request: web.Request) -> AgentSession:
    return await gw_of(request).session(request.match_info["sid"], request.headers.get("X-Session-Token", ""))


def client_tools_of(items: list[str | ClientTool], server_tools: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        tool = ClientTool(name=item) if isinstance(item, str) else item
        name = tool.name
        if find_tool(name, [*server_tools, *out]) is not None:
            raise ApiError(400, "invalid_request", f"tool {name!r} is declared twice")
        out[name] = {"description": tool.description or "", "type": tool.type or "default", "expected_s": tool.expected_s}
    return out


def tool_choice_of(choice: Any) -> ToolChoice:
    """"auto" | "required" | "none" | {"name": X}, from any of the accepted spellings."""
    if isinstance(choice, str):
        return choice
    return {"name": choice.name if hasattr(choice, "name") else choice.function.name}


def message_content(gw: Gateway, content: str) -> str:
    """A message's or tool result's content within the configured size."""
    limit = gw.config.server.max_message_chars
    if len(content) > limit:
        raise ApiError(413, "message_too_long", f"'content' has {len(content)} characters; the limit is {limit}")
    return content


async def respond(request: web.Request, gw: Gateway, start: Callable[[], AsyncIterator[list[Event]]], stream: bool,
                  route: str) -> web.StreamResponse:
    # A refusal (AgentError) comes from `start()` itself, before any header is sent: a clean 4xx. After
    # it, a streamed response sends its headers at once (`stream_batches`).
    try:
        events = start()
    except AgentError:
        gw.metrics.messages.labels(route, "refused").inc()
        raise
    async with contextlib.aclosing(events):
        await events.__anext__()  # attached (an empty batch at once): a failure from here on aborts the turn
        if stream:
            resp = await stream_batches(request, events)
            gw.metrics.messages.labels(route, "ok").inc()
            return resp
        collected = [ev async for batch in events for ev in batch]
    name, last = collected[-1]
    out = [{"event": n, **d} for n, d in collected if n != "token"]
    if name == "error":
        gw.metrics.messages.labels(route, "error").inc()
        status = error_status(last)
        # A 503 says when to resend, as every other 503 of the gateway does.
        retry = {"retry_after": RETRY_RESEND_S} if status == 503 else {}
        return error_response(status, last.get("type", "error"), last.get("message", ""), events=out, **retry)
    gw.metrics.messages.labels(route, "ok").inc()
    return json_body(MessageResult(reply=last.get("reply"), state=last.get("state"), finish_reason=last.get("finish_reason"),
                                   usage=last.get("usage"), pending_call=last.get("pending_call"),
                                   text="".join(d["text"] for n, d in collected if n == "token"), events=out))


_SESSION = {"path.sid": "$response.body#/id", "header.X-Session-Token": "$response.body#/token"}


@api.route("POST", "/v1/sessions", "Open an agent session", body=CreateSession, ok={201: SessionCreated},
           errors=(400, 413, 429, 503), links={
               "GetSession": ("GET", "/v1/sessions/{sid}", _SESSION),
               "PostMessage": ("POST", "/v1/sessions/{sid}/messages", _SESSION),
               "PostToolResult": ("POST", "/v1/sessions/{sid}/tool_results", _SESSION),
               "DeleteSession": ("DELETE", "/v1/sessions/{sid}", _SESSION)})
async def create_session(request: web.Request) -> web.Response:
    """The response carries the session's token, shown only here: every later call about the session
    sends it as X-Session-Token."""
    gw = gw_of(request)
    gw.require_ready()
    body = await parse(request, CreateSession)
    tools = gw.resolve_tools(body.tools) if body.tools is not None else gw.registry.names()
    client_tools = client_tools_of(body.client_tools, tools)
    limit = gw.engine_config.max_model_len
    if body.max_tokens is not None and body.max_tokens > limit:
        raise ApiError(400, "invalid_request", f"'max_tokens' must be at most {limit} (the model's context length)")
    s = await gw.open_session(system=body.system, tools=tools, client_tools=client_tools,
                              max_tokens=body.max_tokens or gw.config.server.max_tokens,
                              temperature=body.temperature, seed=body.seed, ignore_eos=body.ignore_eos)
    assert s.token is not None  # a new session's token, shown this once
    resp = json_body(SessionCreated(id=s.id, token=s.token, tools=s.tools, client_tools=list(s.client_tools),
                                    state=s.public_state()), status=201)
    resp.headers[SESSION_HEADER] = s.id  # a balancer learns the session's replica from it (gateway/balancer.py)
    return resp


@api.route("GET", "/v1/sessions", "Count the open sessions by state", ok={200: SessionCounts})
async def list_sessions(request: web.Request) -> web.Response:
    """Counts only: reading or driving a session needs its token."""
    states = gw_of(request).session_states()
    return json_body(SessionCounts(sessions=len(states), by_state={st: states.count(st) for st in set(states)}))


@api.route("GET", "/v1/sessions/{sid}", "Read a session: state, transcript, calls, intercepts", ok={200: SessionInfo},
           errors=SESSION_ERRORS, session=True)
async def get_session(request: web.Request) -> web.Response:
    gw = gw_of(request)
    s = await session_of(request)
    s.touch()
    # The engine's records are the authority on what became of each pause (a policy may have
    # swapped or freed a paused context since it paused).
    try:
        intercepts = [Intercept.of(r) for r in await gw.engine.intercepts(s.id)]
    except Exception:  # the engine died under the call: the session itself is still what it was
        if not gw.engine.dead:
            raise
        intercepts = []
    return json_body(s.info(intercepts))


@api.route("DELETE", "/v1/sessions/{sid}", "End a session and free its KV", ok={204: None}, errors=SESSION_ERRORS, session=True)
async def delete_session(request: web.Request) -> web.Response:
    s = await session_of(request)
    await gw_of(request).close_session(s.id)
    return web.Response(status=204)


@api.route("POST", "/v1/sessions/{sid}/messages", "Send a message; its turn streams back", body=PostMessage,
           ok={200: MessageResult}, errors=TURN_ERRORS, session=True, events=EVENTS)
async def post_message(request: web.Request) -> web.StreamResponse:
    """A new question, or the answer to a pending AskHuman. Streams token, tool_call, intercept,
    tool_result, resume, ... then done or error (`stream: false`: one JSON body with every event)."""
    gw = gw_of(request)
    body = await parse(request, PostMessage)
    # Resolved with no await before the turn starts: a session cannot leave memory in between.
    s = await session_of(request)
    content = message_content(gw, body.content)
    if not content.strip():
        raise ApiError(400, "invalid_request", "'content' is empty")
    gw.admit_turn()
    choice = tool_choice_of(body.tool_choice)
    return await respond(request, gw, lambda: s.send_message(content, choice, body.format), body.stream, "messages")


@api.route("POST", "/v1/sessions/{sid}/tool_results", "Post a client tool's result; the turn continues", body=PostToolResult,
           ok={200: MessageResult}, errors=TURN_ERRORS, session=True, events=EVENTS)
async def post_tool_result(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    body = await parse(request, PostToolResult)
    s = await session_of(request)  # no await before the turn starts (see post_message)
    content = message_content(gw, body.content)
    gw.admit_turn()
    return await respond(request, gw, lambda: s.send_tool_result(body.call_id, content), body.stream, "tool_results")
