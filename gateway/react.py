"""The ReAct loop of one user message: model turns on the engine session, tool calls between them.

A `MessageRun` owns what belongs to one message (its calls so far, the reply text, token counts,
re-prompts) and drives its session through the session's methods only (`Host`, which
`gateway.agent.AgentSession` implements): `emit` an event, `note` a transcript entry, `wrote` streamed
text, `record` a call record, and the state changes (`generating`, `running_tool`, `wait_for_outside`,
`message_done`). This module does not import the session's: the session starts the loop, the loop
never reaches back past `Host`. What the engine decided at a pause comes with the turn's end
(`TurnEnd.intercept`) and how the context came back with the next turn (`Resumed`).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from augmentations.base import CallContext, ToolError, ToolResult
from engine_adapter.events import Resumed, TokenDelta, TurnEnd
from engine_adapter.intercept.records import InterceptRecord
from engine_adapter.session import Session
from engine_adapter.triggers import OBSERVATION
from gateway.calls import HUMAN_TOOL, resolve_call, run_server_tool
from gateway.context import AgentContext
from gateway.prompts import PromptBuilder
from gateway.records import CallRecord
from gateway.schemas import (
    DoneEvent,
    EventData,
    InterceptEvent,
    RepromptEvent,
    ResumeEvent,
    TokenEvent,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)


class Host(Protocol):
    """What the loop reads from its session, and the only ways it changes the session."""

    id: str
    ctx: AgentContext
    es: Session
    max_tokens: int
    tools: list[str]
    client_tools: dict[str, dict[str, Any]]
    last_end_reason: str | None  # read only: `turn_ended` sets it
    announce_restore: str | None  # read only: `take_restore_notice` clears it

    def emit(self, event: EventData) -> None: ...
    def note(self, entry: Mapping[str, Any]) -> None: ...
    def wrote(self, text: str) -> None: ...
    def record(self, call: CallRecord) -> None: ...
    def add_call(self, call: CallRecord) -> None: ...
    def generating(self) -> None: ...
    def running_tool(self) -> None: ...
    def turn_ended(self, reason: str) -> None: ...
    def take_restore_notice(self) -> str | None: ...
    def wait_for_outside(self, call: CallRecord) -> asyncio.Future[str]: ...
    def message_done(self, entry: Mapping[str, Any], prompt_tokens: int, completion_tokens: int) -> None: ...


ANSWER = re.compile(r"Answer:\s*(.*)", re.DOTALL)
# Appended after an observation the model began itself (the "observation" trigger), to let it call a tool
# or answer instead.
REPROMPT = " none: no tool was called, and only a tool writes an observation.\nThought:"


def truncate(content: str, limit: int) -> str:
    """A tool result within `limit` characters, with a note saying what was cut."""
    if len(content) <= limit:
        return content
    return content[:limit] + f" ...[truncated: the tool returned {len(content)} characters; the first {limit} are shown]"


class MessageRun:
    def __init__(self, session: Host, prompt_tokens: int) -> None:
        self.s = session
        self.calls = 0
        self.reply_text: list[str] = []
        self.prompt_tokens, self.completion_tokens = prompt_tokens, 0
        self.reprompts = 0

    async def run(self, tokens: list[int], regex: str | None, step_regex: str | None,
                  answered: tuple[CallRecord, ToolResult] | None = None) -> None:
        s, limits = self.s, self.s.ctx.limits
        resume_of: CallRecord | None = None  # the call whose result the next turn resumes after
        # A new message resumes the turn-end (chat) intercept; a restored session reports its recompute.
        chat_resume = s.last_end_reason is not None or s.announce_restore is not None
        if answered is not None:  # a restored session's pending call, answered
            tokens, resume_of = await self._finish_call(*answered), answered[0]
        while True:
            s.generating()
            end: TurnEnd | None = None
            announce = resume_of is not None or chat_resume
            async for ev in s.es.turn(tokens, s.max_tokens, regex):
                if isinstance(ev, Resumed):
                    if announce:
                        self._announce_resume(resume_of, ev.intercept)
                        announce = False
                elif isinstance(ev, TokenDelta):
                    if announce:  # a new engine request (after an abort or a restart): its context was recomputed
                        self._announce_resume(resume_of, None)
                        announce = False
                    if ev.text:
                        s.wrote(ev.text)
                        s.emit(TokenEvent(text=ev.text))
                else:
                    end = ev
            assert end is not None
            if announce:
                self._announce_resume(resume_of, None)
            chat_resume, regex = False, step_regex  # tool_choice binds the first model turn only
            s.turn_ended(end.reason)
            self.completion_tokens += len(end.token_ids)
            self.reply_text.append(end.text)
            if end.reason != "tool_call" or end.call is None:
                break
            if end.call.trigger == OBSERVATION.name:
                # The model began an observation without calling a tool: only tools write observations.
                s.ctx.metrics.invented_observations.inc()
                if self.reprompts >= limits.max_reprompts:
                    break  # answered as is: the reply is what came before the observation
                self.reprompts += 1
                s.emit(RepromptEvent(text=REPROMPT))
                tokens, resume_of = s.ctx.engine.encode(REPROMPT), None
                self.prompt_tokens += len(tokens)
                self.reply_text.append(REPROMPT)
                s.wrote(REPROMPT)
                continue
            call = self._start_call(end)
            self.calls += 1
            if self.calls > limits.max_tool_calls:
                result = ToolResult(f"Tool call limit of {limits.max_tool_calls} reached; give the answer now.", error=True)
            else:
                result = await self._run_call(call)
            tokens, resume_of = await self._finish_call(call, result), call
        self._done(end)

    def _done(self, end: TurnEnd) -> None:
        s = self.s
        full = "".join(self.reply_text)
        invented = end.call is not None and end.call.trigger == OBSERVATION.name
        answer = ANSWER.findall(full)
        reply = answer[-1].strip() if answer else (end.text[:end.call.start] if invented and end.call else end.text).strip()
        s.message_done({"role": "assistant", "content": full, "reply": reply}, self.prompt_tokens, self.completion_tokens)
        s.emit(DoneEvent(reply=reply, finish_reason="stop" if invented else end.reason,
                         usage=Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                                     context_tokens=end.context_tokens),
                         reprompts=self.reprompts, state="awaiting_user"))

    def _announce_resume(self, call: CallRecord | None, rec: InterceptRecord | None) -> None:
        s = self.s
        notice = s.take_restore_notice()
        event = ResumeEvent.of(call, rec, after=notice if rec is None else None)
        if call is not None:
            call.resumed(event.restored_by)
            s.record(call)
        s.emit(event)

    def _start_call(self, end: TurnEnd) -> CallRecord:
        s = self.s
        assert end.call is not None
        tool, args = s.ctx.calls.parse(end.call.trigger, end.call.tool, end.call.arguments or "")
        kind, tool = resolve_call(tool, s.tools, s.client_tools)
        call = CallRecord(call_id="call_" + secrets.token_hex(8), tool=tool, arguments=args, kind=kind)
        s.add_call(call)
        s.note({"role": "assistant", "content": end.text, "call_id": call.call_id})
        s.emit(ToolCallEvent.of(call))
        call.paused(end.intercept)
        s.emit(InterceptEvent.of(call, end.intercept))
        s.record(call)
        s.ctx.metrics.intercept(call.aug_type or "unknown", call.policy or "unknown")
        return call

    async def _finish_call(self, call: CallRecord, result: ToolResult) -> list[int]:
        """Record and report a call's result; the observation tokens that go back to the model."""
        s = self.s
        content = truncate(result.content.strip(), s.ctx.result_limit)
        artifacts = [await s.ctx.artifacts.put(a, s.id) for a in result.artifacts]
        call.finished(content, result.error, artifacts)
        s.ctx.metrics.tool_done(call.tool, call.aug_type or "unknown", call.duration_s or 0.0, "error" if result.error else "ok")
        s.note({"role": "tool", "call_id": call.call_id, "tool": call.tool, "content": content})
        s.record(call)
        s.emit(ToolResultEvent.of(call))
        observation = PromptBuilder.observation(content)
        tokens = s.ctx.engine.encode(observation)
        self.prompt_tokens += len(tokens)
        self.reply_text.append(observation)
        return tokens

    async def _run_call(self, call: CallRecord) -> ToolResult:
        s = self.s
        if call.kind == "unknown":
            known = ", ".join(s.tools + list(s.client_tools)) or "none"
            return ToolResult(f"Error: there is no tool named {call.tool}; tools: {known}.", error=True)
        if call.kind in ("human", "client"):
            return await self._wait_for_outside(call)
        s.running_tool()
        timeout = s.ctx.timeouts.get(call.tool) or s.ctx.limits.tool_timeout_s
        return await run_server_tool(s.ctx.registry, call.tool, call.arguments, s.id, timeout)

    async def _wait_for_outside(self, call: CallRecord) -> ToolResult:
        """Pause for a human's answer or a client's tool result. The current response ends here; the
        request that brings the answer reads what follows."""
        s = self.s
        if call.kind == "human" and not call.arguments.strip():
            return ToolResult("Error: AskHuman needs a question", error=True)  # nothing to wait for
        fut = s.wait_for_outside(call)
        if call.kind == "human":
            s.emit(DoneEvent(reply=call.arguments, finish_reason="ask_human", state="awaiting_user",
                             pending_call=call, usage=None))
            ask: Callable[[str], Awaitable[str]] = lambda _q: fut  # noqa: E731
            try:
                return await s.ctx.registry.get(HUMAN_TOOL).run(call.arguments, CallContext(session_id=s.id, extra={"ask_human": ask}))
            except ToolError as e:
                return ToolResult(f"Error: {e}", error=True)
        s.emit(DoneEvent(reply=None, finish_reason="tool_calls", state="in_tool", pending_call=call, usage=None))
        return ToolResult(await fut)
