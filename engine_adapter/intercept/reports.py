"""The engine's reports as dataclasses: built in the engine core, sent to the front end as plain dicts
(`to_dict`), read back as the same dataclasses (`from_dict`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine_adapter.intercept.records import Totals

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
    recent_budgets: list[dict[str, int]] = field(default_factory=list)  # {"limit", "out", "in"} per step
    moved: list[dict[str, int]] = field(default_factory=list)  # {"out", "in"} tokens per step


@dataclass(frozen=True)
class ProfileReport:
    source: str
    device: str
    saturation_tokens: int
    kv_bytes_per_token: int
    t_fwd_refinement: dict[str, float]  # observed / predicted iteration time per grid point


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
    waste: WasteReport
    profile: ProfileReport
    swap: SwapReport | None = None


@dataclass(frozen=True)
class Integrity:
    """Block counts after a successful integrity check (it raises when broken)."""

    total: int
    free: int
    running: int
    preserved: int
    host_tokens: int = 0
