"""One agent session: the ReAct loop between the model (an engine session) and the tools.

The loop runs in a task of its own (`_drive`) that outlives any one HTTP request: when the model calls
`AskHuman` or a tool the client executes itself, the loop awaits a future while the engine keeps the
session paused under its intercept policy, and the current response ends (`done` with the state
`awaiting_user` or `in_tool`). The request that brings the answer (the next message, or
`POST /tool_results`) resolves the future and reads the rest of the events. A consumer that goes away
before its `done` (client disconnect) cancels the loop: the engine aborts the generation and frees its
KV, and the session stays usable for the next message.

Events are `(name, data)` pairs, in order: token, tool_call, intercept, tool_result, resume, ..., then
done or error (see the README's API section). What the engine decided at a pause comes with the turn's
end (`TurnEnd.intercept`) and how the context came back with the next turn (`Resumed`): no round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from augmentations.base import CallContext, ToolError, ToolResult
from augmentations.registry import Registry
from engine_adapter.engine import InterceptEngine
from engine_adapter.events import (
    ContextTooLong,
    EngineError,
    Resumed,
    TokenDelta,
    TurnEnd,
)
from engine_adapter.intercept.records import InterceptRecord
from engine_adapter.session import Session
from engine_adapter.triggers import OBSERVATION
from gateway.artifacts import ArtifactStore
from gateway.calls import (
    HUMAN_TOOL,
    CallRecord,
    intercept_event,
    resolve_call,
    resume_event,
    run_server_tool,
)
from gateway.config import ServerConfig
from gateway.metrics import GatewayMetrics
from gateway.prompts import PromptBuilder, ToolSpec
from gateway.toolcalls import CallParser, ToolChoice, ToolChoiceError, choice_regex, react_step_regex

log = logging.getLogger("infercept.gateway")

State = Literal["idle", "generating", "in_tool", "awaiting_user", "closed"]
Event = tuple[str, dict[str, Any]]
StepFormat = Literal["free", "react"]
TERMINAL = ("done", "error")
ANSWER = re.compile(r"Answer:\s*(.*)", re.DOTALL)
# Appended after an observation the model began itself (the "observation" trigger), to let it call a tool
# or answer instead.
REPROMPT = " none: no tool was called, and only a tool writes an observation.\nThought:"


class AgentError(Exception):
    """A request the session cannot take now; `status` is the HTTP code the gateway answers with."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra


@dataclass(frozen=True)
class AgentContext:
    """What an agent session needs from the gateway: built once, when the engine is ready."""

    engine: InterceptEngine
    registry: Registry
    limits: ServerConfig
    metrics: GatewayMetrics
    prompts: PromptBuilder
    artifacts: ArtifactStore
    calls: CallParser
    timeouts: Mapping[str, float | None] = field(default_factory=dict)  # per executor name


@dataclass
class _Pending:
    call: CallRecord
    future: asyncio.Future[str]


class AgentSession:
    def __init__(self, ctx: AgentContext, engine_session: Session, *, system: str | None, tools: list[str],
                 client_tools: dict[str, dict[str, Any]], max_tokens: int) -> None:
        self.ctx = ctx
        self.es = engine_session
        self.id = engine_session.id
        self.token = secrets.token_urlsafe(24)
        self.system = system
        self.tools = tools  # server tool names, as the executors spell them
        self.client_tools = client_tools  # name -> {"description": ...}
        self.max_tokens = max_tokens
        self.created_s = time.time()
        self.last_active_s = time.monotonic()
        self.state: State = "idle"
        self.transcript: list[dict[str, Any]] = []
        self.calls: list[CallRecord] = []
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._pending: _Pending | None = None
        self._last_end: TurnEnd | None = None

    # ------------------------------------------------------------------ public
    def touch(self) -> None:
        self.last_active_s = time.monotonic()

    @property
    def pending_call(self) -> CallRecord | None:
        """The call the session waits on (a human's answer or a client tool's result)."""
        return self._pending.call if self._pending is not None else None

    @property
    def waiting_for_outside(self) -> bool:
        """Nothing runs on the server's side: waiting for the user or a client."""
        return self.state in ("idle", "awaiting_user") or self._pending is not None

    def public_state(self) -> str:
        # `idle` (nothing asked yet, or the last answer given) is what a client sees as waiting for it.
        return "awaiting_user" if self.state == "idle" else self.state

    def tool_specs(self) -> list[ToolSpec]:
        specs = [ToolSpec(ex.name, ex.description) for ex in (self.ctx.registry.get(n) for n in self.tools)]
        specs += [ToolSpec(name, spec.get("description") or "a tool the client runs") for name, spec in self.client_tools.items()]
        return specs

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.public_state(),
            "tools": self.tools + list(self.client_tools),
            "client_tools": list(self.client_tools),
            "created": self.created_s,
            "context_tokens": self.es.context_tokens,
            "usage": dict(self.usage),
            "pending_call": self.pending_call.to_dict() if self.pending_call else None,
            "transcript": list(self.transcript),
            "calls": [c.to_dict() for c in self.calls],
        }

    async def send_message(self, content: str, tool_choice: ToolChoice = "auto",
                           step_format: StepFormat = "free") -> AsyncIterator[Event]:
        """Events for a user message: a new question, or the answer to a pending AskHuman."""
        self.touch()
        if self.state == "closed":
            raise AgentError(410, "session_closed", "the session is closed")
        pending = self._pending
        if pending is not None and pending.call.kind == "human":
            self.transcript.append({"role": "user", "content": content, "answers": pending.call.call_id})
            self._resolve(pending, content)
        elif pending is not None:
            raise AgentError(409, "awaiting_tool_result",
                             f"the session waits for the result of client tool call {pending.call.call_id} "
                             f"({pending.call.tool}); POST it to /v1/sessions/{self.id}/tool_results",
                             call_id=pending.call.call_id)
        elif self.state != "idle":
            raise AgentError(409, "session_busy", f"the session is {self.state}; wait for its done event")
        else:
            self.start(self._message_tokens(content), tool_choice, step_format)
            self.transcript.append({"role": "user", "content": content})
        async for ev in self._consume():
            yield ev

    def start(self, tokens: list[int], tool_choice: ToolChoice = "auto", step_format: StepFormat = "free") -> None:
        """Start the loop on these tokens (a message's, or a whole prompt the OpenAI route rendered).
        `tool_choice` constrains the first model turn; `step_format` "react" constrains every turn to one
        ReAct step (structured outputs)."""
        if self.state != "idle" or self._pending is not None:
            raise AgentError(409, "session_busy", f"the session is {self.public_state()}")
        try:
            self.es.check_room(len(tokens))
            names = self.tools + list(self.client_tools)
            regex = choice_regex(tool_choice, names)
            step = react_step_regex(names) if step_format == "react" else None
        except ContextTooLong as e:
            raise AgentError(413, "context_too_long", f"the context would be {e.tokens - 1} tokens; the model's "
                             f"limit is {e.limit}", tokens=e.tokens - 1, limit=e.limit) from e
        except ToolChoiceError as e:
            raise AgentError(400, e.kind, str(e)) from e
        self.state = "generating"
        self._task = asyncio.create_task(self._drive(tokens, regex or step, step), name=f"agent-{self.id}")

    async def events(self) -> AsyncIterator[Event]:
        """The events of the loop started with `start`, up to the next done/error."""
        async for ev in self._consume():
            yield ev

    async def send_tool_result(self, call_id: str, content: str) -> AsyncIterator[Event]:
        self.touch()
        pending = self._pending
        if pending is None or pending.call.kind != "client":
            raise AgentError(409, "no_pending_call", "the session is not waiting for a client tool result")
        if pending.call.call_id != call_id:
            raise AgentError(404, "unknown_call", f"no pending call {call_id!r}; the session waits for {pending.call.call_id}")
        self._resolve(pending, content)
        async for ev in self._consume():
            yield ev

    async def close(self) -> None:
        if self.state == "closed":
            return
        self.state = "closed"
        await self._cancel_loop()
        # A response still reading this session's events ends with this.
        self._emit("error", type="session_closed", message="the session was closed")
        await self.es.close()
        for name in self.tools:
            end = getattr(self.ctx.registry.get(name), "end_session", None)
            if end is not None:
                await end(self.id)

    # ------------------------------------------------------------------ plumbing
    def _resolve(self, pending: _Pending, content: str) -> None:
        self._pending = None
        self.state = "in_tool"
        if not pending.future.done():
            pending.future.set_result(content)

    async def _consume(self) -> AsyncIterator[Event]:
        """Read the loop's events up to the next terminal one. Leaving early cancels the loop."""
        finished = False
        try:
            while True:
                name, data = await self._queue.get()
                yield name, data
                if name in TERMINAL:
                    finished = True
                    return
        finally:
            self.touch()
            if not finished:
                await self._abort()

    async def _cancel_loop(self) -> None:
        """Stop the loop task (aborting its generation in the engine) and forget a pending call."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self._pending = None

    async def _abort(self) -> None:
        await self._cancel_loop()
        self._queue = asyncio.Queue()  # nothing stale reaches the next consumer
        if self.state != "closed":
            self.state = "idle"
        self.ctx.metrics.disconnects.inc()

    def _emit(self, name: str, **data: Any) -> None:
        self._queue.put_nowait((name, data))

    def _message_tokens(self, content: str) -> list[int]:
        first = self._last_end is None and not self.es.history
        text = self.ctx.prompts.message(content, first=first, system=self.system, tools=self.tool_specs(),
                                        after_eos=self._last_end is not None and self._last_end.reason == "stop")
        return self.ctx.engine.encode(text)

    # ------------------------------------------------------------------ the loop
    async def _drive(self, tokens: list[int], regex: str | None = None, step_regex: str | None = None) -> None:
        try:
            await self._loop(tokens, regex, step_regex)
        except asyncio.CancelledError:
            raise
        except ContextTooLong as e:
            self.state = "idle"
            self._emit("error", type="context_too_long", message=str(e), tokens=e.tokens, limit=e.limit)
        except EngineError as e:
            self.state = "idle"
            self._emit("error", type="engine_error", message=str(e))
        except Exception as e:  # never a dead session: report, and wait for the next message
            log.exception("agent loop failed in session %s", self.id)
            self.state = "idle"
            self._emit("error", type="internal_error", message=f"{type(e).__name__}: {e}")

    async def _loop(self, tokens: list[int], regex: str | None, step_regex: str | None) -> None:
        limits = self.ctx.limits
        calls_this_message = 0
        reply_text: list[str] = []
        prompt_tokens, completion_tokens = len(tokens), 0
        resume_of: CallRecord | None = None  # the call whose result the next turn resumes after
        chat_resume = self._last_end is not None  # a new message resumes the turn-end (chat) intercept
        reprompts = 0
        while True:
            self.state = "generating"
            end: TurnEnd | None = None
            announce = resume_of is not None or chat_resume
            async for ev in self.es.turn(tokens, self.max_tokens, regex):
                if isinstance(ev, Resumed):
                    if announce:
                        self._announce_resume(resume_of, ev.intercept)
                        announce = False
                elif isinstance(ev, TokenDelta):
                    if announce:  # a new engine request (after an abort): its context was recomputed
                        self._announce_resume(resume_of, None)
                        announce = False
                    if ev.text:
                        self._emit("token", text=ev.text)
                else:
                    end = ev
            assert end is not None
            if announce:
                self._announce_resume(resume_of, None)
            chat_resume, regex = False, step_regex  # tool_choice binds the first model turn only
            self._last_end = end
            completion_tokens += len(end.token_ids)
            reply_text.append(end.text)
            if end.reason != "tool_call" or end.call is None:
                break
            if end.call.trigger == OBSERVATION.name:
                # The model began an observation without calling a tool: only tools write observations.
                self.ctx.metrics.invented_observations.inc()
                if reprompts >= limits.max_reprompts:
                    break  # answered as is: the reply is what came before the observation
                reprompts += 1
                self._emit("reprompt", text=REPROMPT)
                tokens, resume_of = self.ctx.engine.encode(REPROMPT), None
                prompt_tokens += len(tokens)
                reply_text.append(REPROMPT)
                continue
            call = self._start_call(end)
            calls_this_message += 1
            if calls_this_message > limits.max_tool_calls:
                result = ToolResult(f"Tool call limit of {limits.max_tool_calls} reached; give the answer now.", error=True)
            else:
                result = await self._run_call(call)
            content = result.content.strip()
            if len(content) > limits.max_observation_chars:
                content = content[:limits.max_observation_chars] + " ...(cut)"
            call.result, call.error = content, result.error
            call.duration_s = time.time() - call.started_s
            call.artifacts = [self.ctx.artifacts.put(a, self.id) for a in result.artifacts]
            self.ctx.metrics.tool_done(call.tool, call.aug_type or "unknown", call.duration_s, "error" if result.error else "ok")
            self.transcript.append({"role": "tool", "call_id": call.call_id, "tool": call.tool, "content": content})
            self._emit("tool_result", call_id=call.call_id, tool=call.tool, content=content, error=result.error,
                       artifacts=call.artifacts, duration_s=round(call.duration_s, 4))
            tokens = self.ctx.engine.encode(PromptBuilder.observation(content))
            prompt_tokens += len(tokens)
            resume_of = call
            reply_text.append(PromptBuilder.observation(content))
        full = "".join(reply_text)
        invented = end.call is not None and end.call.trigger == OBSERVATION.name
        answer = ANSWER.findall(full)
        reply = answer[-1].strip() if answer else (end.text[:end.call.start] if invented and end.call else end.text).strip()
        self.transcript.append({"role": "assistant", "content": full, "reply": reply})
        self.usage["prompt_tokens"] += prompt_tokens
        self.usage["completion_tokens"] += completion_tokens
        self.state = "idle"
        self._emit("done", reply=reply, finish_reason="stop" if invented else end.reason,
                   usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "context_tokens": end.context_tokens},
                   reprompts=reprompts, state="awaiting_user")

    def _announce_resume(self, call: CallRecord | None, rec: InterceptRecord | None) -> None:
        self._emit("resume", **resume_event(call, rec))

    def _start_call(self, end: TurnEnd) -> CallRecord:
        assert end.call is not None
        tool, args = self.ctx.calls.parse(end.call.trigger, end.call.tool, end.call.arguments or "")
        kind, tool = resolve_call(tool, self.tools, self.client_tools)
        call = CallRecord(call_id="call_" + secrets.token_hex(8), tool=tool, arguments=args, kind=kind)
        self.calls.append(call)
        self.transcript.append({"role": "assistant", "content": end.text, "call_id": call.call_id})
        self._emit("tool_call", call_id=call.call_id, tool=tool, arguments=args, executor=kind)
        self._emit("intercept", **intercept_event(call, end.intercept))
        self.ctx.metrics.intercept(call.aug_type or "unknown", call.policy or "unknown")
        return call

    async def _run_call(self, call: CallRecord) -> ToolResult:
        if call.kind == "unknown":
            known = ", ".join(self.tools + list(self.client_tools)) or "none"
            return ToolResult(f"Error: there is no tool named {call.tool}; tools: {known}.", error=True)
        if call.kind in ("human", "client"):
            return await self._wait_for_outside(call)
        self.state = "in_tool"
        timeout = self.ctx.timeouts.get(call.tool) or self.ctx.limits.tool_timeout_s
        return await run_server_tool(self.ctx.registry, call.tool, call.arguments, self.id, timeout)

    async def _wait_for_outside(self, call: CallRecord) -> ToolResult:
        """Pause for a human's answer or a client's tool result. The current response ends here; the
        request that brings the answer reads what follows."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending = _Pending(call, fut)
        if call.kind == "human":
            self.state = "awaiting_user"
            self._emit("done", reply=call.arguments, finish_reason="ask_human", state="awaiting_user",
                       pending_call=call.to_dict(), usage=None)
            ask: Callable[[str], Awaitable[str]] = lambda _q: fut  # noqa: E731
            try:
                return await self.ctx.registry.get(HUMAN_TOOL).run(call.arguments, CallContext(session_id=self.id, extra={"ask_human": ask}))
            except ToolError as e:
                return ToolResult(f"Error: {e}", error=True)
        self.state = "in_tool"
        self._emit("done", reply=None, finish_reason="tool_calls", state="in_tool", pending_call=call.to_dict(), usage=None)
        return ToolResult(await fut)


__all__ = ["AgentContext", "AgentError", "AgentSession", "Event"]
