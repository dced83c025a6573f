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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from gateway.agent import AgentError, AgentSession
from gateway.api import Api
from gateway.call_parser import ToolChoice, json_args_to_text
from gateway.channel import Event
from gateway.gateway import Gateway, gw_of
from gateway.http import SSE, ApiError, error_body, error_response, error_status, json_body, read_json
from gateway.prompts import PromptBuilder, ToolSpec
from gateway.records import Intercept
from gateway.schemas import ErrorBody
from gateway.schemas_openai import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChoiceMessage,
    CompletionExtras,
    CompletionUsage,
    ModelInfo,
    ModelList,
    NamedToolChoice,
    ToolDef,
    ToolMessage,
)
from gateway.validation import invalid, validate

api = Api("openai")
routes = api.routes


def served_names(gw: Gateway) -> list[str]:
    names = [gw.config.server.model_name or str(gw.engine_config.model)]
    if gw.engine.model_path:
        names.append(str(gw.engine.model_path))
    return names


@api.route("GET", "/v1/models", "The served model (OpenAI's list)", ok={200: ModelList})
async def list_models(request: web.Request) -> web.Response:
    gw = gw_of(request)
    return json_body(ModelList(object="list", data=[
        ModelInfo(id=served_names(gw)[0], object="model", created=int(time.time()), owned_by="infercept",
                  max_model_len=gw.engine_config.max_model_len)]))


def split_tools(gw: Gateway, tools: Sequence[ToolDef]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(server augmentations, client functions) named in an OpenAI `tools` list."""
    server: list[str] = []
    client: dict[str, dict[str, Any]] = {}
    for t in tools:
        fn = t.function
        match = gw.registry.resolve(fn.name)
        if match is not None:
            if match not in server:
                server.append(match)
        else:
            client[fn.name] = {"description": fn.description or "a function the client runs",
                               "type": "default", "expected_s": None, "parameters": fn.parameters or {}}
    return server, client


def _text(content: Any) -> str:
    """A message's content as text (content parts: their text; validation refused other kinds)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(getattr(p, "text", "") for p in content)


def render_messages(pb: PromptBuilder, specs: list[ToolSpec], messages: Sequence[ChatMessage]) -> str:
    """The prompt text for a validated OpenAI message list. A conversation that ends inside an assistant
    message (tool results just sent back) continues that message."""
    system: list[str] = []
    chat: list[dict[str, str]] = []
    for m in messages:
        content = _text(m.content)
        if m.role in ("system", "developer"):
            system.append(content)
        elif m.role == "user":
            chat.append({"role": "user", "content": content})
        elif isinstance(m, AssistantMessage):
            text = content
            for tc in m.tool_calls or []:
                text += ("\n" if text and not text.endswith("\n") else "") + f"Action: {tc.function.name}[{json_args_to_text(tc.function.arguments)}]"
            chat.append({"role": "assistant", "content": text})
        elif isinstance(m, ToolMessage):
            chat[-1]["content"] += PromptBuilder.observation(content)  # validation: it follows its assistant message
    head = [{"role": "system", "content": pb.system_text("\n\n".join(system) or None, specs)}, *pb.few_shot(specs)]
    if chat and chat[-1]["role"] == "assistant":
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


@api.route("POST", "/v1/chat/completions", "OpenAI chat completion, streamed or not", body=ChatCompletionRequest,
           ok={200: ChatCompletion}, errors=(400, 404, 413, 500, 503), named_events=False,
           events={"chunk": ChatCompletionChunk, "error": ErrorBody, "done": "[DONE]"},
           description="Server augmentations named as function tools run inside the request with intercepts; any other "
                       "function the model calls comes back as tool_calls. Streamed (`stream: true`): `data: <chunk>` "
                       "messages without `event:` lines (a chat.completion.chunk; an extension chunk has empty `choices` "
                       "and an `infercept` object naming a tool_call, intercept or resume), then `data: [DONE]`. A turn "
                       "that fails after the stream began sends `data: {\"error\": {\"type\", \"message\"}}`, then "
                       "`data: [DONE]`.")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    ctx = gw.require_ready()
    body = await read_json(request)
    req = validate(ChatCompletionRequest, body)
    problems = req.problems()
    if problems:
        raise invalid(problems)
    if req.model is not None and req.model not in served_names(gw):
        return error_response(404, "model_not_found", f"model {req.model!r} is not served here; try {served_names(gw)[0]!r}")
    if (req.n or 1) != 1:
        raise ApiError(400, "invalid_request", "'n': only n=1 is supported")
    limit = gw.engine_config.max_model_len
    max_tokens = req.max_completion_tokens or req.max_tokens or gw.config.server.max_tokens
    if max_tokens > limit:
        raise ApiError(400, "invalid_request", f"'max_tokens' must be at most {limit} (the model's context length)")
    server_tools, client_tools = split_tools(gw, req.tools or [])
    tool_choice: ToolChoice = "auto"
    if isinstance(req.tool_choice, NamedToolChoice):
        tool_choice = {"name": req.tool_choice.function.name}
    elif req.tool_choice is not None:
        tool_choice = req.tool_choice
    if tool_choice == "none":
        server_tools, client_tools = [], {}
        tool_choice = "auto"
    gw.admit_turn()
    s = await gw.open_session(system=None, tools=server_tools, client_tools=client_tools, max_tokens=max_tokens,
                              temperature=req.temperature if req.temperature is not None else 0.0, seed=req.seed, ephemeral=True)
    try:
        text = render_messages(ctx.prompts, s.tool_specs(), req.messages)
        s.start(gw.engine.encode(text), tool_choice)
        return await (_stream(request, gw, s) if req.stream else _complete(gw, s))
    except AgentError:
        gw.metrics.messages.labels("chat_completions", "refused").inc()
        raise
    finally:
        await gw.close_session(s.id)


async def _events(s: AgentSession, ping: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[Event]:
    """The completion's events one by one; `ping` is called for each quiet interval (SSE keep-alive)."""
    async for batch in s.events():
        if not batch and ping is not None:
            await ping()
        for ev in batch:
            yield ev


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
    async for name, data in _events(s):
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
    intercepts = [Intercept.of(r) for r in await gw.engine.intercepts(s.id)]
    gw.metrics.messages.labels("chat_completions", "ok").inc()
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return json_body(ChatCompletion(
        **_base(s, gw, "chat.completion"),
        choices=[Choice(index=0, message=ChoiceMessage(**message), finish_reason=reason, logprobs=None)],
        usage=CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion),
        infercept=CompletionExtras(reply=last.get("reply"), intercepts=intercepts, calls=list(s.calls)),
    ))


async def _stream(request: web.Request, gw: Gateway, s: AgentSession) -> web.StreamResponse:
    sse = SSE(request)
    await sse.open()
    base = _base(s, gw, "chat.completion.chunk")

    async def send(chunk: ChatCompletionChunk) -> None:
        await sse.send(None, chunk.model_dump(mode="json"))

    async def chunk(delta: dict[str, Any], reason: str | None = None, **extra: Any) -> None:
        await send(ChatCompletionChunk(**base, choices=[{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}],
                                       **extra))

    await chunk({"role": "assistant", "content": ""})
    parts: list[str] = []
    last: dict[str, Any] = {}
    events = _events(s, sse.ping)
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
                await send(ChatCompletionChunk(**base, choices=[], infercept={"event": name, **data}))
            elif name == "error":
                await sse.send(None, error_body(data["type"], data["message"]).model_dump(mode="json"))
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
