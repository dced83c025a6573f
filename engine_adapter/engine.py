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

vLLM 0.32 internals relied on: `AsyncLLM.engine_core.call_utility_async` (the engine core's report
methods, `scheduler.py`), `engine_core.resources.engine_manager.{finished_procs(), processes}` (which
engine process ended); a utility call on one data-parallel rank goes through the port
(`vllm_port.call_utility_on_rank`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import uuid
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from engine_adapter.config import ADDITIONAL_CONFIG_KEY, EngineConfig
from engine_adapter.events import EngineError
from engine_adapter.hints import ToolHint, build_hints
from engine_adapter.intercept.records import InterceptRecord
from engine_adapter.intercept.reports import EngineStats, Integrity, from_dict
from engine_adapter.models import resolve_model
from engine_adapter.session import Session, TurnInput

SCHEDULER_CLS = "engine_adapter.scheduler.InterceptScheduler"


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
        # Importing vLLM takes 10-30 s on a loaded machine: in a thread, so the event loop keeps serving
        # (health checks answer "starting") meanwhile.
        AsyncLLM = await asyncio.to_thread(_async_llm_class)
        self.model_path = await asyncio.to_thread(resolve_model, self.config.model)
        # vLLM's CPU backend sizes its KV cache from this variable (whole GiB), read in the engine
        # core, which inherits our environment. On GPU it is ignored.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(self.config.kv_cache_gib)))
        # vLLM gives up on a structured-output grammar that takes longer than this to compile (5 s by
        # default, a guard against hostile client regexes). Ours are built by the gateway from tool names,
        # never taken from clients, and the ReAct step's took 4.3 s on a loaded 2-core machine (cached
        # after the first use): past the default, a doubly loaded machine failed the turn. A user's own
        # setting wins.
        os.environ.setdefault("VLLM_REGEX_COMPILATION_TIMEOUT_S", "60")
        args = engine_args(self.config, self.model_path)
        # Building the engine blocks for as long as the engine core takes to start (seconds to
        # minutes): off the event loop, so that the process keeps serving (health checks answer
        # "starting") meanwhile. AsyncLLM starts its output tasks lazily on the loop that first uses it.
        if self.config.log_stats:
            # Its Prometheus metrics, without the stat logger that logs a summary line every few seconds.
            logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        with cpu_cores_reserved_as_without_connector(args):
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
        history: Sequence[int] = (),
    ) -> Session:
        """A new session; `history` restores one whose context is known (its tokens, exactly): the first
        turn then opens a vLLM request over all of it, so its KV is rebuilt by recompute."""
        if self.llm is None:
            raise EngineError("the engine is not started")
        sid = session_id or uuid.uuid4().hex
        if sid in self._sessions:
            raise EngineError(f"session {sid} exists")
        s = Session(self, sid, tools or {}, max_tokens, dict(temperature=temperature, top_p=top_p, seed=seed, ignore_eos=ignore_eos),
                    history=history, rank=least_loaded(self.sessions_per_rank()))
        self._sessions[sid] = s
        return s

    @property
    def sessions(self) -> Mapping[str, Session]:
        return self._sessions

    @property
    def ranks(self) -> int:
        """Data-parallel ranks: engine cores, each with its own KV cache and intercept core."""
        return self.config.data_parallel_size

    def sessions_per_rank(self) -> list[int]:
        """Open sessions pinned to each rank: a new session goes to the least loaded (sessions, not
        requests, are what hold KV across calls)."""
        counts = [0] * self.ranks
        for s in self._sessions.values():
            counts[s.rank] += 1
        return counts

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

    def generate(self, session: Session, queue: asyncio.Queue[TurnInput | None], request_id: str) -> AsyncGenerator[Any, None]:
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
            # With one rank vLLM ignores it; with several it pins the request (vLLM's own rank selection).
            data_parallel_rank=session.rank if self.ranks > 1 else None,
        )

    @property
    def dead(self) -> bool:
        """The engine-core process died (vLLM's own monitor noticed; every call would fail)."""
        return self.llm is not None and bool(self.llm.errored)

    def dead_reason(self) -> str:
        """Which engine process ended and how, as far as vLLM's process manager knows."""
        manager = self._core_manager()
        finished = manager.finished_procs() if manager is not None else {}
        if finished:
            return ", ".join(f"{name} exited with code {code}" for name, code in finished.items())
        return "the engine core stopped answering"

    def core_pids(self) -> list[int]:
        """Process ids of the engine-core processes vLLM started for this engine (empty in-process)."""
        manager = self._core_manager()
        return [p.pid for p in manager.processes if p.pid is not None] if manager is not None else []

    def _core_manager(self) -> Any:
        core = getattr(self.llm, "engine_core", None)
        return getattr(getattr(core, "resources", None), "engine_manager", None)

    def spawn(self, coro: Any) -> None:
        """Run a cleanup coroutine the engine awaits at shutdown (used by `Session`)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, session_id: str) -> None:
        """A session closed (used by `Session.close`)."""
        self._sessions.pop(session_id, None)

    # ------------------------------------------------------------------ engine-core state
    async def _call(self, method: str, *args: Any, rank: int = 0) -> Any:
        client = self.llm.engine_core
        if self.ranks == 1:
            return await client.call_utility_async("infercept_call", method, list(args))
        from engine_adapter.vllm_port import call_utility_on_rank

        return await call_utility_on_rank(client, rank, "infercept_call", method, list(args))

    async def _call_all(self, method: str, *args: Any) -> list[Any]:
        """One result per rank, in rank order."""
        return [await self._call(method, *args, rank=r) for r in range(self.ranks)]

    async def stats(self) -> EngineStats:
        """Policy, KV blocks by state, intercept totals, waste, swap (`InterceptCore.stats`); with
        several ranks, their sum (`stats_by_rank` for each)."""
        return (await self.stats_by_rank())[0]

    async def stats_by_rank(self) -> tuple[EngineStats, list[EngineStats]]:
        """The sum over ranks and each rank's, from one round of calls."""
        ranks = await self._call_all("stats")
        total = ranks[0] if len(ranks) == 1 else merge_stats(ranks)
        return from_dict(EngineStats, total), [from_dict(EngineStats, d) for d in ranks]

    async def intercepts(self, session_id: str | None = None) -> list[InterceptRecord]:
        """Every intercept the engine cores keep a record of (the last 10,000 each), or one session's
        (asked of its rank only)."""
        if session_id is not None:
            s = self._sessions.get(session_id)
            found = await self._call("intercepts", session_id, rank=s.rank if s else 0) if s or self.ranks == 1 else \
                [d for r in await self._call_all("intercepts", session_id) for d in r]
        else:
            found = [d for r in await self._call_all("intercepts", None) for d in r]
        return [InterceptRecord.from_dict(d) for d in found]

    async def check_integrity(self) -> Integrity:
        """free + running + preserved == total, and the host buffer holds what the paused requests
        own: checked in every engine core; raises if any is broken. Returns the sum over ranks."""
        return sum_integrity(await self.integrity_by_rank())

    async def integrity_by_rank(self) -> list[Integrity]:
        return [from_dict(Integrity, d) for d in await self._call_all("check_integrity")]

    async def tag(self, session_id: str, aug_type: str, expected_duration_s: float | None = None) -> bool:
        """Refine the type / expected duration of a session's current pause."""
        s = self._sessions.get(session_id)
        return await self._call("tag", session_id, aug_type, expected_duration_s, rank=s.rank if s else 0)


def sum_integrity(ranks: Sequence[Integrity]) -> Integrity:
    return Integrity(**{k: sum(getattr(i, k) for i in ranks) for k in Integrity.__dataclass_fields__})


def least_loaded(loads: Sequence[int]) -> int:
    """The rank with the least load; ties go to the lowest rank."""
    return min(range(len(loads)), key=lambda r: (loads[r], r)) if loads else 0


# Fields that describe an engine rather than count its work: taken from rank 0, not summed.
# (`overlap`: the swap budget's learned share of a step; the ranks run the same steps, rank 0's is reported.)
_SAME_ON_EVERY_RANK = frozenset({"policy", "block_size", "token_budget", "engine_time_s", "kv_bytes_per_token", "profile",
                                 "overlap"})


def merge_stats(ranks: Sequence[Any]) -> Any:
    """Several ranks' stats dicts as one: counts and times summed, descriptions (and per-step
    lists) from rank 0, the recompute share recomputed from the summed times."""
    first = ranks[0]
    if isinstance(first, dict):
        out = {k: first[k] if k in _SAME_ON_EVERY_RANK else merge_stats([r.get(k) for r in ranks]) for k in first}
        if "recompute_share_of_forward" in out:
            out["recompute_share_of_forward"] = out["recompute_forward_s"] / out["forward_s"] if out["forward_s"] else 0.0
        return out
    if isinstance(first, bool) or not isinstance(first, (int, float)):
        return first
    return sum(r for r in ranks if isinstance(r, (int, float)))


RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def reserved_cpu_cores(local_world_size: int, arch_reserves_per_rank: bool = True) -> int:
    """The cores vLLM's CPU backend keeps free of its workers' OpenMP threads for the engine core and the
    front end when no KV connector is configured (`vllm/utils/ompmultiprocessing.py`): one per local rank
    on x86, ARM and RISC-V, else one."""
    return max(1, local_world_size) if arch_reserves_per_rank else 1


@contextmanager
def cpu_cores_reserved_as_without_connector(args: Any) -> Iterator[None]:
    """While the engine starts: reserve the cores vLLM reserves without a KV connector.

    vLLM's CPU backend reserves one more core per rank when any KV connector is configured (for NIXL's
    transfer threads in prefill/decode disaggregation). Our connectors copy in the worker's own thread and
    need none. Worse, where the machine has no core to spare (2 cores, one worker), vLLM then reserves none:
    the worker's OpenMP pool takes both cores, and its second thread, spin-waiting between parallel regions,
    starves the engine core on the other. Measured on the 2-core bench machine (tiny model, `mixed`, 2 req/s,
    seed 1): `preserve` with the swap connector attached and nothing swapped ran at 8.3 ms per output token
    against 3.6 without it, every step waiting ~3 ms for the engine core. Every swap and host-tier policy
    paid that; with this reservation they run on the cores the others get. The engine core reads the
    variable when it spawns the workers (it inherits our environment at its own start), so it is set for the
    start only. A user's own setting wins."""
    from vllm.platforms import CpuArchEnum, current_platform

    if args.kv_transfer_config is None or RESERVED_CPU_ENV in os.environ or not current_platform.is_cpu():
        yield
        return
    per_rank = current_platform.get_cpu_architecture() in (CpuArchEnum.X86, CpuArchEnum.ARM, CpuArchEnum.RISCV)
    os.environ[RESERVED_CPU_ENV] = str(reserved_cpu_cores(args.tensor_parallel_size * args.pipeline_parallel_size, per_rank))
    try:
        yield
    finally:
        os.environ.pop(RESERVED_CPU_ENV, None)


def _async_llm_class() -> Any:
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM


def engine_args(cfg: EngineConfig, model_path: str, *, intercept: bool = True) -> Any:
    """vLLM's `AsyncEngineArgs` for this configuration; `intercept=False` gives stock vLLM with the same
    model, sizes and cache (the overhead benchmark's baseline)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from engine_adapter.policy.table import policy_spec
    from engine_adapter.swap_connector import CONNECTOR_NAME, MODULE_PATH

    kv_transfer = None
    spec = policy_spec(cfg.policy)
    link = cfg.swap_link_gbps * 1e9 if cfg.swap_link_gbps else None
    if intercept and spec.swap:
        from vllm.config import KVTransferConfig

        kv_transfer = KVTransferConfig(
            kv_connector=CONNECTOR_NAME,
            kv_connector_module_path=MODULE_PATH,
            kv_role="kv_both",
            kv_connector_extra_config={"swap_space_gib": cfg.swap_space_gib, "link_bytes_per_s": link},
        )
    elif intercept and spec.host_tier:
        from vllm.config import KVTransferConfig

        from engine_adapter import offload_connector

        # The same host buffer size and link as the swap policies, under vLLM's own offloading connector.
        kv_transfer = KVTransferConfig(
            kv_connector=offload_connector.CONNECTOR_NAME,
            kv_connector_module_path=offload_connector.MODULE_PATH,
            kv_role="kv_both",
            kv_connector_extra_config=offload_connector.extra_config(cfg.swap_space_gib, link, spec.host_tier_eviction),
        )
    extra = dict(scheduler_cls=SCHEDULER_CLS, kv_transfer_config=kv_transfer,
                 additional_config={ADDITIONAL_CONFIG_KEY: cfg.core_config()}) if intercept else {}
    return AsyncEngineArgs(
        model=model_path,
        dtype=cfg.resolved_dtype(),
        seed=cfg.seed,
        enforce_eager=cfg.resolved_enforce_eager(),
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        block_size=cfg.block_size,
        num_gpu_blocks_override=cfg.num_kv_blocks,
        enable_prefix_caching=cfg.prefix_caching,
        async_scheduling=False,  # the scheduler subclass extends the synchronous Scheduler
        disable_log_stats=not cfg.log_stats,
        tensor_parallel_size=cfg.tensor_parallel_size,
        pipeline_parallel_size=cfg.pipeline_parallel_size,
        data_parallel_size=cfg.data_parallel_size,
        distributed_executor_backend=cfg.distributed_executor_backend,
        **extra,
    )
