"""vLLM V1's step order, as the intercept core needs it: what the next step runs, which waiting request is
next in line, and the KV blocks they need (`StepView`, the input of every demotion decision). Pure
bookkeeping with two callers: the engine's vLLM port (`engine_adapter/vllm_port.py`, over vLLM's own
queues) and the simulator (`benchmarks/sim/scheduler.py`, over its own), so the rule cannot drift
between them.

The rule is vLLM 0.32's `Scheduler.schedule` (`vllm/v1/core/sched/scheduler.py`) and
`KVCacheManager.allocate_slots` (`vllm/v1/core/kv_cache_manager.py`):

1. Running requests, in queue order. Each asks for `num_tokens_with_spec + num_output_placeholders -
   num_computed_tokens` tokens (its draft tokens, and under async scheduling the outputs still in
   flight), at most what the step's token budget has left, and never past `max_model_len -
   num_computed_tokens - 1` (a position stays free for the token it samples). Its new blocks cover
   its computed tokens, the new ones and `num_lookahead_tokens` (the drafter's slots), capped at
   `max_model_len`. A request that gets no token this step allocates nothing.
2. Then, while budget is left, the first request vLLM could admit: its KV-holding queue first (resumed
   sessions, finished KV loads), then its waiting queue, skipping requests not ready yet (the callers
   leave those out). It asks for `num_tokens - num_computed_tokens` tokens within the budget, and with
   `scheduler_reserve_full_isl` (vLLM's default, and the engine's) it is admitted only when its whole
   sequence (`min(num_tokens, max_model_len)`) fits in the free blocks, not just this step's chunk.

Not modelled (off in the engine's configuration): `long_prefill_token_threshold`, the admission
watermark, encoder inputs, Mamba alignment. The head's prefix-cache hits are not looked up (its need is
counted as if nothing hit: an upper bound).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from engine_adapter.intercept.state import StepView

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One request as the step order sees it."""

    request_id: str
    num_computed_tokens: int
    # The tokens it computes up to: vLLM's `num_tokens_with_spec + num_output_placeholders` for a
    # running request, `num_tokens` for a waiting one.
    num_tokens: int
    num_blocks: int  # device blocks it holds now


@dataclass(frozen=True)
class StepLimits:
    token_budget: int  # vLLM's `max_num_scheduled_tokens` for this step
    block_size: int
    max_model_len: int
    reserve_full_isl: bool = True  # vLLM's `scheduler_reserve_full_isl`
    lookahead_tokens: int = 0  # vLLM's `num_lookahead_tokens` (speculative decoding's drafter slots)


@dataclass(frozen=True)
class Admission:
    """What admitting a waiting request takes (`allocate_slots` with `full_sequence_must_fit`)."""

    full_blocks: int  # new blocks its whole sequence needs (0: `reserve_full_isl` off)
    chunk_blocks: int  # new blocks this step's chunk allocates (prefix-cache hits among them)

    @property
    def blocks(self) -> int:
        """Free blocks it needs to be admitted."""
        return max(self.full_blocks, self.chunk_blocks)

    def fits(self, free_blocks: int, reserved_blocks: int = 0) -> bool:
        """vLLM's two checks: the whole sequence against the free blocks, the chunk against what other
        in-flight prefills leave of them (`reserved_blocks`, asked of asynchronous KV loads only)."""
        return self.full_blocks <= free_blocks and self.chunk_blocks <= free_blocks - reserved_blocks


class Arrived(Protocol):
    @property
    def arrival_time(self) -> float: ...


def _blocks(tokens: int, num_blocks: int, limits: StepLimits) -> int:
    return max(0, -(-min(tokens, limits.max_model_len) // limits.block_size) - num_blocks)


def new_blocks(num_computed_tokens: int, num_new_tokens: int, num_blocks: int, limits: StepLimits) -> int:
    """Blocks a running request holding `num_blocks` allocates to compute `num_new_tokens` more (none for
    none: vLLM skips a request it schedules no token for)."""
    if num_new_tokens <= 0:
        return 0
    return _blocks(num_computed_tokens + num_new_tokens + limits.lookahead_tokens, num_blocks, limits)


def admission(num_computed_tokens: int, num_tokens: int, num_new_tokens: int, num_blocks: int,
              limits: StepLimits) -> Admission:
    """What admitting a waiting request takes. `num_computed_tokens`: what it will have computed once
    admitted (prefix-cache hits and KV loaded by the connector included); `num_new_tokens`: what it computes
    this step (0 for an asynchronous KV load, which gets no lookahead slots either); `num_blocks`: blocks it
    holds already (a session resumed in place). Prefix-cache hits are free blocks it takes, so they count as
    new ones."""
    full = _blocks(num_tokens, num_blocks, limits) if limits.reserve_full_isl else 0
    lookahead = limits.lookahead_tokens if num_new_tokens > 0 else 0
    return Admission(full, _blocks(num_computed_tokens + num_new_tokens + lookahead, num_blocks, limits))


def step_view(running: Iterable[StepRequest], admissible: Iterable[StepRequest], limits: StepLimits) -> StepView:
    """The step vLLM is about to build. `running`: its running requests in order; `admissible`: the
    requests it could admit, in the order it tries them (only the first is read, so a generator over long
    queues costs one request)."""
    budget = limits.token_budget
    last = limits.max_model_len - 1  # the last position a request computes before it samples
    need = ahead = running_requests = running_tokens = step_tokens = 0
    for r in running:
        todo = max(0, min(r.num_tokens, last) - r.num_computed_tokens)
        n = min(todo, budget)
        budget -= n
        step_tokens += n
        need += new_blocks(r.num_computed_tokens, n, r.num_blocks, limits)
        ahead += new_blocks(r.num_computed_tokens, todo, r.num_blocks, limits)
        running_requests += 1
        running_tokens += r.num_computed_tokens
    head = next(iter(admissible), None)
    head_blocks = 0
    if head is not None:
        todo = max(0, min(head.num_tokens, limits.max_model_len) - head.num_computed_tokens)
        ahead += new_blocks(head.num_computed_tokens, todo, head.num_blocks, limits)
        if budget > 0:
            head_blocks = admission(head.num_computed_tokens, head.num_tokens, min(todo, budget), head.num_blocks,
                                    limits).blocks
    return StepView(blocks_needed=need + head_blocks, head_waiting=head.request_id if head is not None else None,
                    head_blocks=head_blocks, running_requests=running_requests, running_tokens=running_tokens,
                    blocks_ahead=ahead, step_tokens=step_tokens)


def arrival_index(queue: Sequence[Arrived], arrival_time: float) -> int:
    """Where a first-come-first-served waiting queue takes a request back at its arrival time's place:
    after every request that arrived no later (searched from the tail: a resumed request is usually
    among the newest)."""
    i = len(queue)
    while i > 0 and queue[i - 1].arrival_time > arrival_time:
        i -= 1
    return i


def to_front(queue: Sequence[T], ids: Collection[str], request_id: Callable[[T], str]) -> list[T]:
    """`queue` with the requests named in `ids` first, each part in its queue order (the engine's port and
    the simulator reorder their waiting queues with it)."""
    ahead = [r for r in queue if request_id(r) in ids]
    return ahead + [r for r in queue if request_id(r) not in ids]


def new_first(head: StepRequest | None, new_ids: Sequence[str], free_blocks: int, limits: StepLimits) -> list[str]:
    """The new requests (never scheduled: their first token still to come) to move ahead of the waiting
    queue's head, in their queue order: all of them when the head is a resumed request whose whole
    context cannot be admitted into the free blocks now, else none.

    Why: under `reserve_full_isl` vLLM admits nothing past a head that does not fit. A resumed request
    whose KV was freed or swapped needs its whole context at once (thousands of tokens) and waits for
    running requests to finish; every new request behind it waits too, though its prompt would fit (on
    the CPU benchmark at 6 req/s: 80% of the steps with a new request waiting had a resumed head that
    did not fit, and new requests' p99 time to first token went 3x past its bound). The caller bounds how
    long one head may be passed over (`InterceptCore.waiting_order`)."""
    if head is None or not new_ids or head.request_id in new_ids:
        return []
    todo = max(0, min(head.num_tokens, limits.max_model_len) - head.num_computed_tokens)
    adm = admission(head.num_computed_tokens, head.num_tokens, min(todo, max(1, limits.token_budget)), head.num_blocks,
                    limits)
    return [] if adm.fits(free_blocks) else list(new_ids)
