"""The engine's reports as dataclasses: built in the engine core, sent to the front end as plain dicts
(`to_dict`), read back as the same dataclasses (`from_dict`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine_adapter.intercept.records import BlockCounts, Totals
from engine_adapter.intercept.state import KvState

if typing.TYPE_CHECKING:
    from engine_adapter.intercept.core import InterceptCore

T = TypeVar("T")


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def from_dict(cls: type[T], d: Any) -> T:
    """Rebuild a (nested) report dataclass from `to_dict`'s output; unknown keys are ignored."""
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in d:
            kw[f.name] = _load(hints[f.name], d[f.name])
    return cls(**kw)


def _load(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _load(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        return [_load(args[0], v) for v in value]
    if origin is dict:
        return {k: _load(args[1], v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class BlockReport:
    total: int
    free: int
    running: int
    preserved: int
    swapped_to_host: int = 0  # blocks' worth of paused KV in the host buffer (not device blocks)


@dataclass(frozen=True)
class WasteKind:
    token_s: float
    gb_min: float


@dataclass(frozen=True)
class WasteReport:
    kv_bytes_per_token: int
    by_kind: dict[str, WasteKind]
    forward_s: float
    recompute_forward_s: float
    recompute_share_of_forward: float
    swap_stall_s: float
    iterations: int
    swap_stall_measured_steps: int = 0  # steps whose stall the workers measured (the rest: estimated)
    scheduled_tokens: int = 0  # tokens the iterations scheduled


@dataclass(frozen=True)
class SwapReport:
    tokens_out: int
    tokens_in: int
    blocks_out: int
    blocks_in: int
    fallbacks: int
    host_slots: int
    host_slots_free: int
    host_tokens: int  # tokens of paused KV held in the host buffer
    loading_blocks: int
    kv_bytes_per_token: int
    # Of blocks_out, those released in the step that copied them and reused by other requests in it.
    blocks_out_first: int = 0
    recent_budgets: list[dict[str, int]] = field(default_factory=list)  # {"limit", "out", "in"} per step
    moved: list[dict[str, int]] = field(default_factory=list)  # {"out", "in"} tokens per step
    # The share of a step copies hide behind, as learned from the workers' forward windows (1.0 until
    # measured): it scales the swap budget N_i.
    overlap: float = 1.0


@dataclass(frozen=True)
class HostTierReport:
    """What vLLM's host KV tier did (policies `vllm-offload`, `infercept-offload`; `offload_connector.py`)."""

    host_blocks: int  # the host buffer, in whole KV blocks
    blocks_stored: int  # blocks copied to the host
    loads: int  # prefix hits served from the host
    tokens_loaded: int  # tokens those loads brought back to the device
    eviction: str = "lru"  # the host buffer's eviction policy (`policy.table.HOST_TIER_EVICTIONS`)


@dataclass(frozen=True)
class ProfileReport:
    source: str
    device: str
    saturation_tokens: int
    kv_bytes_per_token: int
    t_fwd_refinement: dict[str, float]  # observed / predicted iteration time per grid point


# The parts of an engine step besides the forward pass (whose time is `WasteReport.forward_s`), summed over
# the steps that scheduled tokens: `ours`, the core's work before and after vLLM's `schedule()` and
# `update_from_output()` (the budget, demotions, admission metering, pause records); those two calls
# themselves (`vllm_schedule`, `vllm_update`: they include our hooks that vLLM calls from inside them, the
# connectors' metadata and lookups, the trigger matcher, pausing and closing); `between`, from one step's
# output handled to the next step's scheduling while vLLM had requests (its loop does not block then): its
# inputs (new requests, resumed turns: `_update_request_as_session`) and handing outputs to its output
# thread. `empty`: the whole schedule and update calls of steps that scheduled nothing.
STEP_PARTS = ("ours", "vllm_schedule", "vllm_update", "between", "empty")


@dataclass(frozen=True)
class EngineStats:
    policy: str
    block_size: int
    blocks: BlockReport
    totals: Totals
    paused: int  # paused requests (any KV state)
    paused_preserved: int  # of those, KV on the device
    running: int
    waiting: int  # waiting requests that are not paused sessions
    engine_time_s: float
    steps: int  # steps the scheduler built, empty ones included
    token_budget: int  # the engine's per-iteration token budget (max_num_batched_tokens)
    waste: WasteReport
    profile: ProfileReport
    swap: SwapReport | None = None
    host_tier: HostTierReport | None = None
    admission: AdmissionReport | None = None  # where a scheduler feeds the meter (vLLM's, the simulator's)
    # Seconds of engine steps outside the forward pass, by part (`STEP_PARTS`); vLLM's scheduler only.
    step_parts_s: dict[str, float] | None = None


@dataclass(frozen=True)
class AdmissionReport:
    """New requests' waits for their first schedule: request-seconds by reason (`meter.WAIT_REASONS`), and
    how many were admitted."""

    wait_s: dict[str, float]
    admitted: int


@dataclass(frozen=True)
class Integrity:
    """Block counts after a successful integrity check (it raises when broken)."""

    total: int
    free: int
    running: int
    preserved: int
    host_tokens: int = 0


# ---------------------------------------------------------------------- built from the core's state
def engine_stats(core: InterceptCore, counts: BlockCounts, *, running: int, waiting: int, now: float,
                 token_budget: int, host_tier: HostTierReport | None = None) -> EngineStats:
    totals = core.ledger.totals_at(now)
    paused = [e for e in core.entries.values() if e.state.paused]
    swapped = sum(len(e.host.slots) for e in paused if e.host and e.state is KvState.SWAPPED)
    prof = core.profile
    return EngineStats(
        policy=core.spec.name, block_size=core.block_size,
        blocks=BlockReport(**counts.to_dict(), swapped_to_host=swapped), totals=totals,
        paused=len(paused), paused_preserved=sum(e.state.on_device for e in paused), running=running,
        waiting=waiting - len(paused), engine_time_s=now, steps=core.steps, token_budget=token_budget,
        waste=core.meter.report(totals.preserved_token_seconds),
        profile=ProfileReport(prof.source, prof.device, prof.saturation_tokens, prof.kv_bytes_per_token,
                              {str(k): v for k, v in prof.refinement().items()}),
        swap=swap_report(core), host_tier=host_tier,
        admission=AdmissionReport(dict(core.admission.wait_s), core.admission.admitted) if core.admission.fed else None,
        step_parts_s=dict(core.step_parts_s) if core.step_parts_s is not None else None,
    )


def check_integrity(core: InterceptCore, counts: BlockCounts) -> Integrity:
    """Device blocks add up, and the host buffer holds exactly what the entries own; raises if not."""
    counts.check()
    host_tokens = 0
    if core.swap is not None:
        owned = sum(len(e.host.slots) for e in core.entries.values() if e.host is not None)
        used = core.swap.slots.num_slots - core.swap.slots.num_free
        if used != owned:
            raise AssertionError(f"swap integrity: {used} host slots in use, entries own {owned}")
        host_tokens = sum(e.host.tokens for e in core.entries.values() if e.host is not None)
    return Integrity(**counts.to_dict(), host_tokens=host_tokens)


def swap_report(core: InterceptCore) -> SwapReport | None:
    sw = core.swap
    if sw is None:
        return None
    recent = list(sw.history)[-256:]
    hosted = [e for e in core.entries.values() if e.host is not None]
    return SwapReport(
        tokens_out=sw.stats.tokens_out, tokens_in=sw.stats.tokens_in, blocks_out=sw.stats.blocks_out,
        blocks_in=sw.stats.blocks_in, fallbacks=core.ledger.totals.swap_fallbacks,
        host_slots=sw.slots.num_slots, host_slots_free=sw.slots.num_free,
        host_tokens=sum(e.host.tokens for e in hosted if e.state is KvState.SWAPPED),  # type: ignore[union-attr]
        loading_blocks=sum(len(e.host.to_load or ()) for e in hosted),  # type: ignore[union-attr]
        kv_bytes_per_token=core.profile.kv_bytes_per_token, blocks_out_first=sw.stats.blocks_out_first,
        recent_budgets=[{"limit": s.limit, "out": s.out_budget, "in": s.in_budget} for s in recent],
        moved=[{"out": s.out_moved, "in": s.in_moved} for s in recent],
        overlap=sw.overlap,
    )
