"""One agent conversation on the engine: a vLLM streaming-input request whose turns append tokens, so
its KV can survive the tool call (see `engine_adapter.engine` for the context rule)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine_adapter.events import (
    ContextTooLong,
    EngineDead,
    EngineError,
    RequestFailed,
    Resumed,
    SessionBusy,
    SessionClosed,
    TokenDelta,
    TurnEnd,
    TurnEvent,
)
from engine_adapter.hints import ToolHint
from engine_adapter.intercept.records import RECORDS_KEY, InterceptRecord
from engine_adapter.triggers import find_call

if TYPE_CHECKING:
    from engine_adapter.engine import InterceptEngine


@dataclass
class TurnInput:
    token_ids: list[int]
    max_tokens: int
    regex: str | None = None  # structured output for this turn (vLLM's structured_outputs.regex)


class Session:
    """One agent conversation on the engine. Not safe for two turns at once (SessionBusy)."""

    def __init__(
        self,
        engine: InterceptEngine,
        session_id: str,
        tools: Mapping[str, ToolHint],
        max_tokens: int,
        sampling: Mapping[str, Any],
        history: Sequence[int] = (),
        rank: int = 0,
    ) -> None:
        self.engine = engine
        self.id = session_id
        # The data-parallel rank (engine core) that runs every request of this session, for its whole
        # life: its KV, preserved or swapped, lives there.
        self.rank = rank
        self.tools = dict(tools)
        self.max_tokens = max_tokens
        self.sampling = dict(sampling)
        # Every context token, in order. A restored session starts with the context it had (its first
        # turn opens a new vLLM request over all of it: the KV is rebuilt by recompute).
        self.history: list[int] = list(history)
        self._live: list[int] = []  # tokens of the turn in progress, not yet moved into history
        self.turns = 0
        self.closed = False
        self._pending_last: int | None = None  # last sampled token, not yet in the engine's KV
        self._queue: asyncio.Queue[TurnInput | None] | None = None
        self._gen: AsyncGenerator[Any, None] | None = None
        self._request_id: str | None = None
        self._segment = itertools.count()
        self._busy = False
        self._last_pause: int | None = None  # intercept id of the pause the next turn resumes

    @property
    def open_in_engine(self) -> bool:
        return self._gen is not None

    @property
    def context_tokens(self) -> int:
        """Tokens in the session's context: history plus the last sampled token, not yet fed back."""
        return len(self.history) + (self._pending_last is not None)

    @property
    def context_len(self) -> int:
        """Length of `context_since(0)`: what the session's context holds, the turn in progress included."""
        return len(self.history) + (self._pending_last is not None) + len(self._live)

    def context_since(self, start: int) -> list[int]:
        """The context tokens from position `start` on: history, the last sampled token, then the tokens
        of the turn in progress. This sequence only ever grows (a turn appends its input, then each
        sampled token; a turn's end or an abort moves tokens between the parts without changing it), so
        a copy kept by appending `context_since(len(copy))` is the context, token for token."""
        pending = [self._pending_last] if self._pending_last is not None else []
        out: list[int] = []
        for part in (self.history, pending, self._live):
            if start < len(part):
                out.extend(part[start:])
            start = max(0, start - len(part))
        return out

    def check_room(self, new_tokens: int) -> int:
        """The context after appending `new_tokens`; ContextTooLong unless at least one token more
        can be generated within the model's limit."""
        total = self.context_tokens + new_tokens
        limit = self.engine.config.max_model_len
        if total >= limit:
            raise ContextTooLong(total + 1, limit)
        return total

    async def turn(self, new_tokens: Sequence[int] | str, max_tokens: int | None = None,
                   regex: str | None = None) -> AsyncIterator[TurnEvent]:
        """Append tokens (a prompt, a tool's output, a user message) and generate until a trigger,
        EOS or max_tokens. Yields TokenDelta events, then exactly one TurnEnd. `regex` constrains this
        turn's output (vLLM structured outputs), e.g. to force a tool call."""
        if self.closed:
            raise SessionClosed(f"session {self.id} is closed")
        if self._busy:
            raise SessionBusy(f"session {self.id} is already generating")
        ids = self.engine.encode(new_tokens) if isinstance(new_tokens, str) else list(new_tokens)
        if not ids and self._pending_last is None and not self.history:
            raise EngineError("a session's first turn needs at least one token")
        total = self.check_room(len(ids))
        limit = self.engine.config.max_model_len
        want = max_tokens if max_tokens is not None else self.max_tokens
        want = max(1, min(want, limit - total))
        self._busy = True
        try:
            async for ev in self._run_turn(ids, want, regex):
                yield ev
        finally:
            self._busy = False

    async def _run_turn(self, ids: list[int], max_tokens: int, regex: str | None = None) -> AsyncIterator[TurnEvent]:
        if self._gen is None:
            # A new vLLM request over the whole context (first turn, or after an abort).
            full = self.history + ([self._pending_last] if self._pending_last is not None else []) + ids
            self._open(TurnInput(full, max_tokens, regex))
        else:
            appended = ([self._pending_last] if self._pending_last is not None else []) + ids
            assert self._queue is not None
            self._queue.put_nowait(TurnInput(appended, max_tokens, regex))
        if self._pending_last is not None:
            self.history.append(self._pending_last)
            self._pending_last = None
        self.history.extend(ids)
        self.turns += 1

        out_ids: list[int] = []
        text_parts: list[str] = []
        pause: InterceptRecord | None = None
        gen = self._gen
        assert gen is not None
        try:
            while True:
                out = await gen.__anext__()
                for rec in _records(out):
                    if rec.resumed_at_s is not None and rec.intercept_id == self._last_pause:
                        yield Resumed(rec)
                    elif rec.resumed_at_s is None:
                        pause = rec
                comp = out.outputs[0]
                if comp.token_ids:
                    out_ids.extend(comp.token_ids)
                    self._live.extend(comp.token_ids)
                    text_parts.append(comp.text)
                    yield TokenDelta(comp.text, list(comp.token_ids))
                if comp.finish_reason is not None:
                    break
        except BaseException as e:
            # Cancelled (client gone) or the engine failed: vLLM's generate() aborts the request on
            # cancellation, freeing its KV. Keep what was generated as context.
            self._drop_request()
            self._live.clear()
            if out_ids:
                self.history.extend(out_ids)
            if isinstance(e, Exception) and self.engine.dead:
                raise EngineDead(f"the engine core died: {self.engine.dead_reason()}") from e
            raise
        text = "".join(text_parts)
        reason = comp.finish_reason
        self._live.clear()  # moved into history (and _pending_last) below, with no await in between
        if reason == "abort":
            self._drop_request(abort=False)
            self.history.extend(out_ids)
            yield TurnEnd("aborted", None, text, out_ids, len(self.history))
            return
        if reason == "error":
            # Not a normal end: reporting it as `stop` would hand the client an empty, silent turn.
            self._drop_request(abort=False)
            self.history.extend(out_ids)
            raise RequestFailed("the engine failed this turn's request (finish reason 'error'; e.g. its "
                                "structured-output grammar did not compile): see the engine log")
        call = None
        if reason == "stop" and isinstance(comp.stop_reason, str):
            call = find_call(self.engine.config.triggers, comp.stop_reason, text)
        # All but the last sampled token are in the engine's KV; the last one goes in front of the
        # next turn's tokens.
        if out_ids:
            self.history.extend(out_ids[:-1])
            self._pending_last = out_ids[-1]
        if out.finished:
            # The request ended in the engine (e.g. the context limit): the next turn re-opens.
            self._drop_request(abort=False)
            pause = None
        self._last_pause = pause.intercept_id if pause is not None else None
        yield TurnEnd(
            reason="tool_call" if call is not None else ("length" if reason == "length" else "stop"),
            call=call,
            text=text,
            token_ids=out_ids,
            context_tokens=self.context_tokens,
            intercept=pause,
        )

    def _open(self, first: TurnInput) -> None:
        queue: asyncio.Queue[TurnInput | None] = asyncio.Queue()
        queue.put_nowait(first)
        self._queue = queue
        self._request_id = f"{self.id}-{next(self._segment)}"
        self._gen = self.engine.generate(self, queue, self._request_id)

    def _drop_request(self, abort: bool = True) -> None:
        gen, self._gen, self._queue = self._gen, None, None
        self._last_pause = None  # a new request has no pause to resume
        if gen is not None and abort:
            # Closing the generator aborts the vLLM request (AsyncLLM.generate's GeneratorExit path).
            self.engine.spawn(gen.aclose())

    async def close(self) -> None:
        """End the session and free its KV wherever it lives. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.engine.forget(self.id)
        gen, queue = self._gen, self._queue
        self._gen = self._queue = None
        if gen is None:
            return
        assert queue is not None
        queue.put_nowait(None)  # the input stream ends; vLLM finishes the request when it pauses
        if self._busy:
            # Generating right now: abort, which frees the KV at once; the turn in progress ends with
            # reason "aborted" (its consumer owns the generator, so it is not touched here).
            assert self._request_id is not None
            await self.engine.llm.abort(self._request_id)
            return
        try:
            async for _ in gen:
                pass
        except Exception:  # the request is gone either way
            await gen.aclose()


def _records(out: Any) -> list[InterceptRecord]:
    """The intercept records the engine core attached to an output (`InterceptScheduler`)."""
    params = getattr(out, "kv_transfer_params", None)
    return [InterceptRecord.from_dict(d) for d in (params or {}).get(RECORDS_KEY, ())]
