"""From a benchmark setting to a simulated engine, through the same code the benchmark and the engine
use: the replay's `Setting.engine_config(variant, token_budget)` gives the engine configuration
(the bound's KV included), its `core_config()` the intercept core's, and `build_core` assembles the
core as vLLM's scheduler does. Every policy is one of the benchmark's `VARIANTS`, except those in
`NOT_SIMULATED`, which are refused with the reason."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercept.benchmarks.replay import VARIANTS, Setting, Variant
from infercept.benchmarks.replay import variant as bench_variant
from infercept.benchmarks.sim.cost import KVSpill, make_cost, overlapped, prefill_step_s
from infercept.benchmarks.sim.engine import SimEngine
from infercept.benchmarks.sim.host_tier import SimHostTier
from infercept.benchmarks.sim.pool import BlockPool
from infercept.benchmarks.sim.scheduler import SimScheduler
from infercept.benchmarks.workload import PRIOR_MODES, write_priors
from engine_adapter.config import ADDITIONAL_CONFIG_KEY, CoreConfig, host_chunks
from engine_adapter.intercept.build import build_core
from engine_adapter.policy.profile import Profile
from engine_adapter.policy.table import SESSION_END_LRU, policy_spec


# Benchmark policies the simulator refuses rather than simulate wrongly, with the reason (none today:
# `vllm-offload`'s host tier is `host_tier.py`).
NOT_SIMULATED: Mapping[str, str] = {}
SIMULATED_LABELS: tuple[str, ...] = tuple(label for label in VARIANTS if label not in NOT_SIMULATED)


def simulable(label: str) -> bool:
    return label.partition("@")[0] not in NOT_SIMULATED


def variant(label: str) -> Variant:
    """The benchmark's `replay.variant`, refusing what the simulator does not model."""
    if label.partition("@")[0] in NOT_SIMULATED:
        raise ValueError(f"policy {label!r} cannot be simulated: {NOT_SIMULATED[label.partition('@')[0]]}")
    return bench_variant(label)


def make_setting(**kw: Any) -> Setting:
    """The runner's `Setting`, from whichever of its fields are given (unknown keys are dropped, so a
    bench.json written by an older or newer runner still reads)."""
    known = {f.name for f in dataclasses.fields(Setting)}
    return Setting(**{k: v for k, v in kw.items() if k in known})


@dataclass
class SimBench:
    """One simulated benchmark setting: the runner's engine setting plus what the simulator needs."""

    setting: Setting  # `unlimited_kv_tokens` sizes the bound's KV (0: set by `sweep` as the runner does)
    profile: Profile  # the device's cost profile (M is the model's real KV size)
    # Each policy's max_num_batched_tokens (the bench's, after its pilot when tuned); a policy not
    # named gets `default_budget`, which by default is the profile's saturation point S (the runner's).
    token_budget: Mapping[str, int | None] = field(default_factory=dict)
    default_budget: int | None = None
    unlimited_slots: int = 0  # running slots the bound gets beyond max_num_seqs (0: the runner's bound)
    # MeasuredCost's split of the decode excess, one or per batch size (None: the profile's)
    context_share: float | Mapping[int, float] | None = None
    pair_s: float | None = None  # MeasuredCost's attention cost per (query, earlier key) pair (None: the grid's)
    frontend_s: tuple[float, float] | None = None  # front-end latency of an input and of an output (None: the profile's)
    host_per_request_s: float = 0.0  # host time per step per request held by the engine (see SimEngine)
    window_share: float = 1.0  # share of a step's time that copies hide behind (see SimEngine)
    step_overhead_s: float = 0.0  # host time per step beyond the profile's (see SimEngine)
    # The machine's time factor at the SLO reference over the profile's (`SimEngine.speed`; below 1: the machine
    # ran the reference faster than when the profile was measured): every engine starts at it, and a replay at
    # machine speed multiplies each point's factor (relative to the reference) into it.
    speed: float = 1.0
    spill: KVSpill | None = None  # MeasuredCost's cache cliff (None: the profile's `extra.decode_spill`, if any)
    chunk_step_s: float | None = None  # MeasuredCost's cost per prefilled request (None: the profile's `extra.chunk_step_s`, or 0)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="infercept-sim-")))
    # Watchers of every engine this setting builds (experiments read its core and ledger, or add the core's
    # own `observers`); the simulation never reads what they do.
    on_engine: list[Callable[[SimEngine], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.profile_path = self.workdir / "profile.json"
        self.profile_path.write_text(self.profile.to_json())
        self.setting.priors_dir = str(self.workdir)
        for mode in PRIOR_MODES:  # as the runner writes them
            write_priors(self.workdir / f"priors-{mode}.yaml", mode, self.setting.time_scale)

    def frontend(self) -> tuple[float, float]:
        """The front end's share of a request's time to first token at an idle engine: what the
        profiler measured for a one-token prompt (`extra.per_request_overhead_s`) beyond a one-token
        step (the measured decode step of one request), half on the way in, half on the way out."""
        if self.frontend_s is not None:
            return self.frontend_s
        ttft1 = self.profile.extra.get("per_request_overhead_s")
        step1 = next((v for k, v in (self.profile.extra.get("decode") or {}).items() if str(k).startswith("batch1_")), None)
        if not ttft1 or step1 is None:
            return (0.0, 0.0)
        # The one-token prompt's step paid the prefill path's cost too, which the simulated step charges.
        rest = max(0.0, float(ttft1) - float(step1) - self.chunk_s())
        return (rest / 2, rest / 2)

    def chunk_s(self) -> float:
        """The step cost per prefilled request the measured cost model charges (0 for a roofline profile,
        whose model does not charge it)."""
        return 0.0 if self.profile.extra.get("roofline") else prefill_step_s(self.profile, self.chunk_step_s)

    def budget(self, label: str | None = None) -> int:
        """A policy's token budget (None: the default one, which the runner's SLO engine gets)."""
        b = self.token_budget.get(label) if label is not None else None
        if b is None:
            b = self.default_budget
        return int(b if b is not None else self.profile.saturation_tokens)

    def engine(self, label: str, *, check_every: int = 0, token_budget: int | None = None,
               unlimited_kv_tokens: int | None = None) -> SimEngine:
        """A fresh simulated engine for a policy label, at its token budget (or `token_budget`); the
        bound's KV is the setting's `unlimited_kv_tokens` (or the one given)."""
        v = variant(label)
        s = self.setting
        if unlimited_kv_tokens is not None:
            s = dataclasses.replace(s, unlimited_kv_tokens=unlimited_kv_tokens)
        budget = token_budget if token_budget is not None else self.budget(label)
        # No vLLM limits: the simulated bound keeps its slot per session even past the token budget (a bound
        # short of slots does not bound), which the engine's bound must respect.
        cfg = s.engine_config(v, budget, vllm_limits=False)
        usable = (cfg.num_kv_blocks or 1) - 1  # vLLM's block 0 is its null block
        slots = cfg.max_num_seqs
        if v.unlimited_kv:
            # A running slot for every context too, where asked: paused sessions hold slots in vLLM,
            # and a bound that ran out of slots would not bound the paper-scale runs.
            slots += self.unlimited_slots
        cfg = dataclasses.replace(cfg, profile=str(self.profile_path))
        core_cfg = CoreConfig.from_additional_config({ADDITIONAL_CONFIG_KEY: cfg.core_config()})
        m = self.profile.kv_bytes_per_token
        block_bytes = m * cfg.block_size  # type: ignore[operator]
        spec = policy_spec(v.policy)
        host_blocks = host_chunks(int(cfg.swap_space_gib * 2**30), block_bytes)  # as the engine's connectors size it
        pool = BlockPool(usable, cfg.block_size, spec.prefix_caching)  # type: ignore[arg-type]
        sched = SimScheduler(pool, max_num_seqs=slots, max_model_len=cfg.max_model_len, token_budget=budget)
        if spec.host_tier:
            sched.host_tier = self.host_tier(host_blocks, cfg.block_size, block_bytes,  # type: ignore[arg-type]
                                             ended_first=spec.host_tier_eviction == SESSION_END_LRU)
        host_slots = host_blocks if spec.swap else 0

        def factory(port: SimScheduler) -> Any:
            return build_core(core_cfg, port, model=self.profile.model, device=self.profile.device,
                              block_size=cfg.block_size, kv_bytes_per_token=m, host_slots=host_slots)  # type: ignore[arg-type]

        eng = SimEngine(sched, factory, make_cost(self.profile, self.context_share, self.pair_s, self.spill, self.chunk_step_s), oracle=v.oracle,
                        check_every=check_every, frontend_s=self.frontend(),
                        host_per_request_s=self.host_per_request_s, step_overhead_s=self.step_overhead_s,
                        window_share=self.window_share)
        eng.speed = self.speed
        for watch in self.on_engine:
            watch(eng)
        return eng

    def host_tier(self, host_blocks: int, block_size: int, block_bytes: int, ended_first: bool = False) -> SimHostTier:
        """`vllm-offload`'s host tier: the swap policies' buffer and link (the engine gives it the same);
        on a CPU its copies run in the worker at the profile's measured bandwidths, and without an
        emulated link they are all a transfer takes. A GPU copies beside the step, over the profile's
        link unless the setting names one."""
        on_cores = not overlapped(self.profile)
        link = self.setting.swap_link_gbps * 1e9 if self.setting.swap_link_gbps else (
            None if on_cores else self.profile.swap_out_bytes_per_s)
        return SimHostTier(host_blocks, block_size, block_bytes, link,
                           self.profile.swap_out_bytes_per_s if on_cores else None,
                           self.profile.swap_in_bytes_per_s if on_cores else None, ended_first=ended_first)


def load_profile(path: str | Path) -> Profile:
    return Profile.load(path)


def profile_from_bench(setting: Mapping[str, Any], fallback: str | Path | None = None) -> Profile:
    """The profile a benchmark ran with: the document the bench records (`setting.profile_data`, the
    profile file's content), else its file if it is here, else the summary older runners recorded
    (`setting.profile`: T_fwd grid in ms, S, M, decode steps)."""
    data = setting.get("profile_data")
    if isinstance(data, Mapping) and data.get("fwd_tokens"):
        return Profile.from_dict(data)
    p = setting.get("profile")
    if isinstance(p, str) and Path(p).is_file():
        return Profile.load(p)
    if isinstance(p, Mapping) and p.get("t_fwd_ms"):
        grid = sorted((int(k), float(v) / 1000) for k, v in p["t_fwd_ms"].items())
        model = str(setting.get("model", "bench"))
        return Profile(model=model, device="cpu", fwd_tokens=tuple(t for t, _ in grid),
                       fwd_seconds=tuple(s for _, s in grid), saturation_tokens=int(p["saturation_tokens"]),
                       kv_bytes_per_token=int(p["kv_bytes_per_token"]), swap_out_bytes_per_s=6e9,
                       swap_in_bytes_per_s=6e9, source="rebuilt from bench.json setting.profile",
                       extra={"decode": dict(p.get("decode") or {})})
    if fallback is not None:
        return Profile.load(fallback)
    raise ValueError("the benchmark records no profile the simulator can use")


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=lambda o: None if o == float("inf") else str(o))
