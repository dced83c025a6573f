"""vLLM V1's scheduler, as `vllm/v1/core/sched/scheduler.py` (0.32) builds a step, over the simulated
KV pool; and the `KvPort` the intercept core reaches the pool through (as `engine_adapter/vllm_port.py`
does in the engine). The step the core sees and the admission rule are the engine's own
(`engine_adapter/intercept/step.py`), over the simulator's queues.

One step (`schedule`):
1. running requests in order, each as many tokens as it still needs (one, when decoding) within the
   step's token budget; a request that cannot get its blocks preempts the newest running request
   (recompute: blocks freed, back to the front of the waiting queue with nothing computed), itself
   last;
2. if nobody was preempted, waiting requests: first those holding KV (paused sessions resumed in
   place, finished swap-ins) in their queue's order, then the waiting queue (first come, first
   served), while a running slot is free (paused requests holding their KV hold a slot too); a
   request is admitted only if its whole context fits in the free blocks (`reserve_full_isl`, vLLM's
   `scheduler_reserve_full_isl`, on by default; off: only this step's chunk), computes what fits in the
   budget (chunked prefill), and gets its prefix-cache hits or, through the intercept core's KV
   lookup, its swap-in (or, under `vllm-offload`, the host tier's lookup past the device's hits,
   `host_tier.py`): a held-back (deferred) one is skipped, an armed one gets its blocks and waits for
   its copies (`LOADING`); the first one that does not fit stops the loop.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from infercept.benchmarks.sim.cost import StepLoad
from infercept.benchmarks.sim.host_tier import SimHostTier
from infercept.benchmarks.sim.pool import BlockPool
from infercept.benchmarks.sim.request import SimRequest, Status
from engine_adapter.intercept.meter import AdmissionMeter
from engine_adapter.intercept.records import BlockCounts
from engine_adapter.intercept.state import StepView
from engine_adapter.intercept.step import StepLimits, StepRequest, admission, arrival_index, step_view, to_front

KEY_STRIDE = 1 << 20  # prefix-cache key = request serial * stride + block index


@dataclass
class Scheduled:
    tokens: dict[SimRequest, int] = field(default_factory=dict)
    new: list[tuple[str, int]] = field(default_factory=list)  # (request, computed tokens) first scheduled
    load: StepLoad = StepLoad(0, 0, 0, 0)
    preempted: int = 0


class SimScheduler:
    def __init__(self, pool: BlockPool, *, max_num_seqs: int, max_model_len: int, token_budget: int,
                 reserve_full_isl: bool = True) -> None:
        self.pool, self.bs = pool, pool.block_size
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.reserve_full_isl = reserve_full_isl  # vLLM's `scheduler_reserve_full_isl` (its default, the engine's)
        self.default_budget = self.max_num_scheduled_tokens = token_budget
        self.core: Any = None  # the intercept core (its KV lookup is the connector's)
        self.host_tier: SimHostTier | None = None  # vLLM's host KV tier (`vllm-offload`): the connector's lookup
        self.requests: dict[str, SimRequest] = {}
        self.running: list[SimRequest] = []
        self.waiting: list[SimRequest] = []
        self.kv_ready: list[tuple[int, SimRequest]] = []  # KV-holding and schedulable, by queue position
        self.loading: set[SimRequest] = set()
        # vLLM's in-flight prefills: loading, or scheduled with part of their context still to compute.
        # An async load is admitted only if it fits beside the blocks these still need.
        self.inflight: set[SimRequest] = set()
        self.paused_slots = 0  # vLLM's num_waiting_for_streaming_input
        self.preemptions = 0
        self._tail = 0  # KV-holding queue positions: paused sessions and admitted loads join at the tail
        self._serial = 0
        self._recv_done: list[str] = []
        # The admission meter's view (`InterceptScheduler._ic_meter_admission`): requests scheduled at least
        # once (the others are new), and the waiting request the last scan stopped at.
        self._scheduled_once: set[str] = set()
        self._scan_stop: SimRequest | None = None

    # ================================================================== KvPort
    def release(self, request_id: str) -> None:
        r = self.requests[request_id]
        self.pool.free(r.blocks)
        r.blocks = []
        self.paused_slots -= 1

    def block_ids(self, request_id: str) -> list[int]:
        return list(self.requests[request_id].blocks)

    def num_free_blocks(self) -> int:
        return self.pool.num_free()

    def reacquire(self, request_id: str, num_tokens: int) -> list[int] | None:
        r = self.requests[request_id]
        need = -(-num_tokens // self.bs)
        if r.blocks or need > self.pool.num_free() or self.slots_full():
            return None
        r.blocks = list(self._allocate(need))
        self.paused_slots += 1
        return list(r.blocks)

    def in_use(self, block_ids: Iterable[int]) -> set[int]:
        wanted = set(block_ids)
        return {b for r in self.requests.values() for b in r.blocks if b in wanted}

    def slots_full(self) -> bool:
        return len(self.running) + self.paused_slots >= self.max_num_seqs

    def free_slots(self) -> int:
        return self.max_num_seqs - len(self.running) - self.paused_slots

    def kv_holding_waiting(self) -> list[str]:
        return [r.rid for _, r in self.kv_ready]

    def evict_waiting(self, request_id: str) -> None:
        r = self.requests[request_id]
        self.kv_ready = [(pos, x) for pos, x in self.kv_ready if x is not r]
        self.inflight.discard(r)
        self.pool.free(r.blocks)
        r.blocks = []
        self.requeue_by_arrival(r)  # prefix-cache hits, if any are left, are found again as for a fresh prefill

    # ================================================================== queues
    def add(self, r: SimRequest) -> None:
        self._serial += 1
        r.key = self._serial * KEY_STRIDE
        self.requests[r.rid] = r
        self.waiting.append(r)

    def park(self, r: SimRequest) -> None:
        """A turn ended: the request waits for its next input, holding its blocks and a slot."""
        self.running.remove(r)
        self.inflight.discard(r)
        r.status = Status.PAUSED
        self.paused_slots += 1
        self._tail += 1
        r.queue_pos = self._tail

    def resume_in_place(self, r: SimRequest) -> None:
        """Resumed with its KV on the device: schedulable from the KV-holding queue."""
        r.status = Status.WAITING
        bisect.insort(self.kv_ready, (r.queue_pos, r), key=lambda x: x[0])

    def wait_for_load(self, r: SimRequest) -> None:
        """Resumed while its prefetch is still copying into the blocks it holds: blocked as an asynchronous
        KV load is (vLLM's WAITING_FOR_REMOTE_KVS) until the copy is reported done, where it sits in the
        KV-holding queue (its place from the pause: the engine port does not move it), and not among the
        in-flight prefills (vLLM counts a request there only when it allocates a load's blocks itself)."""
        r.status = Status.LOADING
        self.loading.add(r)

    def requeue_by_arrival(self, r: SimRequest) -> None:
        """Resumed without KV on the device: into the waiting queue at its arrival time's place."""
        r.status, r.num_computed = Status.WAITING, 0
        self.waiting.insert(arrival_index(self.waiting, r.arrival_time), r)

    def waiting_ahead(self, order: Callable[[Iterable[StepRequest], int, StepLimits], list[str]]) -> int:
        """The engine port's `waiting_ahead` over the simulated waiting queue."""
        if not self.waiting:
            return 0
        ids = order((StepRequest(r.rid, r.num_computed, r.num_tokens, len(r.blocks)) for r in self.waiting),
                    self.pool.num_free(), self._limits())
        if not ids:
            return 0
        self.waiting[:] = to_front(self.waiting, set(ids), lambda r: r.rid)
        return len(ids)

    def loads_done(self, rids: list[str]) -> None:
        """Their last swap-in chunk was copied in the step that just ran: vLLM hears of it with the
        step's output and promotes them when it builds the next step."""
        self._recv_done.extend(rids)

    def _promote_loaded(self) -> None:
        rids, self._recv_done = self._recv_done, []
        for rid in rids:
            r = self.requests.get(rid)
            if r is None or r.status is not Status.LOADING:
                continue
            self.loading.discard(r)
            if r.num_computed >= r.num_tokens:
                r.num_computed = r.num_tokens - 1  # the last token is computed to sample the next
            r.status = Status.WAITING
            bisect.insort(self.kv_ready, (r.queue_pos, r), key=lambda x: x[0])

    def finish(self, r: SimRequest) -> None:
        self.inflight.discard(r)
        self.running.remove(r)
        self.pool.free(r.blocks)
        r.blocks = []
        r.status = Status.FINISHED
        del self.requests[r.rid]
        self._scheduled_once.discard(r.rid)

    def unfinished(self) -> int:
        """Work the engine steps for (vLLM's count, less paused sessions)."""
        return len(self.running) + len(self.waiting) + len(self.kv_ready) + len(self.loading)

    # ================================================================== the step the core sees
    def step_view(self) -> StepView:
        """The step `schedule` is about to build, by the engine's rule (`intercept/step.py`). The simulator
        runs no speculative decoding and no async scheduling: a request's `num_tokens_with_spec` (plus
        output placeholders) is its `num_tokens`, and no lookahead slots are allocated."""
        running = (StepRequest(r.rid, r.num_computed, r.num_tokens, len(r.blocks)) for r in self.running)
        admissible = (StepRequest(r.rid, r.num_computed, r.num_tokens, len(r.blocks))
                      for r in itertools.chain((r for _, r in self.kv_ready), self.waiting))
        return step_view(running, admissible, self._limits())

    def _limits(self) -> StepLimits:
        return StepLimits(token_budget=self.max_num_scheduled_tokens, block_size=self.bs,
                          max_model_len=self.max_model_len, reserve_full_isl=self.reserve_full_isl)

    def resident_tokens(self) -> int:
        return (self.pool.num_blocks - self.pool.num_free()) * self.bs

    def block_counts(self) -> BlockCounts:
        paused = self.core.paused_ids(on_device=True) if self.core is not None else set()
        preserved = sum(len(r.blocks) for r in self.requests.values() if r.rid in paused)
        free = self.pool.num_free()
        return BlockCounts(self.pool.num_blocks, free, self.pool.num_blocks - free - preserved, preserved)

    # ================================================================== one step
    def schedule(self) -> Scheduled:
        self._promote_loaded()
        self._scan_stop = None
        out = Scheduled()
        budget = self.max_num_scheduled_tokens
        tokens = reqs = ctx = pairs = cross = chunks = 0
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.num_tokens - r.num_computed, budget, self.max_model_len - r.num_computed - 1)
            if n <= 0:
                i += 1
                continue
            need = -(-(r.num_computed + n) // self.bs) - len(r.blocks)
            while need > self.pool.num_free():
                victim = running.pop()
                self._preempt(victim)
                out.preempted += 1
                if victim is r:
                    break
            if r.status is Status.PREEMPTED:
                break
            if need > 0:
                r.blocks.extend(self._allocate(need))
            out.tokens[r] = n
            c = r.num_computed
            tokens, reqs, ctx, pairs = tokens + n, reqs + 1, ctx + c, pairs + n * c + n * (n + 1) // 2
            cross += n * c if n > 1 else 0
            chunks += n > 1
            budget -= n
            i += 1
        if not out.preempted:
            budget, extra = self._schedule_waiting(out, budget)
            tokens, reqs, ctx, pairs = tokens + extra[0], reqs + extra[1], ctx + extra[2], pairs + extra[3]
            cross += extra[4]
            chunks += extra[5]
        for r, n in out.tokens.items():
            r.num_computed += n
            if r.num_computed < r.num_tokens:
                self.inflight.add(r)
            else:
                self.inflight.discard(r)
            if self.pool.prefix_caching:
                self._register(r)
        out.load = StepLoad(tokens, reqs, ctx, pairs, cross, chunks)
        return out

    def meter_admission(self, meter: AdmissionMeter, now: float, out: Scheduled) -> tuple[int, str | None, int]:
        """Feed the admission meter this schedule as the engine's scheduler does (`AdmissionMeter.schedule`)."""
        return meter.schedule(now, (r.rid for r in out.tokens), (r.rid for r in self.waiting), self._scheduled_once,
                              slots_full=self.slots_full(), budget_full=out.load.tokens >= self.max_num_scheduled_tokens,
                              stop=lambda: self._scan_stop.rid if self._scan_stop is not None else None)

    def _schedule_waiting(self, out: Scheduled, budget: int) -> tuple[int, tuple[int, int, int, int, int]]:
        tokens = reqs = ctx = pairs = cross = chunks = 0
        limits = self._limits()
        skipped = 0  # held-back swap-ins at the head of the waiting queue (vLLM skips them)
        swap = self.core is not None and self.core.swap is not None
        while budget > 0:
            from_ready = bool(self.kv_ready)
            if not from_ready and skipped >= len(self.waiting):
                break
            if len(self.running) + self.paused_slots >= self.max_num_seqs:
                break
            r = self.kv_ready[0][1] if from_ready else self.waiting[skipped]
            hits: list[int] = []
            ext, load_async = 0, False
            computed = r.num_computed
            fresh = computed == 0
            if fresh:
                # Prefix-cache hits stop one token short of the context: its last token is computed
                # again to sample the next one.
                limit = min(r.cached_blocks, (r.num_tokens - 1) // self.bs)
                if limit > 0:
                    hits = self.pool.find_hits(range(r.key, r.key + limit))
                if swap:
                    found, load_async = self.core.load_lookup(r.rid, len(hits) * self.bs)
                    if found is None:  # held back: its swap-in has not been armed yet
                        skipped += 1
                        continue
                    ext = found
                elif self.host_tier is not None:
                    host = self.host_tier.lookup(r, len(hits))
                    if host is None:  # deferred: a transfer it needs is still on the link
                        skipped += 1
                        continue
                    ext, load_async = host * self.bs, host > 0
                computed = len(hits) * self.bs + ext
            n = 0 if load_async else min(r.num_tokens - computed, budget)
            # Admission (`intercept/step.py`): the whole context must fit when `reserve_full_isl`, the
            # chunk beside what in-flight prefills still need when loading asynchronously; hit blocks
            # are free blocks too, so they count against the free pool.
            adm = admission(computed, r.num_tokens, n, len(r.blocks), limits)
            if not adm.fits(self.pool.num_free(), self._reserved() if load_async else 0):
                self._scan_stop = r
                break
            need = adm.chunk_blocks - len(hits)
            if hits:
                self.pool.touch(hits)
                r.blocks.extend(hits)
            if fresh:
                r.cached_blocks = len(hits)  # what is cached beyond the hits was evicted: recomputed anew
            if need > 0:
                r.blocks.extend(self._allocate(need))
            if ext and swap:
                self.core.load_allocated(r.rid, list(r.blocks), ext)
            elif ext:
                self.host_tier.admit_load(r, len(hits), ext // self.bs)  # type: ignore[union-attr]
            if from_ready:
                self.kv_ready.pop(0)
            else:
                del self.waiting[skipped]
            r.num_computed = computed
            if load_async:
                r.status = Status.LOADING
                # vLLM re-queues the requests its scan skipped ahead of the KV-holding queue, in the order
                # it visited them; it reaches the plain waiting queue only once every KV-holding request
                # was visited, so a load it admits there lands behind all of them (loads stay FCFS).
                self._tail += 1
                r.queue_pos = self._tail
                self.loading.add(r)
                self.inflight.add(r)
                continue
            if r.status is Status.WAITING:
                out.new.append((r.rid, computed))
            r.status = Status.RUNNING
            self.running.append(r)
            out.tokens[r] = n
            tokens, reqs, ctx, pairs = tokens + n, reqs + 1, ctx + computed, pairs + n * computed + n * (n + 1) // 2
            cross += n * computed if n > 1 else 0
            chunks += n > 1
            budget -= n
        return budget, (tokens, reqs, ctx, pairs, cross, chunks)

    def _reserved(self) -> int:
        """Blocks the in-flight prefills still need to hold their whole context."""
        return sum(max(0, -(-min(r.num_tokens, self.max_model_len) // self.bs) - len(r.blocks)) for r in self.inflight)

    def _allocate(self, n: int) -> list[int]:
        blocks = self.pool.allocate(n)
        if self.host_tier is not None:
            self.host_tier.allocated(blocks)
        return blocks

    def _preempt(self, r: SimRequest) -> None:
        if self.host_tier is not None:
            self.host_tier.preempted(r.rid)
        self.inflight.discard(r)
        self.pool.free(r.blocks)
        r.blocks = []
        r.status = Status.PREEMPTED
        r.num_computed = 0
        self.waiting.insert(0, r)
        self.preemptions += 1

    def _register(self, r: SimRequest) -> None:
        full = min(r.num_computed // self.bs, len(r.blocks))
        key = r.key
        for idx in range(r.cached_blocks, full):
            self.pool.register(r.blocks[idx], key + idx)
        r.cached_blocks = max(r.cached_blocks, full)
