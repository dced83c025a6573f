"""Measured memory waste by kind, from the iterations the engine really runs.

Kinds, in token-seconds (x M bytes = byte-seconds; / 1e9 / 60 = GB-min):
* preserved idle: paused contexts held on the device (from the ledger's spans);
* recompute: every iteration's share spent recomputing freed context, times all the KV resident
  meanwhile (the measured counterpart of Eq. 1 / Eq. 4);
* swap stall: the time swap copies add to an iteration (copy time not hidden behind the forward
  pass: measured by the workers where copies are synchronous, else estimated from the profile's
  bandwidth), times the resident KV.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from engine_adapter.intercept.reports import WasteKind, WasteReport


@dataclass
class WasteMeter:
    kv_bytes_per_token: int
    forward_s: float = 0.0
    recompute_forward_s: float = 0.0
    recompute_token_s: float = 0.0
    swap_stall_s: float = 0.0
    swap_stall_token_s: float = 0.0
    iterations: int = 0
    scheduled_tokens: int = 0  # over the iterations: with `iterations` and `forward_s`, a step's mean size and time
    swap_stall_measured_steps: int = 0
    # Context tokens each resumed request still has to recompute (consumed as they are scheduled).
    recomputing: dict[str, int] = field(default_factory=dict)

    def start_recompute(self, request_id: str, tokens: int) -> None:
        if tokens > 0:
            self.recomputing[request_id] = tokens

    def forget(self, request_id: str) -> None:
        self.recomputing.pop(request_id, None)

    def iteration(self, seconds: float, scheduled: Mapping[str, int], resident_tokens: int,
                  swap_stall_s: float = 0.0, stall_measured: bool = False) -> None:
        """One iteration: its wall time, tokens scheduled per request, KV resident meanwhile, and what
        swap copies added to it (`stall_measured`: by the workers, not estimated)."""
        total = sum(scheduled.values())
        recompute = 0
        for rid, n in scheduled.items():
            left = self.recomputing.get(rid)
            if left:
                take = min(n, left)
                recompute += take
                if left > take:
                    self.recomputing[rid] = left - take
                else:
                    del self.recomputing[rid]
        if seconds <= 0 or total <= 0:
            return
        self.iterations += 1
        self.scheduled_tokens += total
        self.swap_stall_measured_steps += stall_measured
        self.forward_s += seconds
        share = seconds * min(recompute, total) / total
        self.recompute_forward_s += share
        self.recompute_token_s += share * resident_tokens
        stall = min(max(0.0, swap_stall_s), seconds)
        self.swap_stall_s += stall
        self.swap_stall_token_s += stall * resident_tokens

    def gb_min(self, token_s: float) -> float:
        return token_s * self.kv_bytes_per_token / 1e9 / 60

    def report(self, preserved_token_s: float) -> WasteReport:
        kinds = {
            "preserved_idle": preserved_token_s,
            "recompute": self.recompute_token_s,
            "swap_stall": self.swap_stall_token_s,
        }
        return WasteReport(
            kv_bytes_per_token=self.kv_bytes_per_token,
            by_kind={k: WasteKind(token_s=v, gb_min=self.gb_min(v)) for k, v in kinds.items()},
            forward_s=self.forward_s,
            recompute_forward_s=self.recompute_forward_s,
            recompute_share_of_forward=self.recompute_forward_s / self.forward_s if self.forward_s else 0.0,
            swap_stall_s=self.swap_stall_s,
            iterations=self.iterations,
            scheduled_tokens=self.scheduled_tokens,
            swap_stall_measured_steps=self.swap_stall_measured_steps,
        )


# Why new requests wait for their first schedule, per step of the scheduler (`InterceptScheduler`):
WAIT_REASONS = (
    "slots",  # every running slot (max_num_seqs) is taken
    "budget",  # the step's token budget is used up
    "blocks",  # a new request heads the queue and its KV blocks cannot be had (or vLLM preempted this step)
    "behind_resumed",  # a resumed (or preempted) request heads the queue and cannot be scheduled: FCFS holds the rest
)


@dataclass
class AdmissionMeter:
    """Request-seconds that new requests spent waiting for their first schedule, by reason (`WAIT_REASONS`):
    each interval between two schedules is charged, for each new request left waiting by the first, to the
    reason that step left them waiting for. Divided by the requests admitted, a mean wait per new request."""

    wait_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WAIT_REASONS, 0.0))
    admitted: int = 0  # new requests scheduled for the first time
    fed: bool = False  # an engine's scheduler feeds it (vLLM's, or the simulator's)
    _mark: tuple[float, int, str] | None = None  # (when, new requests left waiting, why) at the last schedule

    def schedule(self, now: float, scheduled: Iterable[str], waiting: Iterable[str], seen: set[str], *,
                 slots_full: bool, budget_full: bool, stop: Callable[[], str | None]) -> tuple[int, str | None, int]:
        """One schedule as vLLM's waiting scan left it (the engine's scheduler and the simulator's call this):
        `scheduled`, the requests it took from the waiting queue; `waiting`, those still waiting; `seen`, those
        scheduled at least once before (the others are new; updated here); `stop`, the waiting request the
        scan stopped at, asked only when neither the slots nor the budget explain the wait. Returns (new
        requests left waiting, why, new requests scheduled for the first time)."""
        admitted = 0
        for rid in scheduled:
            if rid not in seen:
                seen.add(rid)
                admitted += 1
        waiting_new = sum(1 for rid in waiting if rid not in seen)
        reason = None
        if waiting_new:
            if slots_full:
                reason = "slots"
            elif budget_full:
                reason = "budget"
            else:
                head = stop()
                reason = "behind_resumed" if head is not None and head in seen else "blocks"
        self.step(now, waiting_new, reason, admitted)
        return waiting_new, reason, admitted

    def step(self, now: float, waiting_new: int, reason: str | None, admitted: int) -> None:
        """One schedule: `admitted` new requests got their first tokens scheduled, `waiting_new` are left
        waiting for `reason` (None when none are). A request is charged from the first schedule that finds
        it waiting (not from its arrival: at most one step less)."""
        self.fed = True
        if self._mark is not None:
            t, n, why = self._mark
            self.wait_s[why] += max(0.0, now - t) * n
        self.admitted += admitted
        self._mark = (now, waiting_new, reason) if waiting_new and reason is not None else None
