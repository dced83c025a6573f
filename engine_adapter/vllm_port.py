"""The intercept core's view of vLLM's scheduler: the `KvPort` it releases blocks through, the step it
is about to build, and the block counts its reports need. Every vLLM 0.32 internal the intercept
machinery touches outside the hook overrides is here:

* `Scheduler._free_request_blocks`, `num_waiting_for_streaming_input` (paused requests hold a running
  slot there, counted against `max_num_active_reqs`), `running`, `waiting`, `kv_holding_waiting`,
  `max_num_scheduled_tokens`, `block_size`, `deferred_frees`, `requests`;
* `kv_cache_manager.block_pool.{num_gpu_blocks, get_num_free_blocks, blocks[*].ref_cnt}` and
  `kv_cache_manager.coordinator.single_type_managers[*].req_to_blocks`;
* `Request.{num_computed_tokens, num_tokens, num_tokens_with_spec, status, arrival_time}`.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from typing import Any

from vllm.v1.request import Request, RequestStatus

from engine_adapter.intercept.records import BlockCounts
from engine_adapter.intercept.state import StepView


class VllmPort:
    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler

    # ------------------------------------------------------------------ KvPort
    def release(self, request_id: str) -> None:
        self.s._free_request_blocks(self.s.requests[request_id])
        self.s.num_waiting_for_streaming_input -= 1

    def block_ids(self, request_id: str) -> list[int]:
        mgr = self.s.kv_cache_manager.coordinator.single_type_managers[0]
        return [b.block_id for b in mgr.req_to_blocks.get(request_id, ())]

    def num_free_blocks(self) -> int:
        return self.s.kv_cache_manager.block_pool.get_num_free_blocks()

    def in_use(self, block_ids: Iterable[int]) -> set[int]:
        blocks = self.s.kv_cache_manager.block_pool.blocks
        return {b for b in block_ids if blocks[b].ref_cnt > 0}

    def slots_full(self) -> bool:
        return len(self.s.running) + self.s.num_waiting_for_streaming_input >= self.s.max_num_active_reqs

    # ------------------------------------------------------------------ slots and queues
    def take_slot_back(self) -> None:
        """A request whose slot was released is about to leave the paused state through vLLM code that
        gives the slot back once more (resume, finish): count it again first."""
        self.s.num_waiting_for_streaming_input += 1

    def requeue_by_arrival(self, request: Request) -> None:
        """A resumed request without KV on the device: out of the KV-holding queue, into the plain
        waiting queue at its arrival time's place."""
        self.s.kv_holding_waiting.remove_request(request)
        queue = self.s.waiting
        if not hasattr(queue, "insert"):  # priority queue: already ordered by (priority, arrival)
            queue.add_request(request)
            return
        idx = len(queue)
        while idx > 0 and queue[idx - 1].arrival_time > request.arrival_time:
            idx -= 1
        queue.insert(idx, request)

    # ------------------------------------------------------------------ the step being built
    def step_view(self) -> StepView:
        """Blocks the next step needs: running requests first, then the first waiting request that is
        ready (vLLM's own order), within the step's token budget."""
        s = self.s
        budget = s.max_num_scheduled_tokens
        need = ahead = 0
        for req in s.running:
            todo = max(req.num_tokens_with_spec - req.num_computed_tokens, 0)
            n = min(todo, budget)
            budget -= n
            need += self._new_blocks(req, n)
            ahead += self._new_blocks(req, todo)
        head: Request | None = None
        for queue in (s.kv_holding_waiting, s.waiting):
            head = next((r for r in queue if r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)), None)
            if head is not None:
                break
        head_blocks = 0
        if head is not None:
            todo = min(head.num_tokens, s.max_model_len) - head.num_computed_tokens
            ahead += self._new_blocks(head, todo)
            if budget > 0:
                # vLLM admits a waiting request only when its whole sequence fits (its
                # `scheduler_reserve_full_isl`, on by default), not just this step's chunk.
                head_blocks = self._new_blocks(head, todo if s.scheduler_reserve_full_isl else min(todo, budget))
        return StepView(
            blocks_needed=need + head_blocks,
            head_waiting=head.request_id if head is not None else None,
            head_blocks=head_blocks,
            running_requests=len(s.running),
            running_tokens=sum(r.num_computed_tokens for r in s.running),
            blocks_ahead=ahead,
        )

    def _new_blocks(self, req: Request, n_tokens: int) -> int:
        held = len(self.request_blocks(req.request_id))
        return max(0, math.ceil((req.num_computed_tokens + n_tokens) / self.s.block_size) - held)

    def request_blocks(self, request_id: str) -> list[int]:
        ids: list[int] = []
        for mgr in self.s.kv_cache_manager.coordinator.single_type_managers:
            ids.extend(b.block_id for b in mgr.req_to_blocks.get(request_id, ()) if not b.is_null)
        return ids

    def block_counts(self, paused: Container[str]) -> BlockCounts:
        pool = self.s.kv_cache_manager.block_pool
        held_paused: set[int] = set()
        others: set[int] = set()
        for rid in self.s.requests:
            (held_paused if rid in paused else others).update(self.request_blocks(rid))
        in_flight = sum(len(blocks) for _, blocks in self.s.deferred_frees)
        return BlockCounts(
            total=pool.num_gpu_blocks - 1,  # block 0 is vLLM's null block
            free=pool.get_num_free_blocks(),
            running=len(others) + in_flight,
            preserved=len(held_paused - others),
        )

    def resident_tokens(self) -> int:
        pool = self.s.kv_cache_manager.block_pool
        return (pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()) * self.s.block_size
