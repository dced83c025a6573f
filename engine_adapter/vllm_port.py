"""The vLLM port: the intercept core's view of vLLM's scheduler (the `KvPort` it releases blocks through,
the step it is about to build, the block counts its reports need), and one small function for each
private vLLM name the rest of the engine adapter needs. Every private vLLM 0.32 name touched outside
the hook overrides (`scheduler.py`, `swap_connector.py`: methods of the classes we subclass) is here,
and `tests/policy/test_vllm_boundary.py` keeps them from leaking out of this module; internals with
public names are listed in the docstring of each module that uses them.

The scheduler (`VllmPort`):

* `Scheduler._free_request_blocks`, `_inflight_prefills`, `deferred_waiting`, `num_waiting_for_streaming_input` (paused requests hold a running
  slot there, counted against `max_num_active_reqs`), `running`, `waiting`, `kv_holding_waiting`,
  `max_num_scheduled_tokens`, `block_size`, `max_model_len`, `scheduler_reserve_full_isl`,
  `num_lookahead_tokens`, `deferred_frees`, `requests`;
* `kv_cache_manager.allocate_slots` (a prefetch's blocks, as for an asynchronous KV load),
  `kv_cache_manager.block_pool.{num_gpu_blocks, get_num_free_blocks, blocks[*].ref_cnt}` and
  `kv_cache_manager.coordinator.single_type_managers[*].req_to_blocks`;
* `Request.{num_computed_tokens, num_tokens, num_tokens_with_spec, num_output_placeholders, status,
  arrival_time, num_stale_output_tokens, drop_stale_output}`.

The step order itself (what runs, what waits, the blocks they need) is a pure rule in
`intercept/step.py`, shared with the simulator; this port only reads vLLM's queues into it.

Elsewhere (one function each, below):
* `AsyncMPClient._call_utility_async(method, *args, engine=core_engines[rank])`: a utility call on one
  data-parallel rank (`engine.py`; the public `call_utility_async` reaches the first engine only);
* `StructuredOutputManager._create_grammar(request)`: a turn's grammar, compiled in place
  (`scheduler.py`);
* `KVConnectorBase_V1._get_connector_metadata()`: the step's metadata bound to the connector
  (`swap_connector.py`; the base class's accessor for its subclasses);
* `KVConnectorBase_V1._vllm_config`: the VllmConfig the connector was built with (`swap_connector.py`:
  the worker checks the KV layout it supports and sizes the host buffer per rank);
* `GPUModelRunner._sample(logits, spec_decode_metadata)` and `_bookkeeping_sync(...)`, inherited by
  `CPUModelRunner`: wrapped by the seeded-sampling fix (`vllm_plugin.py`);
* `LRUCachePolicy.{_ranks, _evictable, _push_evictable, _maybe_compact_heap}` (`vllm/v1/kv_offload/cpu/
  policies/lru.py`): the host tier's `SessionEndLRU` sets blocks' eviction ranks (`host_tier.py`; vLLM's
  policy assigns them only as recency, from 0 up).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator
from typing import Any

from vllm.v1.request import Request, RequestStatus

from engine_adapter.intercept.records import BlockCounts
from engine_adapter.intercept.state import StepView
from engine_adapter.intercept.step import StepLimits, StepRequest, arrival_index, step_view, to_front

# Waiting requests vLLM can admit this step (the others wait for a KV load, a grammar, their next input).
_READY = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class VllmPort:
    def __init__(self, scheduler: Any) -> None:
        self.s = scheduler

    # ------------------------------------------------------------------ KvPort
    def release(self, request_id: str) -> None:
        self.s._free_request_blocks(self.s.requests[request_id])
        self.s.num_waiting_for_streaming_input -= 1

    def reacquire(self, request_id: str, num_tokens: int) -> list[int] | None:
        # As vLLM allocates a request's blocks for an asynchronous KV load (`Scheduler.schedule`): the
        # tokens count as external (their KV arrives by copy), the blocks are not cached until the load is
        # done, and the request's computed tokens are what the blocks will hold once it is.
        s = self.s
        req = s.requests[request_id]
        if self.request_blocks(request_id) or self.slots_full():
            return None
        computed, req.num_computed_tokens = req.num_computed_tokens, 0
        try:
            got = s.kv_cache_manager.allocate_slots(req, 0, num_external_computed_tokens=num_tokens, delay_cache_blocks=True,
                                                    has_scheduled_reqs=False, skip_zeroing_group_ids=(0,))
        finally:
            req.num_computed_tokens = computed
        if got is None:
            return None
        s.num_waiting_for_streaming_input += 1
        return self.block_ids(request_id)

    def block_ids(self, request_id: str) -> list[int]:
        mgr = self.s.kv_cache_manager.coordinator.single_type_managers[0]
        return [b.block_id for b in mgr.req_to_blocks.get(request_id, ())]

    def num_free_blocks(self) -> int:
        return self.s.kv_cache_manager.block_pool.get_num_free_blocks()

    def in_use(self, block_ids: Iterable[int]) -> set[int]:
        blocks = self.s.kv_cache_manager.block_pool.blocks
        return {b for b in block_ids if blocks[b].ref_cnt > 0}

    def slots_full(self) -> bool:
        return self.free_slots() <= 0

    def free_slots(self) -> int:
        return self.s.max_num_active_reqs - len(self.s.running) - self.s.num_waiting_for_streaming_input

    def kv_holding_waiting(self) -> list[str]:
        # vLLM's own test for a waiting request holding blocks (`Scheduler._holds_kv_blocks`), among
        # those it could admit now.
        return [r.request_id for r in self.s.kv_holding_waiting if r.status in _READY and r.num_computed_tokens > 0]

    def evict_waiting(self, request_id: str) -> None:
        # As `Scheduler._preempt_request` frees a running request, then where a recomputed resume goes.
        req = self.s.requests[request_id]
        self.s._free_request_blocks(req)
        self.s._inflight_prefills.discard(req)
        req.num_computed_tokens = 0
        self.requeue_by_arrival(req)

    # ------------------------------------------------------------------ slots and queues
    def take_slot_back(self) -> None:
        """A request whose slot was released is about to leave the paused state through vLLM code that
        gives the slot back once more (resume, finish): count it again first."""
        self.s.num_waiting_for_streaming_input += 1

    def wait_for_load(self, request: Request) -> None:
        """A resumed request whose KV is still being copied into the blocks it holds: blocked as vLLM blocks
        an asynchronous KV load (`WAITING_FOR_REMOTE_KVS`, promoted once the connector reports it received)."""
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.s.deferred_waiting.add(request)

    def requeue_by_arrival(self, request: Request) -> None:
        """A resumed request without KV on the device: out of the KV-holding queue, into the plain
        waiting queue at its arrival time's place."""
        self.s.kv_holding_waiting.remove_request(request)
        queue = self.s.waiting
        if not hasattr(queue, "insert"):  # priority queue: already ordered by (priority, arrival)
            queue.add_request(request)
            return
        queue.insert(arrival_index(queue, request.arrival_time), request)

    def waiting_ahead(self, order: Callable[[Iterable[StepRequest], int, StepLimits], list[str]]) -> int:
        """Let `order` (the core's `waiting_order`) pick requests of the plain waiting queue (ready ones, in
        queue order) to move to its front, keeping their order; how many moved. A priority queue keeps
        its own order."""
        queue = self.s.waiting
        if not hasattr(queue, "insert") or not queue:
            return 0
        ready = [r for r in queue if r.status in _READY]
        ids = order((self._step_request(r, r.num_tokens) for r in ready), self.num_free_blocks(), self._limits())
        if not ids:
            return 0
        reordered = to_front(list(queue), set(ids), lambda r: r.request_id)
        queue.clear()
        queue.extend(reordered)
        return len(ids)

    # ------------------------------------------------------------------ the step being built
    def step_view(self) -> StepView:
        """The step vLLM is about to build (`intercept/step.py` has the rule), over its own queues."""
        s = self.s
        running = (self._step_request(r, r.num_tokens_with_spec + r.num_output_placeholders) for r in s.running)
        admissible = (self._step_request(r, r.num_tokens) for r in self._admissible())
        return step_view(running, admissible, self._limits())

    def _admissible(self) -> Iterator[Request]:
        """The waiting requests vLLM's scan may admit, in its order (the KV-holding queue drains first)."""
        return (r for q in (self.s.kv_holding_waiting, self.s.waiting) for r in q if r.status in _READY)

    def scan_stop(self, held_back: Callable[[str], bool]) -> Request | None:
        """After a schedule: the waiting request vLLM's scan stopped at, the first admissible one it did not
        skip. Of the ready requests it skips those the connector holds back (`held_back`: a swap-in not yet
        armed) and those whose previous turn's output is still in flight; the others (a KV load, a grammar,
        a paused session's next input) are not ready. vLLM's `deferred_waiting` cannot tell: a request stays
        in it from its first skip until it runs, so a resumed session (deferred while it was paused) that
        now stops the scan would be passed over."""
        return next((r for r in self._admissible() if not held_back(r.request_id)
                     and not (r.num_stale_output_tokens and not r.drop_stale_output)), None)

    def _limits(self) -> StepLimits:
        s = self.s
        return StepLimits(token_budget=s.max_num_scheduled_tokens, block_size=s.block_size, max_model_len=s.max_model_len,
                          reserve_full_isl=s.scheduler_reserve_full_isl, lookahead_tokens=s.num_lookahead_tokens)

    def _step_request(self, req: Request, num_tokens: int) -> StepRequest:
        held = len(self.request_blocks(req.request_id))
        return StepRequest(req.request_id, req.num_computed_tokens, num_tokens, held)

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


# ====================================================================== outside the scheduler
async def call_utility_on_rank(client: Any, rank: int, method: str, *args: Any) -> Any:
    """An engine-core utility call on one data-parallel rank of an `AsyncLLM.engine_core` client."""
    return await client._call_utility_async(method, *args, engine=client.core_engines[rank])


def compile_grammar(manager: Any, request: Request) -> Any:
    """The request's grammar, compiled now by the scheduler's `structured_output_manager` (whose public
    `grammar_init` may compile it on a thread pool instead)."""
    return manager._create_grammar(request)


def connector_metadata(connector: Any) -> Any:
    """The metadata vLLM bound to this KV connector for the step (only while one is bound)."""
    return connector._get_connector_metadata()


def connector_vllm_config(connector: Any) -> Any:
    """The VllmConfig a KV connector was built with (`KVConnectorBase_V1.__init__` keeps it as `_vllm_config`)."""
    return connector._vllm_config


def runner_sampling(cls: type) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A model runner class's `_sample` and `_bookkeeping_sync` methods."""
    return cls._sample, cls._bookkeeping_sync  # type: ignore[attr-defined]


def set_runner_sampling(cls: type, sample: Callable[..., Any], bookkeeping_sync: Callable[..., Any]) -> None:
    """Replace them (wrappers that call the originals, with the same signatures)."""
    cls._sample, cls._bookkeeping_sync = sample, bookkeeping_sync  # type: ignore[attr-defined]


def lru_set_ranks(policy: Any, keys: Iterable[Any], first_rank: int) -> int:
    """vLLM 0.32's `LRUCachePolicy`: give the `keys` it holds consecutive eviction ranks from `first_rank`
    (the lowest is evicted first; vLLM's own count up from 0), queueing the evictable ones under their new
    rank (the heap entries under the old one turn stale, as on vLLM's own updates). Returns the next rank."""
    rank = first_rank
    for key in keys:
        if key not in policy.chunks:
            continue
        policy._ranks[key] = rank
        rank += 1
        if key in policy._evictable:
            policy._push_evictable(key)
    policy._maybe_compact_heap()
    return rank
