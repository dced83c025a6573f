"""The scheduler's record of one paused request."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.v1.request import Request

from engine_adapter.policy import PausedView


@dataclass
class Paused:
    """A request parked at an intercept (status WAITING_FOR_STREAMING_REQ)."""

    request: Request
    session_id: str
    aug_type: str
    trigger: str | None
    paused_at_s: float
    expected_duration_s: float | None
    arrival_time: float  # the original one, restored at resume under FCFS-keeping policies
    preserved: bool = True  # its KV blocks are still allocated
    holds_slot: bool = True  # counted in num_waiting_for_streaming_input
    swap: str | None = None  # None | "out" (copying) | "out-done" (copied, freed next step) | "swapped"

    def view(self) -> PausedView:
        return PausedView(
            request_id=self.request.request_id,
            aug_type=self.aug_type,
            context_tokens=self.request.num_computed_tokens,
            paused_at_s=self.paused_at_s,
            expected_duration_s=self.expected_duration_s,
            preserved=self.preserved,
        )
