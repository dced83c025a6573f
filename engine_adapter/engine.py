"""The asyncio facade over an embedded vLLM engine with intercepts: what the gateway and the
benchmarks drive.

    engine = InterceptEngine(EngineConfig(model="default", policy="preserve"))
    await engine.start()
    session = engine.open_session(tools={"Calculator": ToolHint("math", 0.001)})
    async for ev in session.turn(prompt_ids):       # TokenDelta ... then one TurnEnd
        ...
    # TurnEnd.reason == "tool_call": the request is paused in the engine under the policy
    async for ev in session.turn(observation_ids):  # resumes the same vLLM request
        ...
    await session.close()

One session is one vLLM streaming-input request (`AsyncLLM.generate` over an async generator of
`StreamingInput`): every turn appends tokens to the same request, so its KV can survive the tool call.
The context rule of vLLM's streaming sessions: a turn's last sampled token was never fed through the
model and is dropped at the pause, so the next turn re-sends it in front of the new tokens. Context
tokens are therefore exactly `prompt + every generated token + every appended token`.

A turn cancelled mid-stream (client disconnect) aborts the vLLM request, which frees its KV; the
session keeps its history and the next turn opens a new request over the whole context.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine_adapter.config import ADDITIONAL_CONFIG_KEY, EngineConfig
from engine_adapter.hints import ToolHint, build_hints
from engine_adapter.intercept.records import RECORDS_KEY, InterceptRecord
from engine_adapter.intercept.reports import EngineStats, Integrity, from_dict
from engine_adapter.models import resolve_model
from engine_adapter.triggers import TriggerMatch, find_call

SCHEDULER_CLS = "engine_adapter.scheduler.InterceptScheduler"


class EngineError(RuntimeError):
    """Base class of the errors the facade raises for bad use (mapped to 4xx by the gateway)."""


class ContextTooLong(EngineError):
    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"context of {tokens} tokens exceeds the model's limit of {limit}")
        self.tokens, self.limit = tokens, limit


class SessionBusy(EngineError):
    pass


class SessionClosed(EngineError):
    pass


@dataclass(frozen=True)
class TokenDelta:
    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Resumed:
    """How the context of the previous pause came back (the first event of a turn that resumed a
    paused request; it comes with the turn's first output)."""

    intercept: InterceptRecord


@dataclass(frozen=True)
class TurnEnd:
    # tool_call: a trigger completed (the request is paused under the policy); stop: EOS, the model
    # waits for the next message (also paused); length: max_tokens or the context limit; aborted: the
    # session was closed (or the request aborted) while generating.
    reason: Literal["tool_call", "stop", "length", "aborted"]
    call: TriggerMatch | None
    text: str
    token_ids: list[int]
    context_tokens: int
    # The pause this turn ended in, as the engine core recorded it (type, the policy's action, context
    # tokens, expected duration); None when the request did not pause (aborted, or finished).
    intercept: InterceptRecord | None = None


TurnEvent = TokenDelta | Resumed | TurnEnd


@dataclass
class _Input:
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
    ) -> None:
        self.engine = engine
        self.id = session_id
        self.tools = dict(tools)
        self.max_tokens = max_tokens
        self.sampling = dict(sampling)
        self.history: list[int] = []  # every context token, in order
        self.turns = 0
        self.closed = False
        self._pending_last: int | None = None  # last sampled token, not yet in the engine's KV
        self._queue: asyncio.Queue[_Input | None] | None = None
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
            self._open(_Input(full, max_tokens, regex))
        else:
            appended = ([self._pending_last] if self._pending_last is not None else []) + ids
            assert self._queue is not None
            self._queue.put_nowait(_Input(appended, max_tokens, regex))
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
                    text_parts.append(comp.text)
                    yield TokenDelta(comp.text, list(comp.token_ids))
                if comp.finish_reason is not None:
                    break
        except BaseException:
            # Cancelled (client gone) or the engine failed: vLLM's generate() aborts the request on
            # cancellation, freeing its KV. Keep what was generated as context.
            self._drop_request()
            if out_ids:
                self.history.extend(out_ids)
            raise
        text = "".join(text_parts)
        reason = comp.finish_reason
        if reason == "abort":
            self._drop_request(abort=False)
            self.history.extend(out_ids)
            yield TurnEnd("aborted", None, text, out_ids, len(self.history))
            return
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

    def _open(self, first: _Input) -> None:
        queue: asyncio.Queue[_Input | None] = asyncio.Queue()
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


class InterceptEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.llm: Any = None
        self.tokenizer: Any = None
        self.model_path: str | None = None
        self._sessions: dict[str, Session] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        self.model_path = await asyncio.to_thread(resolve_model, self.config.model)
        # vLLM's CPU backend sizes its KV cache from this variable (whole GiB), read in the engine
        # core, which inherits our environment. On GPU it is ignored.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(self.config.kv_cache_gib)))
        args = engine_args(self.config, self.model_path)
        # Building the engine blocks for as long as the engine core takes to start (seconds to
        # minutes): off the event loop, so that the process keeps serving (health checks answer
        # "starting") meanwhile. AsyncLLM starts its output tasks lazily on the loop that first uses it.
        self.llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        self.tokenizer = self.llm.get_tokenizer()

    async def shutdown(self) -> None:
        for s in list(self._sessions.values()):
            await s.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    async def __aenter__(self) -> InterceptEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ------------------------------------------------------------------ sessions
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def open_session(
        self,
        *,
        session_id: str | None = None,
        tools: Mapping[str, ToolHint] | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        ignore_eos: bool = False,
    ) -> Session:
        if self.llm is None:
            raise EngineError("the engine is not started")
        sid = session_id or uuid.uuid4().hex
        if sid in self._sessions:
            raise EngineError(f"session {sid} exists")
        s = Session(self, sid, tools or {}, max_tokens, dict(temperature=temperature, top_p=top_p, seed=seed, ignore_eos=ignore_eos))
        self._sessions[sid] = s
        return s

    @property
    def sessions(self) -> Mapping[str, Session]:
        return self._sessions

    def _sampling_params(self, session: Session, max_tokens: int, regex: str | None = None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        return SamplingParams(
            structured_outputs=StructuredOutputsParams(regex=regex) if regex else None,
            max_tokens=max_tokens,
            output_kind=RequestOutputKind.DELTA,
            # A trigger ends the turn as a "stop"; without this vLLM's detokenizer would drop the
            # completing token's text (it assumes a stop token). EOS still decodes to "".
            include_stop_str_in_output=True,
            **session.sampling,
        )

    def generate(self, session: Session, queue: asyncio.Queue[_Input | None], request_id: str) -> AsyncGenerator[Any, None]:
        """The vLLM streaming-input request of one session segment (used by `Session`)."""
        from vllm.engine.protocol import StreamingInput
        from vllm.inputs import TokensPrompt

        async def inputs() -> AsyncGenerator[Any, None]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield StreamingInput(
                    prompt=TokensPrompt(prompt_token_ids=list(item.token_ids)),
                    sampling_params=self._sampling_params(session, item.max_tokens, item.regex),
                )

        return self.llm.generate(
            inputs(),
            self._sampling_params(session, session.max_tokens),
            request_id=request_id,
            kv_hints=build_hints(session.id, session.tools),
        )

    def spawn(self, coro: Any) -> None:
        """Run a cleanup coroutine the engine awaits at shutdown (used by `Session`)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, session_id: str) -> None:
        """A session closed (used by `Session.close`)."""
        self._sessions.pop(session_id, None)

    # ------------------------------------------------------------------ engine-core state
    async def _call(self, method: str, *args: Any) -> Any:
        return await self.llm.engine_core.call_utility_async("infercept_call", method, list(args))

    async def stats(self) -> EngineStats:
        """Policy, KV blocks by state, intercept totals, waste, swap (`InterceptCore.stats`)."""
        return from_dict(EngineStats, await self._call("stats"))

    async def intercepts(self, session_id: str | None = None) -> list[InterceptRecord]:
        """Every intercept the engine core keeps a record of (the last 10,000), or one session's."""
        return [InterceptRecord.from_dict(d) for d in await self._call("intercepts", session_id)]

    async def check_integrity(self) -> Integrity:
        """free + running + preserved == total, and the host buffer holds what the paused requests
        own: checked in the engine core; raises if broken."""
        return from_dict(Integrity, await self._call("check_integrity"))

    async def tag(self, session_id: str, aug_type: str, expected_duration_s: float | None = None) -> bool:
        """Refine the type / expected duration of a session's current pause."""
        return await self._call("tag", session_id, aug_type, expected_duration_s)


def engine_args(cfg: EngineConfig, model_path: str, *, intercept: bool = True) -> Any:
    """vLLM's `AsyncEngineArgs` for this configuration; `intercept=False` gives stock vLLM with the same
    model, sizes and cache (the overhead benchmark's baseline)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from engine_adapter.policy.table import policy_spec
    from engine_adapter.swap_connector import CONNECTOR_NAME, MODULE_PATH

    kv_transfer = None
    if intercept and policy_spec(cfg.policy).swap:
        from vllm.config import KVTransferConfig

        kv_transfer = KVTransferConfig(
            kv_connector=CONNECTOR_NAME,
            kv_connector_module_path=MODULE_PATH,
            kv_role="kv_both",
            kv_connector_extra_config={"swap_space_gib": cfg.swap_space_gib,
                                       "link_bytes_per_s": cfg.swap_link_gbps * 1e9 if cfg.swap_link_gbps else None},
        )
    extra = dict(scheduler_cls=SCHEDULER_CLS, kv_transfer_config=kv_transfer,
                 additional_config={ADDITIONAL_CONFIG_KEY: cfg.core_config()}) if intercept else {}
    return AsyncEngineArgs(
        model=model_path,
        dtype=cfg.dtype,
        seed=cfg.seed,
        enforce_eager=True,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        block_size=cfg.block_size,
        num_gpu_blocks_override=cfg.num_kv_blocks,
        enable_prefix_caching=cfg.prefix_caching,
        async_scheduling=False,  # the scheduler subclass extends the synchronous Scheduler
        disable_log_stats=not cfg.log_stats,
        **extra,
    )


def _records(out: Any) -> list[InterceptRecord]:
    """The intercept records the engine core attached to an output (`InterceptScheduler`)."""
    params = getattr(out, "kv_transfer_params", None)
    return [InterceptRecord.from_dict(d) for d in (params or {}).get(RECORDS_KEY, ())]
