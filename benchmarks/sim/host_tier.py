"""vLLM's host KV tier as the `vllm-offload` policy runs it (`engine_adapter/offload_connector.py` over
`engine_adapter/host_tier.py`), over the simulated pool: what the simulator needs to run the benchmark's
best peer beside the policies it already models.

What it does, as vLLM 0.32's `OffloadingConnectorScheduler`, its `CPUOffloadingManager` (LRU) and our
worker do:

* **Stores.** When a step is built, each scheduled request offers the full blocks the step will complete
  beyond its stored index; those the host does not hold are stored, all or none (`prepare_store`): room
  is made by evicting the least recently used ready blocks no load reads and the request did not offer,
  and if that is not enough nothing is stored and the request offers them again next step. Stored, the
  index moves past them (a load moves it past what it loaded). The copies are issued at the step's end
  (our connector issues stores at the barrier), and the blocks become loadable when their link time is
  through.
* **Recency.** Nothing is touched on lookup or load; when a request finishes, every block it stored or
  loaded becomes the most recently used, its first block last of all (the LRU policy's
  `on_request_finished`). With `ended_first` (`infercept-offload`'s `host_tier.SessionEndLRU`) they are
  evicted first instead: before any other, the earliest finished first, each request's last block first.
* **Lookup** (`get_num_new_matched_tokens`), when the scan reaches a request that has nothing computed:
  the leading run of its full blocks past the device's prefix-cache hits that the host holds. A request
  with a transfer of its own still in flight (or a block still being stored, which with keys unique to
  a request is the same thing) is deferred: the scan skips it this step, as vLLM's does on `None`.
* **Loads** are asynchronous (vLLM's `WAITING_FOR_REMOTE_KVS`): the request gets its blocks at
  admission, the load goes on the link when the step that admitted it starts, and the scheduler hears
  it is through with the first step's output after that and promotes it then.
* **The link** is one queue for both directions (`EmulatedLink`): a transfer starts when those before it
  are through and takes bytes / rate, from when its copy began. Without an emulated link a CPU's
  transfer is only its copy.
* **The copy** itself (our `BlockCopier`) runs in the worker when a job is submitted, so on a CPU it
  lengthens the step by bytes / the profile's measured copy bandwidth (out for stores, in for loads); a
  GPU copies on its DMA engine and the step does not wait.
* **Flushes.** A step that reuses a block whose store is still on the link waits for it (vLLM flushes a
  finished request's pending stores before its freed blocks are reused, and a preempted request's);
  our worker's `wait` sleeps out the link time left, and so does the simulated step."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from infercept.benchmarks.sim.request import SimRequest
from engine_adapter.intercept.reports import HostTierReport
from engine_adapter.policy.table import SESSION_END_LRU

_PENDING = math.inf  # a store prepared in the step being built, its link time not known yet


@dataclass
class _Load:
    rid: str
    keys: tuple[int, ...]
    done_at: float = -1.0  # set when the step that admitted it starts


class SimHostTier:
    def __init__(self, capacity_blocks: int, block_size: int, block_bytes: int, link_bytes_per_s: float | None,
                 copy_out_bytes_per_s: float | None, copy_in_bytes_per_s: float | None, ended_first: bool = False) -> None:
        """`copy_*_bytes_per_s`: the worker's copy bandwidths when copies run on the step's cores (a CPU
        engine), None when they run beside it (a GPU's copy engine). `ended_first`: a finished request's
        blocks are evicted first rather than made the most recently used."""
        if capacity_blocks < 0 or block_size < 1 or block_bytes < 1:
            raise ValueError("the host tier needs a non-negative capacity and positive block sizes")
        self.capacity, self.bs, self.block_bytes = capacity_blocks, block_size, block_bytes
        self.link_bytes_per_s = link_bytes_per_s
        self.copy_out_bytes_per_s, self.copy_in_bytes_per_s = copy_out_bytes_per_s, copy_in_bytes_per_s
        self.now = 0.0  # the step being built starts here: what the scheduler knows is done by now
        self._link_free_at = 0.0
        self._keys: OrderedDict[int, float] = OrderedDict()  # key -> when its store is through, least recent first
        self.ended_first = ended_first
        self._ended: OrderedDict[int, None] = OrderedDict()  # `ended_first`: finished requests' keys, evicted first, in order
        self._reading: dict[int, int] = {}  # key -> loads reading it (not evictable)
        self._stored_upto: dict[str, int] = {}  # request -> its stored index, in blocks (vLLM's next_stored_chunk_idx)
        self._used_upto: dict[str, int] = {}  # request -> blocks it stored or loaded (its recency update at the end)
        self._busy_until: dict[str, float] = {}  # request -> when its last store is through
        self._pending_blocks: dict[int, float] = {}  # freed device block -> when its store is through
        self._admitted: list[_Load] = []  # loads admitted by the step being built
        self._loads: list[_Load] = []  # loads on the link
        self.stall_s = 0.0  # flushes the step being built waits for (taken by the engine)
        # what the engine's HostTierReport counts, and more
        self.blocks_stored = 0
        self.loads = 0
        self.tokens_loaded = 0
        self.deferred_lookups = 0
        self.failed_stores = 0  # offers refused for want of room (offered again later)

    # ------------------------------------------------------------------ the scheduler's side
    def lookup(self, r: SimRequest, local_blocks: int) -> int | None:
        """Blocks past the `local_blocks` device hits the host can load; None: deferred."""
        if self._busy_until.get(r.rid, 0.0) > self.now:
            self.deferred_lookups += 1
            return None
        hits = 0
        for idx in range(local_blocks, r.num_tokens // self.bs):
            done = self._keys.get(r.key + idx)
            if done is None:
                break
            if done > self.now:
                self.deferred_lookups += 1
                return None
            hits += 1
        return hits

    def admit_load(self, r: SimRequest, first_block: int, n_blocks: int) -> None:
        """The scheduler gave a request its blocks for `n_blocks` host blocks from `first_block` on."""
        keys = tuple(r.key + i for i in range(first_block, first_block + n_blocks))
        for k in keys:
            self._reading[k] = self._reading.get(k, 0) + 1
        self._admitted.append(_Load(r.rid, keys))
        end = first_block + n_blocks
        self._stored_upto[r.rid] = max(self._stored_upto.get(r.rid, 0), end)
        self._used_upto[r.rid] = max(self._used_upto.get(r.rid, 0), end)
        self.loads += 1
        self.tokens_loaded += n_blocks * self.bs

    def allocated(self, blocks: Iterable[int]) -> None:
        """The scheduler handed these device blocks out: one whose store is still on the link is flushed."""
        if not self._pending_blocks:
            return
        for b in blocks:
            done = self._pending_blocks.pop(b, None)
            if done is not None:
                self.stall_s = max(self.stall_s, done - self.now)

    def preempted(self, rid: str) -> None:
        """vLLM flushes a preempted request's stores before its blocks are reused."""
        self.stall_s = max(self.stall_s, self._busy_until.get(rid, 0.0) - self.now)

    # ------------------------------------------------------------------ the step
    def start_step(self) -> tuple[int, float]:
        """The step built at `now` starts: the loads it admitted go on the link. Returns how many, and
        what their copies add to the step."""
        nbytes, started, at = 0, len(self._admitted), self.now
        for load in self._admitted:
            n = len(load.keys) * self.block_bytes
            copy = n / self.copy_in_bytes_per_s if self.copy_in_bytes_per_s else 0.0
            load.done_at = self._transfer(n, at, copy)
            at += copy  # the worker copies one job after the other
            nbytes += n
            self._loads.append(load)
        self._admitted = []
        return started, at - self.now

    def take_stall(self) -> float:
        stall, self.stall_s = max(0.0, self.stall_s), 0.0
        return stall

    def plan_stores(self, scheduled: Iterable[SimRequest]) -> list[tuple[str, list[int]]]:
        """The stores of the step being built (vLLM prepares them when it builds the step's metadata):
        per request, the blocks it completes that the host takes, all or none."""
        out = []
        for r in scheduled:
            full = r.num_computed // self.bs  # after the step (the scheduler has counted it)
            start = self._stored_upto.get(r.rid, 0)
            if full <= start:
                continue
            offered = [r.key + i for i in range(start, full)]
            new = [k for k in offered if k not in self._keys]
            if new and not self._make_room(len(new), set(offered)):
                self.failed_stores += 1
                continue
            for k in new:
                self._keys[k] = _PENDING
            self._stored_upto[r.rid] = full
            self._used_upto[r.rid] = max(self._used_upto.get(r.rid, 0), full)
            if new:
                out.append((r.rid, new))
        return out

    def store_copy_s(self, stores: list[tuple[str, list[int]]]) -> float:
        n = sum(len(keys) for _, keys in stores) * self.block_bytes
        return n / self.copy_out_bytes_per_s if self.copy_out_bytes_per_s and n else 0.0

    def end_step(self, stores: list[tuple[str, list[int]]], now: float) -> None:
        """The step ended at `now`: its stores go on the link (their copies began at the barrier, just
        before `now`, when they run on the step's cores)."""
        at = now - self.store_copy_s(stores)
        for rid, keys in stores:
            nbytes = len(keys) * self.block_bytes
            copy = nbytes / self.copy_out_bytes_per_s if self.copy_out_bytes_per_s else 0.0
            done = self._transfer(nbytes, at, copy)
            at += copy
            for k in keys:
                self._keys[k] = done
            self.blocks_stored += len(keys)
            self._busy_until[rid] = max(self._busy_until.get(rid, 0.0), done)

    def poll(self, now: float) -> list[str]:
        """The requests whose loads are through by `now` (the worker's `get_finished`)."""
        finished = [load for load in self._loads if load.done_at <= now]
        if not finished:
            return []
        self._loads = [load for load in self._loads if load.done_at > now]
        for load in finished:
            for k in load.keys:
                self._reading[k] -= 1
                if not self._reading[k]:
                    del self._reading[k]
        return [load.rid for load in finished]

    def next_event(self) -> float | None:
        """When a transfer in flight is through (a load to report, a deferred lookup to retry)."""
        times = [load.done_at for load in self._loads]
        times += [t for t in self._busy_until.values() if t > self.now]
        return min(times) if times else None

    def finished(self, r: SimRequest) -> None:
        """The request finished (vLLM's `request_finished`), its device blocks about to be freed: those
        whose store is still on the link are flushed when reused, and every block it stored or loaded
        becomes the most recently used, its first last of all."""
        for idx, b in enumerate(r.blocks):
            done = self._keys.get(r.key + idx)
            if done is not None and done > self.now:
                self._pending_blocks[b] = done
        for idx in range(self._used_upto.pop(r.rid, 0) - 1, -1, -1):
            if r.key + idx in self._keys:
                if self.ended_first:
                    self._ended[r.key + idx] = None
                else:
                    self._keys.move_to_end(r.key + idx)
        self._stored_upto.pop(r.rid, None)
        self._busy_until.pop(r.rid, None)

    def abort_all(self) -> None:
        """The cutoff: requests are gone; transfers on the link and the host's contents stay."""
        self._stored_upto.clear()
        self._used_upto.clear()
        self._busy_until.clear()
        self._admitted, self._loads, self._reading = [], [], {}

    def report(self) -> HostTierReport:
        return HostTierReport(host_blocks=self.capacity, blocks_stored=self.blocks_stored, loads=self.loads,
                              tokens_loaded=self.tokens_loaded, eviction=SESSION_END_LRU if self.ended_first else "lru")

    # ------------------------------------------------------------------ internals
    def _transfer(self, nbytes: int, started: float, copy_s: float) -> float:
        """When a job whose copy began at `started` and took `copy_s` is through (`EmulatedLink.transfer`)."""
        if not self.link_bytes_per_s:
            return started + copy_s
        begin = max(started, self._link_free_at)
        self._link_free_at = max(started + copy_s, begin + nbytes / self.link_bytes_per_s)
        return self._link_free_at

    def _make_room(self, n: int, protected: set[int]) -> bool:
        """Room for `n` more blocks, evicting the least recently used ready blocks that no load reads and
        that are not `protected`; nothing is evicted unless all the room can be made."""
        short = len(self._keys) + n - self.capacity
        if short <= 0:
            return True
        victims = []
        for k in self._eviction_order():
            done = self._keys[k]
            if done <= self.now and k not in self._reading and k not in protected:
                victims.append(k)
                if len(victims) == short:
                    break
        if len(victims) < short:
            return False
        for k in victims:
            del self._keys[k]
            self._ended.pop(k, None)
        return True

    def _eviction_order(self) -> Iterable[int]:
        """Keys in the order they are evicted: finished requests' first (`ended_first`; every one of them is
        held, as only `_make_room` drops keys), then the least recent first."""
        yield from self._ended
        yield from (k for k in self._keys if k not in self._ended) if self._ended else self._keys
