"""What the intercept core reports: one record per intercept, running totals, KV block counts.

Pure data (no vLLM): these dataclasses travel from the engine core to the front end as plain dicts
(`to_dict` / `from_dict`), so the facade, the gateway and the benchmark read typed fields. Times are
engine-clock seconds (time.monotonic in the engine core).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

# In a vLLM output's `kv_transfer_params`: the intercept records the front end has yet to see.
RECORDS_KEY = "infercept"


class Fate(str, Enum):
    """What happened to a pause's KV (the last thing that happened to it)."""

    PRESERVE = "preserve"  # kept on the device through the call
    DISCARD = "discard"  # freed by the policy (at the pause or by a per-iteration decision)
    TTL_EXPIRED = "ttl-expired"
    DEMOTED = "demoted"  # freed because running work needed the room
    SWAP = "swap"  # copied to the host buffer, device copy freed
    CLOSED = "closed"  # the session ended while paused


class RestoredBy(str, Enum):
    PRESERVE = "preserve"
    SWAP = "swap"
    RECOMPUTE = "recompute"
    PREFIX_CACHE = "prefix-cache"
    PARTIAL_PREFIX_CACHE = "partial-prefix-cache"


@dataclass
class InterceptRecord:
    intercept_id: int
    session_id: str
    request_id: str
    aug_type: str
    trigger: str | None  # trigger name; None for a plain end of turn (EOS / max_tokens)
    tool: str | None
    policy: str
    context_tokens: int  # tokens in the KV context when the request paused
    paused_at_s: float
    expected_duration_s: float | None = None
    ttl_s: float | None = None  # ttl policies: how long the KV is kept at most (set at the pause)
    arrival_time: float | None = None  # the request's arrival (vLLM clock) when it paused
    requeued_arrival_time: float | None = None  # what the resume was queued with (FCFS order)
    action: str = "preserve"  # the policy's choice at the pause (policy.table.Action value)
    kv_fate: Fate = Fate.PRESERVE
    kv_released_at_s: float | None = None
    resumed_at_s: float | None = None
    call_duration_s: float | None = None
    tokens_kept: int = 0  # context tokens whose KV survived to the resume (on the device or the host)
    tokens_recomputed: int | None = None  # known at the first schedule after the resume
    tokens_prefix_hit: int = 0
    tokens_swapped_in: int = 0
    restored_by: RestoredBy | None = None

    @property
    def complete(self) -> bool:
        """The resume's outcome is known (how the context came back)."""
        return self.restored_by is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv_fate"] = self.kv_fate.value
        d["restored_by"] = self.restored_by.value if self.restored_by is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InterceptRecord:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["kv_fate"] = Fate(kw.get("kv_fate", Fate.PRESERVE))
        kw["restored_by"] = RestoredBy(kw["restored_by"]) if kw.get("restored_by") else None
        return cls(**kw)


@dataclass
class Totals:
    intercepts: int = 0
    resumed: int = 0
    discarded: int = 0  # freed by the policy (at the pause or per iteration)
    ttl_expired: int = 0
    demoted: int = 0
    recomputed_tokens: int = 0
    prefix_hit_tokens: int = 0
    swapped_out: int = 0
    swapped_out_tokens: int = 0
    swapped_in_tokens: int = 0
    swap_fallbacks: int = 0  # a swap the host buffer could not take: discarded instead
    pressure_swaps: int = 0  # copies of preserved KV to the host started to make room, instead of a demotion
    # Resumed requests whose KV was freed while they waited, because nothing ran and the head of the
    # queue could not be admitted (`InterceptCore.unblock`): recomputed instead of a deadlock.
    waiting_evictions: int = 0
    # Prefetch (`infercept-prefetch`): swapped contexts copied back ahead of their return; resumes that found
    # theirs back (hits) or still coming (late); fetched-back contexts given up (call overran, memory short).
    prefetches: int = 0
    prefetch_hits: int = 0
    prefetch_late: int = 0
    prefetch_dropped: int = 0
    preserved_token_seconds: float = 0.0  # closed spans only; `Ledger.totals_at` adds the open ones
    # Per augmentation type: where the memory-time goes (intercepts, preserved token-seconds of closed
    # spans, tokens recomputed, tokens swapped out, KV freed by the policy or under pressure).
    by_type: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Totals:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def add(self, aug_type: str, key: str, amount: float) -> None:
        t = self.by_type.setdefault(aug_type, {"intercepts": 0, "preserved_token_seconds": 0.0, "recomputed_tokens": 0,
                                               "swapped_out_tokens": 0, "freed": 0})
        t[key] += amount


_FATE_TOTAL = {Fate.DISCARD: "discarded", Fate.TTL_EXPIRED: "ttl_expired", Fate.DEMOTED: "demoted", Fate.SWAP: "swapped_out"}


class Ledger:
    """The last `max_records` intercept records and totals over all of them. The intercept core calls
    one method per event; a record is `open` from its pause until its resume's outcome is known."""

    def __init__(self, max_records: int = 10_000) -> None:
        self.records: deque[InterceptRecord] = deque(maxlen=max_records)
        self.open: dict[str, InterceptRecord] = {}  # request_id -> its current intercept
        self.totals = Totals()
        self._next_id = 1

    def pause(self, **fields_: Any) -> InterceptRecord:
        rec = InterceptRecord(intercept_id=self._next_id, **fields_)
        self._next_id += 1
        self.records.append(rec)
        self.open[rec.request_id] = rec
        self.totals.intercepts += 1
        self.totals.add(rec.aug_type, "intercepts", 1)
        return rec

    def _span(self, rec: InterceptRecord, seconds: float) -> None:
        """A preserved span closed: its token-seconds, in the totals and its type's."""
        ts = rec.context_tokens * max(0.0, seconds)
        self.totals.preserved_token_seconds += ts
        self.totals.add(rec.aug_type, "preserved_token_seconds", ts)

    def release_kv(self, rec: InterceptRecord, fate: Fate, now_s: float, moved_tokens: int = 0) -> None:
        """The paused request's KV left the device (with `moved_tokens` of it now on the host for
        a swap)."""
        if rec.kv_released_at_s is not None:
            return
        rec.kv_fate = fate
        rec.kv_released_at_s = now_s
        self._span(rec, now_s - rec.paused_at_s)
        if fate in _FATE_TOTAL:
            setattr(self.totals, _FATE_TOTAL[fate], getattr(self.totals, _FATE_TOTAL[fate]) + 1)
        if fate is Fate.SWAP:
            self.totals.swapped_out_tokens += moved_tokens
            self.totals.add(rec.aug_type, "swapped_out_tokens", moved_tokens)
        elif fate is not Fate.CLOSED:
            self.totals.add(rec.aug_type, "freed", 1)

    def held_again(self, rec: InterceptRecord, seconds: float) -> None:
        """A prefetch held the context's device blocks idle this long before the resume (or until it was
        given up): memory-time held, counted with the preserved spans."""
        self._span(rec, seconds)

    def resume(self, rec: InterceptRecord, now_s: float, requeued_arrival_time: float) -> None:
        rec.resumed_at_s = now_s
        rec.requeued_arrival_time = requeued_arrival_time
        rec.call_duration_s = now_s - rec.paused_at_s
        self.totals.resumed += 1
        if rec.kv_released_at_s is None:  # the KV is still on the device: restored already
            rec.tokens_kept = rec.context_tokens
            rec.tokens_recomputed = 0
            rec.restored_by = RestoredBy.PRESERVE
            self._span(rec, rec.call_duration_s)
            self.open.pop(rec.request_id, None)

    def recomputed(self, rec: InterceptRecord, prefix_hit_tokens: int) -> None:
        """First schedule after a resume whose KV had been freed."""
        hit = min(prefix_hit_tokens, rec.context_tokens)
        rec.tokens_prefix_hit = hit
        rec.tokens_recomputed = rec.context_tokens - hit
        rec.restored_by = (
            RestoredBy.RECOMPUTE if hit == 0 else RestoredBy.PREFIX_CACHE if hit == rec.context_tokens
            else RestoredBy.PARTIAL_PREFIX_CACHE
        )
        self.totals.recomputed_tokens += rec.tokens_recomputed
        self.totals.add(rec.aug_type, "recomputed_tokens", rec.tokens_recomputed)
        self.totals.prefix_hit_tokens += hit
        self.open.pop(rec.request_id, None)

    def swapped_in(self, rec: InterceptRecord, tokens: int, prefix_hit: int = 0) -> None:
        """First schedule after a resume whose KV came back from the host buffer (`prefix_hit` of its
        `tokens` from vLLM's prefix cache, under a policy that has it on)."""
        hit = min(prefix_hit, tokens)
        rec.tokens_swapped_in = tokens - hit
        rec.tokens_prefix_hit = hit
        rec.tokens_kept = tokens
        rec.tokens_recomputed = max(0, rec.context_tokens - tokens)
        rec.restored_by = RestoredBy.SWAP
        self.totals.swapped_in_tokens += tokens - hit
        self.totals.prefix_hit_tokens += hit
        self.totals.recomputed_tokens += rec.tokens_recomputed
        self.totals.add(rec.aug_type, "recomputed_tokens", rec.tokens_recomputed)
        self.open.pop(rec.request_id, None)

    def close(self, rec: InterceptRecord, now_s: float) -> None:
        if rec.kv_released_at_s is None and rec.resumed_at_s is None:
            rec.kv_fate = Fate.CLOSED
            rec.kv_released_at_s = now_s
            self._span(rec, now_s - rec.paused_at_s)
        self.open.pop(rec.request_id, None)

    def of_session(self, session_id: str | None = None) -> list[InterceptRecord]:
        """The records kept (the last `max_records`), or one session's."""
        return [r for r in self.records if session_id is None or r.session_id == session_id]

    def totals_at(self, now_s: float) -> Totals:
        """The totals, with the preserved spans still open counted up to `now_s` (so the number grows
        while requests sit preserved)."""
        t = Totals(**{k: v for k, v in asdict(self.totals).items() if k != "by_type"},
                   by_type={k: dict(v) for k, v in self.totals.by_type.items()})
        t.preserved_token_seconds += sum(
            r.context_tokens * max(0.0, now_s - r.paused_at_s)
            for r in self.open.values()
            if r.kv_released_at_s is None and r.resumed_at_s is None
        )
        return t


@dataclass(frozen=True)
class BlockCounts:
    """Device KV blocks by what holds them."""

    total: int
    free: int
    running: int  # held by requests that are not paused (running, queued with KV, loading)
    preserved: int  # held only by paused requests

    def check(self) -> None:
        if self.free + self.running + self.preserved != self.total:
            raise AssertionError(
                f"KV block integrity: free {self.free} + running {self.running} + preserved "
                f"{self.preserved} != total {self.total}"
            )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)
