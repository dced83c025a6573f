"""One agent session: its state, transcript and calls, and the requests that drive it. The session is
the only owner of its state: the loop (`gateway.react`), the table (`gateway.session_table`) and the
routes change it through its methods, never by writing its fields.

The ReAct loop (`gateway.react.MessageRun`) runs in a task of its own that outlives any one HTTP
request: when the model calls `AskHuman` or a tool the client executes itself, the loop awaits a future
while the engine keeps the session paused under its intercept policy, and the current response ends
(`done` with the state `awaiting_user` or `in_tool`). The request that brings the answer (the next
message, or `POST /tool_results`) resolves the future and reads the rest of the events. A reader that
goes away before its `done` (client disconnect) cancels the loop: the engine aborts the generation and
frees its KV, the turn is marked interrupted, and the session stays usable for the next message.

Events are built from their models (`gateway.schemas.EventData`) and queued as `(name, data)` pairs, in order: token, tool_call, intercept, tool_result, resume, ..., then
done or error (see the README's API section). Readers get them in batches, each committed to the
session store before it is handed over (`gateway.channel`). A session read back from the store after a
restart (`AgentSession.restored`) has no loop and no engine request: its next message opens one over its exact
context tokens (the KV is rebuilt by recompute), and a call it was waiting on is answered the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from augmentations.base import ToolResult
from engine_adapter.events import ContextTooLong, EngineDead, EngineError
from engine_adapter.session import Session
from gateway.call_parser import ToolChoice, ToolChoiceError, choice_regex, react_step_regex
from gateway.channel import TERMINAL, Event, EventChannel
from gateway.context import AgentContext
from gateway.durable import FORMAT_VERSION, Folded, Journal, hash_token
from gateway.prompts import ToolSpec
from gateway.react import MessageRun
from gateway.records import CallRecord, Intercept
from gateway.schemas import ErrorEvent, EventData, SessionInfo, TranscriptEntry
from gateway.store import Fenced, SessionStore, StoreError

log = logging.getLogger("infercept.gateway")

State = Literal["idle", "generating", "in_tool", "awaiting_user", "closed"]
StepFormat = Literal["free", "react"]


class AgentError(Exception):
    """A request the session cannot take now; `status` is the HTTP code the gateway answers with."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra


@dataclass
class Pending:
    call: CallRecord
    # Resolved with the answer while a loop awaits it; None after a restart (no loop: the answer starts one).
    future: asyncio.Future[str] | None


class AgentSession:
    def __init__(self, ctx: AgentContext, engine_session: Session, *, system: str | None, tools: list[str],
                 client_tools: dict[str, dict[str, Any]], max_tokens: int, store: SessionStore | None = None) -> None:
        self.ctx = ctx
        self.es = engine_session
        self.id = engine_session.id
        self.token: str | None = secrets.token_urlsafe(24)  # shown once, at creation; the store keeps its hash
        self.token_hash = hash_token(self.token)
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
        self.journal = Journal(store, self.id, committed_context=engine_session.context_len)
        self.channel = EventChannel()
        self.last_end_reason: str | None = None  # how the last model turn ended (stop, length, tool_call)
        # The next turn reports how its context came back: "restart", "hibernation" or "takeover" (None: it
        # did not leave the engine).
        self.announce_restore: str | None = None
        self.hibernated = False  # committed as having left memory (`hibernate`); read back from the store
        self.on_fenced: Callable[[str], object] | None = None  # the table forgets a session taken over elsewhere
        self.pending: Pending | None = None
        self._task: asyncio.Task[None] | None = None
        self.partial: list[str] = []  # what the model wrote since the last transcript entry

    @classmethod
    def restored(cls, ctx: AgentContext, es: Session, folded: Folded, token_hash: str,
                 store: SessionStore | None, after: str = "restart") -> AgentSession:
        """A session read back from the store (`gateway.durable.fold`), on a fresh engine session over its
        stored context. A turn that was in progress (generating, or in a server tool) is marked
        interrupted; a call it waited on (a human's answer, a client's result) is still pending and
        answering it continues the turn. A server tool since removed from the config is gone."""
        head, settings = folded.head, folded.head["settings"]
        s = cls(ctx, es, system=settings["system"], tools=[t for t in settings["tools"] if t in ctx.registry],
                client_tools=dict(settings["client_tools"]), max_tokens=int(settings["max_tokens"]), store=store)
        s.token, s.token_hash = None, token_hash
        s.created_s = float(head["created"])
        s.last_active_s = time.monotonic() - max(0.0, time.time() - float(head["last_active"]))
        s.transcript = list(folded.transcript)
        s.calls = [CallRecord.model_validate(c) for c in folded.calls]
        s.usage = dict(head["usage"])
        s.last_end_reason = head.get("last_end_reason")
        s.announce_restore = ("hibernation" if head.get("hibernated") and after == "restart" else after) if folded.context else None
        s.partial = [folded.unreported_text] if folded.unreported_text else []
        pending_id = head.get("pending_call_id")
        call = next((c for c in s.calls if c.call_id == pending_id), None)
        if call is not None:
            s.pending = Pending(call, None)
            s.state = "awaiting_user" if call.kind == "human" else "in_tool"
        elif head["state"] in ("generating", "in_tool"):
            s.interrupt("server_restart")
        return s

    # ------------------------------------------------------------------ public
    def touch(self) -> None:
        self.last_active_s = time.monotonic()

    @property
    def pending_call(self) -> CallRecord | None:
        """The call the session waits on (a human's answer or a client tool's result)."""
        return self.pending.call if self.pending is not None else None

    @property
    def waiting_for_outside(self) -> bool:
        """Nothing runs on the server's side: waiting for the user or a client."""
        return self.state in ("idle", "awaiting_user") or self.pending is not None

    @property
    def busy(self) -> bool:
        """A turn is in progress on the server (generating, or in a server tool)."""
        return self.state in ("generating", "in_tool") and self.pending is None

    def public_state(self) -> str:
        # `idle` (nothing asked yet, or the last answer given) is what a client sees as waiting for it.
        return "awaiting_user" if self.state == "idle" else self.state

    def tool_specs(self) -> list[ToolSpec]:
        specs = [ToolSpec(ex.name, ex.description) for ex in (self.ctx.registry.get(n) for n in self.tools)]
        specs += [ToolSpec(name, spec.get("description") or "a tool the client runs") for name, spec in self.client_tools.items()]
        return specs

    def info(self, intercepts: list[Intercept]) -> SessionInfo:
        """The session as `GET /v1/sessions/{sid}` shows it, with the engine's `intercepts`."""
        return SessionInfo(
            id=self.id, state=self.public_state(), tools=self.tools + list(self.client_tools),
            client_tools=list(self.client_tools), created=self.created_s, context_tokens=self.es.context_tokens,
            usage=dict(self.usage), pending_call=self.pending_call,
            transcript=[TranscriptEntry.model_validate(e) for e in self.transcript],
            calls=list(self.calls), intercepts=intercepts)

    def head(self) -> dict[str, Any]:
        """What the store keeps besides the log (`gateway.durable`)."""
        return {
            "v": FORMAT_VERSION, "id": self.id, "created": self.created_s,
            "last_active": time.time() - (time.monotonic() - self.last_active_s),
            "model": self.ctx.engine.model_path,
            "settings": {"system": self.system, "tools": self.tools, "client_tools": self.client_tools,
                         "max_tokens": self.max_tokens, "temperature": self.es.sampling.get("temperature", 0.0),
                         "seed": self.es.sampling.get("seed"), "ignore_eos": self.es.sampling.get("ignore_eos", False)},
            "state": self.state,
            "pending_call_id": self.pending.call.call_id if self.pending is not None else None,
            "usage": dict(self.usage), "last_end_reason": self.last_end_reason, "hibernated": self.hibernated,
        }

    async def commit(self) -> None:
        if self.state == "closed":
            return  # deleted, or detached: this object no longer speaks for the stored session
        t0 = time.perf_counter()
        await self.journal.commit(self.head(), self.es)
        if self.journal.store is not None:
            self.ctx.metrics.store_commit.observe(time.perf_counter() - t0)

    def send_message(self, content: str, tool_choice: ToolChoice = "auto",
                     step_format: StepFormat = "free") -> AsyncIterator[list[Event]]:
        """Event batches for a user message: a new question, or the answer to a pending AskHuman."""
        self.touch()
        if self.state == "closed":
            raise AgentError(410, "session_closed", "the session is closed")
        pending = self.pending
        if pending is not None and pending.call.kind == "human":
            self.note({"role": "user", "content": content, "answers": pending.call.call_id})
            self._answer(pending, content)
        elif pending is not None:
            raise AgentError(409, "awaiting_tool_result",
                             f"the session waits for the result of client tool call {pending.call.call_id} "
                             f"({pending.call.tool}); POST it to /v1/sessions/{self.id}/tool_results",
                             call_id=pending.call.call_id)
        elif self.state != "idle":
            raise AgentError(409, "session_busy", f"the session is {self.state}; wait for its done event")
        else:
            self.start(self._message_tokens(content), tool_choice, step_format)
            self.note({"role": "user", "content": content})
        return self._consume()

    def start(self, tokens: list[int], tool_choice: ToolChoice = "auto", step_format: StepFormat = "free") -> None:
        """Start the loop on these tokens (a message's, or a whole prompt the OpenAI route rendered).
        `tool_choice` constrains the first model turn; `step_format` "react" constrains every turn to one
        ReAct step (structured outputs)."""
        if self.state != "idle" or self.pending is not None:
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
        self._launch(MessageRun(self, len(tokens)).run(tokens, regex or step, step))

    def events(self) -> AsyncIterator[list[Event]]:
        """The event batches of the loop started with `start`, up to the next done/error."""
        return self._consume()

    def send_tool_result(self, call_id: str, content: str) -> AsyncIterator[list[Event]]:
        self.touch()
        pending = self.pending
        if pending is None or pending.call.kind != "client":
            raise AgentError(409, "no_pending_call", "the session is not waiting for a client tool result")
        if pending.call.call_id != call_id:
            raise AgentError(404, "unknown_call", f"no pending call {call_id!r}; the session waits for {pending.call.call_id}")
        self._answer(pending, content)
        return self._consume()

    async def close(self) -> None:
        """End the session for good (DELETE, expiry): its loop, its engine request, its tools' state."""
        if self.state == "closed":
            return
        self.state = "closed"
        await self._cancel_loop()
        self.pending = None
        # A response still reading this session's events ends with this.
        self.emit(ErrorEvent(type="session_closed", message="the session was closed"))
        await self.es.close()
        for name in self.tools:
            end = getattr(self.ctx.registry.get(name), "end_session", None)
            if end is not None:
                await end(self.id)

    async def hibernate(self) -> bool:
        """Leave memory while waiting for the outside (`server.hibernate_s`): a call it waits on stays
        pending, everything is committed with the session marked hibernated, and its engine request (and
        KV) goes. The store keeps it; its next request reads it back (`SessionTable.find`), its context
        recomputed. False: it is not waiting, or the commit failed (it stays, nothing lost)."""
        if self.state == "closed" or self.busy or not self.waiting_for_outside:
            return False
        state, pending = self.state, self.pending
        self.hibernated = True
        try:
            await self.commit()
        except Fenced:
            await self.leave_fenced()
            return True
        except Exception:
            self.hibernated = False
            log.exception("session %s could not be committed for hibernation: it stays in memory", self.id)
            return False
        if self.state != state or self.pending is not pending:
            # Something happened while the commit ran (an answer arrived, a turn began): it stays; its
            # next commit says so.
            self.hibernated = False
            return False
        # From here on nothing awaits until the session is closed.
        task, self._task = self._task, None
        if pending is not None:
            pending.future = None  # the pending call is kept: answered later through `launch_after`
        self.state = "closed"
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await self.es.close()
        return True

    async def leave_fenced(self) -> None:
        """Another replica owns the session now (this one's lease lapsed and it was taken over): stop
        serving it here, without a write (the store would refuse it) and without ending it (the new owner
        serves it from the store)."""
        if self.state == "closed":
            return
        self.state = "closed"
        await self._cancel_loop()
        self.channel.reset()
        await self.es.close()
        self.ctx.metrics.sessions_fenced.inc()
        if self.on_fenced is not None:
            self.on_fenced(self.id)

    async def detach(self, kind: str, message: str) -> None:
        """Stop serving the session from this object without ending it (shutdown, engine death): a turn in
        progress is marked interrupted, everything is committed, and a reader gets an `error` event. The
        store keeps the session; a restart (or an engine restart) serves it again."""
        if self.state == "closed":
            return
        if self.busy:
            await self._cancel_loop()
            self.interrupt(kind)
        elif self.pending is not None and self._task is not None:
            task, self._task = self._task, None  # waiting on the outside: keep the pending call
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            self.pending.future = None
        with contextlib.suppress(Exception):
            await self.commit()
        self.emit(ErrorEvent(type=kind, message=message))
        self.state = "closed"
        await self.es.close()

    # ------------------------------------------------------------------ what the loop calls (gateway.react.Host)
    def emit(self, event: EventData) -> None:
        """An event for the reader: its model's dump, taken now (the records it names may change later)."""
        self.channel.emit(event.name, event.model_dump(mode="json"))

    def note(self, entry: Mapping[str, Any]) -> None:
        """A transcript entry (kept, and journaled for the store)."""
        entry = dict(entry)
        self.transcript.append(entry)
        self.journal.entry(entry)
        self.partial.clear()

    def wrote(self, text: str) -> None:
        """Model text as it streams (journaled: an interrupted turn keeps what the client saw)."""
        self.partial.append(text)
        self.journal.text(text)

    def record(self, call: CallRecord) -> None:
        """A call record changed (journaled whole)."""
        self.journal.call(call.dump())

    def add_call(self, call: CallRecord) -> None:
        """A new call of the running message (journaled by `record` once its intercept is known)."""
        self.calls.append(call)

    def generating(self) -> None:
        self.state = "generating"

    def running_tool(self) -> None:
        """A server tool runs for the turn."""
        self.state = "in_tool"

    def turn_ended(self, reason: str) -> None:
        self.last_end_reason = reason

    def take_restore_notice(self) -> str | None:
        """Why the context came back anew, if it did: "restart", "hibernation", "takeover" (reported once, by
        the next resume)."""
        notice, self.announce_restore = self.announce_restore, None
        return notice

    def wait_for_outside(self, call: CallRecord) -> asyncio.Future[str]:
        """The turn waits for a human's answer or a client's result: the future the answer resolves."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending = Pending(call, fut)
        self.state = "awaiting_user" if call.kind == "human" else "in_tool"
        return fut

    def message_done(self, entry: Mapping[str, Any], prompt_tokens: int, completion_tokens: int) -> None:
        """The message's last model turn ended: its reply entry, its token counts; waiting for the user."""
        self.note(entry)
        self.usage["prompt_tokens"] += prompt_tokens
        self.usage["completion_tokens"] += completion_tokens
        self.state = "idle"

    def interrupt(self, reason: str) -> None:
        """Mark the turn in progress interrupted: the model's text since the last entry, a running server call."""
        for call in self.calls:
            if call.kind == "server" and call.result is None:
                call.result, call.error = f"(interrupted: {reason})", True
                self.record(call)
        self.note({"role": "assistant", "content": "".join(self.partial), "interrupted": True, "reason": reason})
        self.state = "idle"

    def launch_after(self, call: CallRecord, result: ToolResult) -> None:
        """Start a loop that continues after `call` with its result (a restored session's pending call)."""
        self._launch(MessageRun(self, 0).run([], None, None, answered=(call, result)))

    # ------------------------------------------------------------------ plumbing
    def _launch(self, coro: Coroutine[Any, Any, None]) -> None:
        self.state = "generating"
        self._task = asyncio.create_task(self._drive(coro), name=f"agent-{self.id}")

    async def _drive(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except ContextTooLong as e:
            self.state = "idle"
            self.emit(ErrorEvent(type="context_too_long", message=str(e), tokens=e.tokens, limit=e.limit))
        except EngineDead as e:
            self.interrupt("engine_died")
            self.emit(ErrorEvent(type="engine_died", message=f"{e}; the server is restarting it, resend the message"))
        except EngineError as e:
            self.state = "idle"
            self.emit(ErrorEvent(type="engine_error", message=str(e)))
        except Exception as e:  # never a dead session: report, and wait for the next message
            if self.ctx.engine.dead:
                self.interrupt("engine_died")
                self.emit(ErrorEvent(type="engine_died", message=f"the engine died ({type(e).__name__}); the server "
                                     "is restarting it, resend the message"))
                return
            log.exception("agent loop failed in session %s", self.id)
            self.state = "idle"
            self.emit(ErrorEvent(type="internal_error", message=f"{type(e).__name__}: {e}"))

    def _answer(self, pending: Pending, content: str) -> None:
        self.pending = None
        self.state = "in_tool"
        if pending.future is None:
            self.launch_after(pending.call, ToolResult(content))
        elif not pending.future.done():
            pending.future.set_result(content)

    async def _consume(self) -> AsyncIterator[list[Event]]:
        """The loop's event batches to the next terminal event, after an `[]` at once (attached: from then on
        leaving early cancels the loop). A batch the store cannot commit is not handed over (`store_failed`)."""
        finished = False
        try:
            yield []
            try:
                async for batch in self.channel.batches(self.commit, self.ctx.limits.sse_ping_s):
                    # Set before handing the terminal batch over: a reader may stop right after it.
                    finished = bool(batch) and batch[-1][0] in TERMINAL
                    yield batch
            except Fenced as e:
                finished = True
                await self.leave_fenced()
                yield moved(self.id, e)
            except StoreError as e:
                finished = True
                await self._abort("store_unavailable")
                yield store_failed(self.id, e)
        finally:
            self.touch()
            if not finished and self.state != "closed":
                self.ctx.metrics.disconnects.inc()
                await self._abort()

    async def _cancel_loop(self) -> None:
        """Stop the loop task (aborting its generation in the engine) and forget a pending call."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self.pending = None

    async def _abort(self, reason: str = "client_disconnected") -> None:
        if self.state == "closed":
            return
        running = self.busy
        await self._cancel_loop()
        self.channel.reset()
        if running:
            self.interrupt(reason)
        self.state = "idle"
        with contextlib.suppress(Exception):
            await self.commit()

    def _message_tokens(self, content: str) -> list[int]:
        first, after_eos = self.last_end_reason is None and not self.es.history, self.last_end_reason == "stop"
        return self.ctx.engine.encode(self.ctx.prompts.message(content, first=first, system=self.system,
                                                               tools=self.tool_specs(), after_eos=after_eos))


def moved(sid: str, e: Fenced) -> list[Event]:
    """The batch a reader gets when another replica took the session over meanwhile: nothing of the turn
    since the last commit counts; resending reaches the new owner."""
    log.warning("session %s: %s; no longer served here", sid, e)
    error = ErrorEvent(type="session_moved", message="another replica took this session over; resend the message "
                       "(it reaches the new owner)")
    return [(error.name, error.model_dump(mode="json"))]


def store_failed(sid: str, e: StoreError) -> list[Event]:
    """The batch a reader gets instead of one the store could not commit (a client must never see what a
    crash could take back): the turn was interrupted, the session is kept."""
    log.error("session %s: the store failed to commit (%s); the turn is interrupted", sid, e)
    error = ErrorEvent(type="store_unavailable", message=f"the session store failed ({e}); the turn was interrupted "
                       "and the session kept: resend the message shortly")
    return [(error.name, error.model_dump(mode="json"))]


__all__ = ["AgentContext", "AgentError", "AgentSession", "Event", "Pending"]
