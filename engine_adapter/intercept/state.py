"""The intercept core's state: where a paused request's KV lives, and what the core asks of the KV pool.

A request has an entry from the moment it pauses until its context is back on the device (or it is
closed). The entry's `state` is the one place that says where its KV is:

    pause ──> PRESERVED ─────────────────────────resume──> (gone: KEEP)
      │          │ policy: swap          │ policy/pressure: free
      │          v                       v
      ├──> SWAPPING_OUT ──copied──> SWAPPED ─resume─> LOAD_QUEUED ─armed─> LOAD_ARMED
      │          │ resume: cancel, KEEP                     ─allocated─> LOADING ─last chunk─> LOADED
      │          │ pressure/full host: free                 ─first schedule─> (gone)
      └──> DISCARDED ──resume──> RECOMPUTE_QUEUED ──first schedule──> (gone)

    prefetch (`infercept-prefetch`), before the resume, the host copy kept throughout:
    SWAPPED ─prefetch─> PREFETCHING ─last chunk─> PREFETCHED ─resume─> (gone: KEEP)
                          │ resume: LOADING (LOAD_IN_PLACE)  │
                          └── overrun/pressure: blocks freed ┴──> SWAPPED
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from engine_adapter.intercept.records import InterceptRecord
from engine_adapter.intercept.swap import HostCopy


class KvState(str, Enum):
    PRESERVED = "preserved"  # paused; KV on the device
    SWAPPING_OUT = "swapping-out"  # paused; KV on the device, being copied to the host
    SWAPPED = "swapped"  # paused; KV on the host only
    DISCARDED = "discarded"  # paused; KV nowhere
    LOAD_QUEUED = "load-queued"  # resumed; KV on the host, waiting for the swap-in budget
    LOAD_ARMED = "load-armed"  # resumed; the KV lookup answers with the host copy
    LOADING = "loading"  # resumed; device blocks allocated, chunks copying in
    LOADED = "loaded"  # resumed; every chunk shipped, host slots free at the next step
    RECOMPUTE_QUEUED = "recompute-queued"  # resumed; KV nowhere, waits for its first schedule
    PREFETCHING = "prefetching"  # paused; device blocks held again, host copy coming back ahead of the resume
    PREFETCHED = "prefetched"  # paused; KV on the device and (still) on the host

    @property
    def paused(self) -> bool:
        return self in (KvState.PRESERVED, KvState.SWAPPING_OUT, KvState.SWAPPED, KvState.DISCARDED,
                        KvState.PREFETCHING, KvState.PREFETCHED)

    @property
    def on_device(self) -> bool:
        """Paused with its device blocks (and its running slot) held."""
        return self in (KvState.PRESERVED, KvState.SWAPPING_OUT, KvState.PREFETCHING, KvState.PREFETCHED)


class ResumeKind(str, Enum):
    KEEP = "keep"  # the KV is on the device: schedule the new tokens only
    LOAD = "load"  # the KV comes back from the host (through the KV connector)
    RECOMPUTE = "recompute"  # the KV is gone: recompute the context (prefix-cache hits aside)
    # The KV is being copied back into the blocks the request holds (a prefetch the resume overtook): it
    # waits as an asynchronous KV load does, until the core reports the copy done (`StepCopies.loads_done`).
    LOAD_IN_PLACE = "load-in-place"


@dataclass(frozen=True)
class Resume:
    kind: ResumeKind
    arrival_time: float  # the queue position to resume with


@dataclass
class Entry:
    """One paused (or resuming) request: where its KV is, and its intercept record (which holds what is
    known about the pause: type, expected duration, context, times)."""

    request_id: str
    record: InterceptRecord
    state: KvState
    seq: int  # first come, first served: pauses, swap starts and resumes in this order
    host: HostCopy | None = None
    fetched_at_s: float | None = None  # a prefetch's start: its device blocks are held (idle) from then
    load_hit_tokens: int = 0  # of a swap-in, the tokens vLLM's prefix cache already held (not copied)

    @property
    def session_id(self) -> str:
        return self.record.session_id

    @property
    def aug_type(self) -> str:
        return self.record.aug_type

    @property
    def expected_duration_s(self) -> float | None:
        return self.record.expected_duration_s

    @property
    def ttl_s(self) -> float | None:
        return self.record.ttl_s

    @property
    def paused_at_s(self) -> float:
        return self.record.paused_at_s

    @property
    def context_tokens(self) -> int:
        return self.record.context_tokens

    @property
    def load_blocks(self) -> int:
        """Device blocks its swap-in will allocate at once (0 unless waiting to be loaded)."""
        waiting = self.state in (KvState.LOAD_QUEUED, KvState.LOAD_ARMED)
        return len(self.host.slots) if waiting and self.host is not None else 0

    @property
    def arrival_time(self) -> float:
        """The original one (restored at the resume under FCFS-keeping policies)."""
        assert self.record.arrival_time is not None
        return self.record.arrival_time


@dataclass(frozen=True)
class PauseInfo:
    request_id: str
    session_id: str
    aug_type: str
    expected_duration_s: float | None
    tool: str | None
    trigger: str | None
    context_tokens: int
    arrival_time: float


@dataclass(frozen=True)
class StepView:
    """What the core needs to know about the step vLLM is about to build."""

    blocks_needed: int  # new blocks the running requests and the first ready waiting one need
    head_waiting: str | None  # that waiting request
    # Of `blocks_needed`, the head's: for its whole sequence, since vLLM admits a waiting request only
    # when all of it fits (a swap-in head needs its whole context at once anyway).
    head_blocks: int = 0
    running_requests: int = 0
    running_tokens: int = 0  # context tokens of the running batch
    # New blocks the running requests and that waiting one need to finish the prompt or recompute
    # they are in (not capped by this step's token budget): the room a swap under pressure makes ahead.
    blocks_ahead: int = 0
    # Tokens the running requests compute this step, within the token budget: their share of the step's work
    # (vLLM may admit waiting requests too, depending on the blocks it finds free, or preempt one of these).
    step_tokens: int = 0


class KvPort(Protocol):
    """What the intercept core asks of the engine's KV pool (vLLM's scheduler, or the simulator)."""

    def release(self, request_id: str) -> None:
        """Free a paused request's device blocks and its running slot; it stays parked."""

    def block_ids(self, request_id: str) -> list[int]:
        """The request's device blocks, in context order."""

    def num_free_blocks(self) -> int: ...

    def reacquire(self, request_id: str, num_tokens: int) -> list[int] | None:
        """Device blocks for a paused request's whole context again (a prefetch), and its running slot
        back; None, with nothing taken, when the free blocks or the slots do not allow it. The blocks'
        contents arrive by copy: nothing may read them as computed until the core says so."""

    def in_use(self, block_ids: Iterable[int]) -> set[int]:
        """Of these device blocks, those some request holds now."""

    def slots_full(self) -> bool:
        """Every running slot is taken (running + paused holding a slot)."""

    def free_slots(self) -> int:
        """Running slots not taken (running + paused holding a slot)."""

    def kv_holding_waiting(self) -> list[str]:
        """Waiting requests that hold device blocks and could be admitted now (sessions resumed in place,
        finished swap-ins), in the order vLLM tries them."""

    def evict_waiting(self, request_id: str) -> None:
        """Free such a request's device blocks: it waits, at its arrival time's place, to be recomputed
        (prefix-cache hits aside), as a request vLLM preempted."""
