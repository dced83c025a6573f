"""Per-intercept records, running totals, and the KV block integrity check.

Pure bookkeeping (no vLLM): the scheduler reports transitions, this module keeps the numbers. Times are
engine-clock seconds (time.monotonic in the engine core).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any


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
    arrival_time: float | None = None  # the request's arrival (vLLM clock) when it paused
    requeued_arrival_time: float | None = None  # what the resume was queued with (FCFS order)
    action: str = "preserve"  # the policy's choice at the pause
    # "preserve" | "discard" | "ttl-expired" | "demoted" | "closed": what happened to the KV, last event
    kv_fate: str = "preserve"
    kv_released_at_s: float | None = None
    resumed_at_s: float | None = None
    call_duration_s: float | None = None
    tokens_kept: int = 0  # context tokens whose KV survived to the resume
    tokens_recomputed: int | None = None  # filled at the first schedule after the resume
    tokens_prefix_hit: int = 0
    tokens_swapped_in: int = 0
    restored_by: str | None = None  # "preserve" | "swap" | "recompute" | "prefix-cache" | "partial-prefix-cache"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Totals:
    intercepts: int = 0
    resumed: int = 0
    discarded_at_pause: int = 0
    ttl_expired: int = 0
    demoted: int = 0
    recomputed_tokens: int = 0
    prefix_hit_tokens: int = 0
    swapped_out: int = 0
    swapped_out_tokens: int = 0
    swapped_in_tokens: int = 0
    preserved_token_seconds: float = 0.0  # completed preserved spans only; see Ledger.snapshot


class Ledger:
    """Keeps the last `max_records` intercepts and totals over all of them."""

    def __init__(self, max_records: int = 10_000) -> None:
        self.records: deque[InterceptRecord] = deque(maxlen=max_records)
        self.open: dict[str, InterceptRecord] = {}  # request_id -> its current intercept
        self.totals = Totals()
        self._next_id = 1

    def pause(self, **fields: Any) -> InterceptRecord:
        rec = InterceptRecord(intercept_id=self._next_id, **fields)
        self._next_id += 1
        self.records.append(rec)
        self.open[rec.request_id] = rec
        self.totals.intercepts += 1
        return rec

    def release_kv(self, request_id: str, fate: str, now_s: float, moved_tokens: int = 0) -> None:
        """The paused request's KV left the cache (discard, TTL, demotion, close; or swap, with
        `moved_tokens` of it now in the host buffer)."""
        rec = self.open.get(request_id)
        if rec is None or rec.kv_released_at_s is not None:
            return
        rec.kv_fate = fate
        rec.kv_released_at_s = now_s
        self.totals.preserved_token_seconds += rec.context_tokens * max(0.0, now_s - rec.paused_at_s)
        if fate == "discard":
            self.totals.discarded_at_pause += 1
        elif fate == "ttl-expired":
            self.totals.ttl_expired += 1
        elif fate == "demoted":
            self.totals.demoted += 1
        elif fate == "swap":
            self.totals.swapped_out += 1
            self.totals.swapped_out_tokens += moved_tokens

    def resume(self, request_id: str, now_s: float, requeued_arrival_time: float) -> InterceptRecord | None:
        rec = self.open.get(request_id)
        if rec is None:
            return None
        rec.resumed_at_s = now_s
        rec.requeued_arrival_time = requeued_arrival_time
        rec.call_duration_s = now_s - rec.paused_at_s
        if rec.kv_released_at_s is None:
            rec.tokens_kept = rec.context_tokens
            rec.tokens_recomputed = 0
            rec.restored_by = "preserve"
            self.totals.preserved_token_seconds += rec.context_tokens * rec.call_duration_s
            del self.open[request_id]
        self.totals.resumed += 1
        return rec

    def recomputed(self, request_id: str, prefix_hit_tokens: int) -> InterceptRecord | None:
        """First schedule after a resume whose KV had been released."""
        rec = self.open.pop(request_id, None)
        if rec is None:
            return None
        hit = min(prefix_hit_tokens, rec.context_tokens)
        rec.tokens_prefix_hit = hit
        rec.tokens_recomputed = rec.context_tokens - hit
        rec.restored_by = (
            "recompute" if hit == 0 else "prefix-cache" if hit == rec.context_tokens else "partial-prefix-cache"
        )
        self.totals.recomputed_tokens += rec.tokens_recomputed
        self.totals.prefix_hit_tokens += hit
        return rec

    def swapped_in(self, request_id: str, tokens: int) -> InterceptRecord | None:
        """First schedule after a resume whose KV came back from the host buffer."""
        rec = self.open.pop(request_id, None)
        if rec is None:
            return None
        rec.tokens_swapped_in = tokens
        rec.tokens_kept = tokens
        rec.tokens_recomputed = max(0, rec.context_tokens - tokens)
        rec.restored_by = "swap"
        self.totals.swapped_in_tokens += tokens
        self.totals.recomputed_tokens += rec.tokens_recomputed
        return rec

    def close(self, request_id: str, now_s: float) -> None:
        rec = self.open.pop(request_id, None)
        if rec is not None and rec.kv_released_at_s is None:
            rec.kv_fate = "closed"
            rec.kv_released_at_s = now_s
            self.totals.preserved_token_seconds += rec.context_tokens * max(0.0, now_s - rec.paused_at_s)

    def snapshot(self, now_s: float) -> dict[str, Any]:
        totals = asdict(self.totals)
        # Include spans still open, so the number grows while requests sit preserved.
        totals["preserved_token_seconds"] += sum(
            r.context_tokens * max(0.0, now_s - r.paused_at_s)
            for r in self.open.values()
            if r.kv_released_at_s is None and r.resumed_at_s is None
        )
        return totals


@dataclass(frozen=True)
class BlockCounts:
    total: int
    free: int
    running: int  # held by requests that are not paused (running, or queued with KV)
    preserved: int  # held only by paused requests

    def check(self) -> None:
        if self.free + self.running + self.preserved != self.total:
            raise AssertionError(
                f"KV block integrity: free {self.free} + running {self.running} + preserved "
                f"{self.preserved} != total {self.total}"
            )

    def to_dict(self) -> dict[str, int]:
        return {"total": self.total, "free": self.free, "running": self.running, "preserved": self.preserved}


@dataclass
class WasteMeter:
    """Measured memory waste by kind, in token-seconds (x M bytes = byte-seconds; / 1e9 / 60 = GB-min).

    * preserved idle: paused contexts held in the cache (from the Ledger's spans);
    * recompute: every iteration's share spent recomputing discarded context, times all the KV that
      sat resident meanwhile (the measured counterpart of Eq. 1 / Eq. 4);
    * swap stall: the time swap copies add to an iteration (the copy time not hidden behind the
      forward pass; estimated from the profile's bandwidth), times the resident KV.
    """

    kv_bytes_per_token: int
    forward_s: float = 0.0
    recompute_forward_s: float = 0.0
    recompute_token_s: float = 0.0
    swap_stall_s: float = 0.0
    swap_stall_token_s: float = 0.0
    iterations: int = 0

    def iteration(self, seconds: float, scheduled_tokens: int, recompute_tokens: int, resident_tokens: int,
                  swap_stall_s: float = 0.0) -> None:
        if seconds <= 0 or scheduled_tokens <= 0:
            return
        self.iterations += 1
        self.forward_s += seconds
        share = seconds * min(recompute_tokens, scheduled_tokens) / scheduled_tokens
        self.recompute_forward_s += share
        self.recompute_token_s += share * resident_tokens
        stall = min(max(0.0, swap_stall_s), seconds)
        self.swap_stall_s += stall
        self.swap_stall_token_s += stall * resident_tokens

    def gb_min(self, token_s: float) -> float:
        return token_s * self.kv_bytes_per_token / 1e9 / 60

    def snapshot(self, preserved_token_s: float) -> dict[str, Any]:
        kinds = {
            "preserved_idle": preserved_token_s,
            "recompute": self.recompute_token_s,
            "swap_stall": self.swap_stall_token_s,
        }
        return {
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "by_kind": {k: {"token_s": v, "gb_min": self.gb_min(v)} for k, v in kinds.items()},
            "forward_s": self.forward_s,
            "recompute_forward_s": self.recompute_forward_s,
            "recompute_share_of_forward": self.recompute_forward_s / self.forward_s if self.forward_s else 0.0,
            "swap_stall_s": self.swap_stall_s,
            "iterations": self.iterations,
        }
