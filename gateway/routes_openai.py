"""OpenAI-compatible routes: `GET /v1/models`, `POST /v1/chat/completions` (streaming and not).

Each completion runs the same agent loop as a session, on a session of its own that ends with the
request. Function tools whose names are server augmentations (`calculator`, `wikipedia`, ...) run
inside the request with intercepts; any other function the model calls is returned to the client as
`tool_calls` (finish_reason `tool_calls`), per OpenAI's protocol, and the client sends its result back
as a `tool` message in the next request.

The assistant's `content` is the ReAct text the model wrote (Thought / Action / Observation / Answer),
server tool observations included, the same streamed and not; the `infercept` field adds the final
answer alone and every intercept with the policy the engine chose.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from gateway.agent import AgentSession
from gateway.app import gw_of
from gateway.calls import intercept_json
from gateway.http import (
    SSE,
    ApiError,
    error_response,
    error_status,
    field,
    int_field,
    number_field,
    read_json,
)
from gateway.prompts import PromptBuilder, ToolSpec
from gateway.routes_sessions import parse_tool_choice
from gateway.state import Gateway
from gateway.toolcalls import json_args_to_text

routes = web.RouteTableDef()


def served_names(gw: Gateway) -> list[str]:
    names = [gw.config.server.model_name or str(gw.engine_config.model)]
    if gw.engine.model_path:
        names.append(str(gw.engine.model_path))
    return names


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    gw = gw_of(request)
    return web.json_response({"object": "list", "data": [
        {"id": served_names(gw)[0], "object": "model", "created": int(time.time()), "owned_by": "infercept",
         "max_model_len": gw.engine_config.max_model_len}]})


def split_tools(gw: Gateway, tools: Sequence[Any]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(server augmentations, client functions) named in an OpenAI `tools` list."""
    server: list[str] = []
    client: dict[str, dict[str, Any]] = {}
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, "invalid_request", "each tool is {\"type\": \"function\", \"function\": {\"name\": ..., ...}}")
        name = fn["name"]
        match = gw.registry.resolve(name)
        if match is not None:
            if match not in server:
                server.append(match)
        else:
            params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
            client[name] = {"description": str(fn.get("description") or "a function the client runs"),
                            "type": "default", "expected_s": None, "parameters": params}
    return server, client


def render_messages(pb: PromptBuilder, specs: list[ToolSpec], messages: Sequence[Any]) -> str:
    """The prompt text for an OpenAI message list. A conversation that ends inside an assistant
    message (tool results just sent back) continues that message."""
    if not messages:
        raise ApiError(400, "invalid_request", "'messages' is empty")
    system: list[str] = []
    chat: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(400, "invalid_request", f"messages[{i}]: role must be system, user, assistant or tool")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if content is not None and not isinstance(content, str):
            raise ApiError(400, "invalid_request", f"messages[{i}].content must be a string or text parts")
        content = content or ""
        role = m["role"]
        if role in ("system", "developer"):
            system.append(content)
        elif role == "user":
            chat.append({"role": "user", "content": content})
        elif role == "assistant":
            text = content
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") if isinstance(tc, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ApiError(400, "invalid_request", f"messages[{i}].tool_calls: each needs function.name")
                text += ("\n" if text and not text.endswith("\n") else "") + f"Action: {fn['name']}[{json_args_to_text(fn.get('arguments') or '')}]"
            chat.append({"role": "assistant", "content": text})
        else:
            if not chat or chat[-1]["role"] != "assistant":
                raise ApiError(400, "invalid_request", f"messages[{i}]: a tool message must follow an assistant message with tool_calls")
            chat[-1]["content"] += PromptBuilder.observation(content)
    head = [{"role": "system", "content": pb.system_text("\n\n".join(system) or None, specs)}, *pb.few_shot(specs)]
    if chat[-1]["role"] == "assistant":
        return pb.render(head + chat[:-1]) + chat[-1]["content"]
    return pb.render(head + chat)


def client_arguments(spec: Mapping[str, Any], text: str) -> str:
    """The JSON arguments of a client function call written as `Name[text]`."""
    props = (spec.get("parameters") or {}).get("properties") or {}
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            return json.dumps(obj)
    except ValueError:
        pass
    key = next(iter(props)) if len(props) == 1 else "input"
    return json.dumps({key: text})


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    ctx = gw.require_ready()
    body = await read_json(request)
    model = field(body, "model", str)
    if model is not None and model not in served_names(gw):
        return error_response(404, "model_not_found", f"model {model!r} is not served here; try {served_names(gw)[0]!r}")
    messages = field(body, "messages", list, required=True)
    if field(body, "n", int, default=1) != 1:
        raise ApiError(400, "invalid_request", "only n=1 is supported")
    limit = gw.engine_config.max_model_len
    max_tokens = int_field(body, "max_completion_tokens", 1, limit) or int_field(body, "max_tokens", 1, limit) or gw.config.server.max_tokens
    temperature = number_field(body, "temperature", 0, 2, default=0.0)
    stream = field(body, "stream", bool, default=False)
    server_tools, client_tools = split_tools(gw, field(body, "tools", list, default=[]))
    tool_choice = parse_tool_choice(body)
    if tool_choice == "none":
        server_tools, client_tools = [], {}
        tool_choice = "auto"
    s = gw.open_session(system=None, tools=server_tools, client_tools=client_tools, max_tokens=max_tokens,
                        temperature=temperature, seed=field(body, "seed", int), ephemeral=True)
    try:
        text = render_messages(ctx.prompts, s.tool_specs(), messages)
        s.start(gw.engine.encode(text), tool_choice)
        return await (_stream(request, gw, s) if stream else _complete(gw, s))
    finally:
        await gw.close_session(s.id)


def _base(s: AgentSession, gw: Gateway, obj: str) -> dict[str, Any]:
    return {"id": s.id, "object": obj, "created": int(s.created_s), "model": served_names(gw)[0]}


def _tool_call(s: AgentSession, pending: Mapping[str, Any]) -> dict[str, Any]:
    spec = s.client_tools.get(pending["tool"], {})
    return {"id": pending["call_id"], "type": "function",
            "function": {"name": pending["tool"], "arguments": client_arguments(spec, pending["arguments"])}}


def _finish(gw: Gateway, s: AgentSession, text: str, last: Mapping[str, Any]) -> tuple[dict[str, Any], str | None, list[dict[str, Any]]]:
    """(message, finish_reason, tool_calls) for a finished loop."""
    pending = last.get("pending_call")
    if pending is not None and pending["kind"] == "client":
        cut = text.rfind("Action:")
        content = text[:cut].rstrip() if cut >= 0 else text
        calls = [_tool_call(s, pending)]
        return {"role": "assistant", "content": content or None, "tool_calls": calls}, "tool_calls", calls
    reason = "length" if last.get("finish_reason") == "length" else "stop"
    return {"role": "assistant", "content": text}, reason, []


async def _complete(gw: Gateway, s: AgentSession) -> web.Response:
    parts: list[str] = []
    last: dict[str, Any] = {}
    async for name, data in s.events():
        if name == "token":
            parts.append(data["text"])
        elif name == "tool_result":
            parts.append(PromptBuilder.observation(data["content"]))
        elif name == "reprompt":
            parts.append(data["text"])
        elif name == "error":
            return error_response(error_status(data), data.get("type", "error"), data.get("message", ""))
        elif name == "done":
            last = data
    text = "".join(parts)
    message, reason, _ = _finish(gw, s, text, last)
    usage = last.get("usage") or {"prompt_tokens": s.usage["prompt_tokens"], "completion_tokens": s.usage["completion_tokens"]}
    intercepts = [intercept_json(r) for r in await gw.engine.intercepts(s.id)]
    gw.metrics.messages.labels("chat_completions", "ok").inc()
    return web.json_response({
        **_base(s, gw, "chat.completion"),
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": {"prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0),
                  "total_tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)},
        "infercept": {"reply": last.get("reply"), "intercepts": intercepts,
                      "calls": [c.to_dict() for c in s.calls]},
    })


async def _stream(request: web.Request, gw: Gateway, s: AgentSession) -> web.StreamResponse:
    sse = SSE(request)
    await sse.open()
    base = _base(s, gw, "chat.completion.chunk")

    async def chunk(delta: dict[str, Any], reason: str | None = None, **extra: Any) -> None:
        await sse.send(None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}], **extra})

    await chunk({"role": "assistant", "content": ""})
    parts: list[str] = []
    last: dict[str, Any] = {}
    events = s.events()
    async with contextlib.aclosing(events):
        async for name, data in events:
            if name == "token":
                parts.append(data["text"])
                await chunk({"content": data["text"]})
            elif name in ("tool_result", "reprompt"):
                text = PromptBuilder.observation(data["content"]) if name == "tool_result" else data["text"]
                parts.append(text)
                await chunk({"content": text})
            elif name in ("intercept", "resume", "tool_call"):
                # An extension event (ignored by OpenAI clients): what the engine did with the call.
                await sse.send(None, {**base, "choices": [], "infercept": {"event": name, **data}})
            elif name == "error":
                await sse.send(None, {"error": {"type": data.get("type"), "message": data.get("message")}})
                await sse.send(None, "[DONE]")
                return await sse.close()
            elif name == "done":
                last = data
    _, reason, calls = _finish(gw, s, "".join(parts), last)
    if calls:
        await chunk({"tool_calls": [{"index": 0, **c} for c in calls]})
    await chunk({}, reason, usage=last.get("usage"))
    await sse.send(None, "[DONE]")
    gw.metrics.messages.labels("chat_completions", "ok").inc()
    return await sse.close()
