"""Replaying the workload through the engine: the setting, the variants (a policy, or a policy with a
benchmark-only twist), and one engine's run over a set of rates.

Each request runs through the same path the gateway uses: a session whose turns end at the workload's
decode lengths (EOS ignored) and pause inside vLLM as an intercept of the request's augmentation type
(the `__turn_end__` hint), a replay executor that sleeps the sampled call duration (x the time scale),
and a resume with the sampled number of returned tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercept.benchmarks.metrics import BOUND, Outcome, Turn, pct, summarize
from infercept.benchmarks.workload import Request, check_priors, random_tokens
from engine_adapter.policy.table import DEFAULT_TTL_S, POLICY_NAMES
from engine_adapter.paths import configs_dir

REPO = Path(__file__).resolve().parent.parent

# The machine check: one request alone on the idle engine, before and after every point. Its context is
# the size of the workloads' turns; its time per decoded token is the machine's speed at that moment.
PROBE_PROMPT = list(range(2000, 3024))
PROBE_TOKENS = 48
PROBE_MIN_GAPS = 8


async def decode_probe(engine: Any) -> float | None:
    """The median seconds per decoded token of one request (PROBE_PROMPT, PROBE_TOKENS, EOS ignored)
    alone on the idle engine; None if the turn ended with fewer than PROBE_MIN_GAPS gaps (a stop string).
    Outside every measured window: the caller takes its stats after (or before) it. Its steps teach the
    engine's T_fwd refinement what one-token and 1,024-token steps take, as the warm-up's do."""
    from engine_adapter.events import TokenDelta

    session = engine.open_session(max_tokens=PROBE_TOKENS, ignore_eos=True)
    gaps: list[float] = []
    last: float | None = None
    try:
        async for ev in session.turn(PROBE_PROMPT, max_tokens=PROBE_TOKENS):
            if isinstance(ev, TokenDelta) and ev.token_ids:
                now = time.perf_counter()
                if last is not None:  # a delta of several tokens (a slow reader) shares its gap
                    gaps.extend([(now - last) / len(ev.token_ids)] * len(ev.token_ids))
                last = now
    finally:
        await session.close()
    return statistics.median(gaps) if len(gaps) >= PROBE_MIN_GAPS else None


@dataclass(frozen=True)
class Variant:
    label: str  # as on the command line
    policy: str  # the engine policy
    estimator: str | None = None  # engine estimator override (None: the policy's, else the engine default)
    oracle: bool = False  # tag each pause with its true duration
    unlimited_kv: bool = False  # the bound: KV for every context at once
    zero_calls: bool = False  # calls take no time (the SLO's unloaded reference)
    priors: str | None = None  # the duration priors its estimator starts from (None: the run's, `Setting.priors`)


VARIANTS: dict[str, Variant] = {name: Variant(name, name) for name in POLICY_NAMES} | {
    "oracle-duration": Variant("oracle-duration", "infercept", estimator="oracle", oracle=True),
    BOUND: Variant(BOUND, "preserve", unlimited_kv=True),
}


def variant(label: str) -> Variant:
    """A command-line label: a name of `VARIANTS`, optionally with `@PRIORS` (one of `workload.PRIOR_MODES`)
    for a row whose estimator starts from other priors than the run's (`infercept@table1`, `continuum@x3`)."""
    name, _, priors = label.partition("@")
    if name not in VARIANTS:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(VARIANTS)}")
    v = VARIANTS[name]
    return dataclasses.replace(v, label=label, priors=check_priors(priors)) if priors else v
ABLATION = (("improved-discard", "improved-discard"), ("+ chunked recompute at S", "chunked-discard"),
            ("+ budgeted swap", "swap"), ("+ preserve heuristic", "swap-heuristic"),
            ("+ min-waste (paper estimate)", "infercept-paper"),
            # `infercept` adds three things of ours at once: the estimator, swap under pressure, waiting for the budget.
            ("+ ours (estimator, pressure swap, wait for budget)", "infercept"))


@dataclass
class Setting:
    model: str = "tiny"
    dtype: str = "float32"
    block_size: int = 32
    kv_tokens: int = 24576
    max_model_len: int = 4096
    max_num_seqs: int = 64
    swap_space_gib: float = 1.0
    swap_link_gbps: float | None = 0.25
    time_scale: float = 0.1
    context_scale: float = 1.0
    max_context: int = 3500
    drain_s: float = 45.0  # after the last arrival, wait at most this long for requests to finish
    # The duration priors every estimator starts from (`workload.PRIOR_MODES`; generic: not the workload's),
    # and the folder the runner wrote them to as priors-<mode>.yaml, in scaled time (None: the shipped Table 1).
    priors: str = "generic"
    priors_dir: str | None = None
    # The tiny model's profile measured on the bench machine (T_fwd grid, S, M): infercept's equations use it.
    profile: str | None = str(configs_dir() / "profiles" / "tiny-cpu-bench.json")
    unlimited_kv_tokens: int = 0  # the bound's KV: enough for every request's context at once (set by the runner)
    # The bound's running slots: one for every session of the busiest workload (set by the runner). vLLM
    # counts paused sessions against max_num_seqs, so a preserve-everything engine with the others' slots
    # stops admitting new requests once they all hold KV: a bound that bounds needs a slot per session.
    unlimited_kv_slots: int = 0
    kv_bytes_per_token: int = 1024  # M of the model (the profile's): sizes the KV memory vLLM reserves

    def engine_config(self, v: Variant, token_budget: int | None, saturation_tokens: int | None = None,
                      vllm_limits: bool = True) -> Any:
        """`saturation_tokens`: S for the policies instead of the profile's (the runner's budget pilot).
        `vllm_limits=False`: a configuration vLLM need not accept (the simulator's bound may have more running
        slots than its token budget has tokens: at paper scale a run has more sessions than that)."""
        from engine_adapter.config import EngineConfig

        tokens = max(self.kv_tokens, self.unlimited_kv_tokens) if v.unlimited_kv else self.kv_tokens
        slots = max(self.max_num_seqs, self.unlimited_kv_slots) if v.unlimited_kv else self.max_num_seqs
        if v.unlimited_kv and token_budget is not None and slots > token_budget:
            # vLLM refuses max_num_seqs above max_num_batched_tokens; the bound needs a slot per session, so
            # its budget grows to its slots (more than the others get: a bound may have more, never less).
            token_budget = slots
        if vllm_limits and token_budget is not None and slots > token_budget:
            # vLLM refuses max_num_seqs above max_num_batched_tokens: say so in the benchmark's terms.
            raise ValueError(f"{v.label}: {slots} running slots (one per session) exceed the token budget of {token_budget} "
                             "tokens, which vLLM does not allow: fewer sessions per run (rate x duration) or a larger budget")
        return EngineConfig(
            model=self.model, policy=v.policy, dtype=self.dtype, block_size=self.block_size,
            num_kv_blocks=-(-tokens // self.block_size) + 1,  # + vLLM's null block, which holds no KV
            max_model_len=self.max_model_len,
            max_num_seqs=slots,
            max_num_batched_tokens=token_budget, swap_space_gib=self.swap_space_gib,
            swap_link_gbps=self.swap_link_gbps, estimator=v.estimator or "prior",
            kv_cache_gib=max(1.0, math.ceil(tokens * self.kv_bytes_per_token * 1.1 / 2**30)),
            augmentation_priors=str(Path(self.priors_dir) / f"priors-{v.priors or self.priors}.yaml") if self.priors_dir else None,
            profile=self.profile if self.model == "tiny" else None,
            saturation_tokens=saturation_tokens,
            # Continuum-style TTLs are set from call durations: scaled with them.
            ttl_s={k: t * self.time_scale for k, t in DEFAULT_TTL_S.items()},
        )


async def replay(engine: Any, req: Request, v: Variant, s: Setting, t0: float, out: Outcome) -> None:
    """One request: turns end at the workload's decode lengths and pause as intercepts of its type."""
    from engine_adapter.events import TokenDelta, TurnEnd
    from engine_adapter.hints import TURN_END_KEY, ToolHint

    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.monotonic()))
    out.arrival_s = time.monotonic()
    rng = random.Random(req.rid)
    # The hint names the call's type, not its duration: estimators learn durations from the calls they see.
    session = engine.open_session(tools={TURN_END_KEY: ToolHint(req.aug_type)},
                                  max_tokens=8, ignore_eos=True, seed=req.rid)
    try:
        tokens: list[int] = list(req.prompt)
        steps = [(c.decode_tokens, c) for c in req.calls] + [(req.final_decode_tokens, None)]
        for i, (decode, call) in enumerate(steps):
            sent, first, n = time.monotonic(), None, 0
            out.open_turn = (i, sent, None)
            async for ev in session.turn(tokens, max_tokens=decode):
                if isinstance(ev, TokenDelta):
                    if first is None:
                        first = time.monotonic()
                        out.open_turn = (i, sent, first)
                    if out.first_token_s is None:
                        out.first_token_s = first
                elif isinstance(ev, TurnEnd):
                    n = len(ev.token_ids)
                    out.output_tokens += n
            end = time.monotonic()
            out.open_turn = None  # recorded as a Turn instead
            out.turns.append(Turn(req.rid, req.aug_type, i, len(tokens), n, sent - t0, (first or end) - sent, end - sent))
            if call is None:
                break
            duration = 0.0 if v.zero_calls else call.duration_s * s.time_scale
            if v.oracle:
                await engine.tag(session.id, req.aug_type, duration)
            c0 = time.monotonic()
            await asyncio.sleep(duration)
            out.call_s += time.monotonic() - c0
            tokens = random_tokens(rng, call.returned_tokens)
        out.end_s = time.monotonic()
    except Exception as e:  # recorded, not fatal: a failed request counts as not completed
        out.error = f"{type(e).__name__}: {e}"
    finally:
        await session.close()


async def settled_integrity(engine: Any, timeout_s: float = 30.0) -> Any:
    """The engine's checked block counts once the requests cut off at the end of a run are gone: their
    aborts reach the engine core asynchronously, so blocks still held right after the cutoff are not
    leaks. Returns the last counts after `timeout_s` either way (a real leak stays visible)."""
    counts = await engine.check_integrity()
    deadline = time.monotonic() + timeout_s
    while (counts.free != counts.total or counts.host_tokens) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        counts = await engine.check_integrity()
    return counts


class EngineRun:
    """One engine (a variant at a token budget), started once, running workloads one after another."""

    def __init__(self, v: Variant, s: Setting, token_budget: int | None, saturation_tokens: int | None = None) -> None:
        from engine_adapter.engine import InterceptEngine

        self.v, self.s, self.token_budget = v, s, token_budget
        self.outcomes: list[Outcome] = []  # the last run's, per request (with per-turn timing)
        self.engine = InterceptEngine(s.engine_config(v, token_budget, saturation_tokens))

    async def __aenter__(self) -> EngineRun:
        await self.engine.start()
        # Warm-up (compilation caches, first-iteration costs) outside the measurement.
        warm = self.engine.open_session(max_tokens=4, ignore_eos=True)
        async for _ in warm.turn(list(range(1000, 1200)), max_tokens=4):
            pass
        await warm.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.shutdown()

    async def info(self) -> dict[str, Any]:
        st = await self.engine.stats()
        return {"policy": st.policy, "token_budget": st.token_budget, "kv_blocks": st.blocks.total,
                "max_num_seqs": self.engine.config.max_num_seqs, "swap_space_gib": self.engine.config.swap_space_gib,
                "block_size": st.block_size, "profile": st.profile.source, "saturation_tokens": st.profile.saturation_tokens}

    async def run(self, reqs: list[Request], rate: float) -> dict[str, Any]:
        """Replay one workload (arrivals as sampled); requests still running `drain_s` after the last
        arrival are cut off (and counted with a lower bound of their latency)."""
        engine, s = self.engine, self.s
        probe_before = await decode_probe(engine)
        await settled_integrity(engine)  # the probe's request gone: the point starts on an empty engine
        stats0 = dataclasses.asdict(await engine.stats())
        outs = self.outcomes = [Outcome(r.rid, r.aug_type, r.arrival_s) for r in reqs]
        t0 = time.monotonic() + 0.05
        tasks = [asyncio.create_task(replay(engine, r, self.v, s, t0, o)) for r, o in zip(reqs, outs)]
        last_arrival = max((r.arrival_s for r in reqs), default=0.0)
        _, pending = await asyncio.wait(tasks, timeout=last_arrival + s.drain_s)
        cutoff = time.monotonic()
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.monotonic() - t0
        stats1 = dataclasses.asdict(await engine.stats())
        out = summarize(outs, stats0, stats1, wall, cutoff, capacity_tokens=s.kv_tokens)
        out |= {"rate": rate, "timed_out": len(pending),
                "kv_integrity_after": dataclasses.asdict(await settled_integrity(engine))}
        out["machine_check"] = {"before_s_per_token": probe_before, "after_s_per_token": await decode_probe(engine)}
        return out

    async def unloaded(self, reqs: list[Request]) -> dict[str, Any]:
        """The SLO's reference: requests one at a time with zero-time calls, on this (idle) engine."""
        zero = dataclasses.replace(self.v, zero_calls=True)
        lat, ttft = [], []
        for r in reqs:
            o = Outcome(r.rid, r.aug_type, 0.0)
            await replay(self.engine, dataclasses.replace(r, arrival_s=0.0), zero, self.s, time.monotonic(), o)
            if o.normalized_latency is not None:
                lat.append(o.normalized_latency)
            if o.first_token_s is not None:
                ttft.append(o.first_token_s - o.arrival_s)
        return {"requests": len(lat), "median_s": pct(lat, 0.5), "p90_s": pct(lat, 0.9),
                "ttft_median_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
                "probe_s_per_token": await decode_probe(self.engine)}
