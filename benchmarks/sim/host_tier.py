"""vLLM's host KV tier as the `vllm-offload` policy runs it (`engine_adapter/offload_connector.py` over
`engine_adapter/host_tier.py`), over the simulated pool: what the simulator needs to run the benchmark's
best peer beside the policies it already models.

What it does, as vLLM 0.32's `OffloadingConnectorScheduler` and our worker do:

* **Stores.** Every block a scheduled request completes in a step is stored to the host buffer at the
  step's end (our connector issues stores at the barrier), unless its key is there already; a request's
  stored index only moves forward (vLLM's `next_stored_chunk_idx`). The host buffer holds
  `capacity_blocks` whole blocks, evicted least recently used (`CPUOffloadingManager`, `lru`); a block
  whose store is in flight or that a load reads is not evicted, and a store that finds no room is
  dropped.
* **Lookup** (`get_num_new_matched_tokens`), when the scan reaches a request that has nothing
  computed: the leading run of its full blocks past the device's prefix-cache hits that the host holds.
  A block whose store is still on the link (`HIT_PENDING`), or a request with a transfer of its own still
  in flight, defers the lookup: the scan skips the request this step, as vLLM's does on `None`.
* **Loads** are asynchronous (vLLM's `WAITING_FOR_REMOTE_KVS`): the request gets its blocks at
  admission, and its blocks are read over the link from the step's start; the scheduler hears of the
  finished load with the first step's output after the link time and promotes it then.
* **The link** is one queue for both directions (`EmulatedLink`): a transfer starts when those before it
  are through and takes bytes / rate. Without an emulated link a CPU's transfer is only its copy.
* **The copy** itself (our `BlockCopier`) runs in the worker when a job is submitted, so on a CPU it
  lengthens the step by bytes / the profile's measured copy bandwidth (out for stores, in for loads); a
  GPU copies on its DMA engine and the step does not wait.

Not modelled: vLLM's flush of a block's pending store before the block is reused (`wait`: the blocks a
step allocates are the free queue's oldest, whose stores finished long before at these rates)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from infercept.benchmarks.sim.request import SimRequest
from engine_adapter.intercept.reports import HostTierReport


@dataclass
class _Load:
    rid: str
    keys: tuple[int, ...]
    done_at: float = -1.0  # set when the step that admitted it starts


class SimHostTier:
    def __init__(self, capacity_blocks: int, block_size: int, block_bytes: int, link_bytes_per_s: float | None,
                 copy_out_bytes_per_s: float | None, copy_in_bytes_per_s: float | None) -> None:
        """`copy_*_bytes_per_s`: the worker's copy bandwidths when copies run on the step's cores (a CPU
        engine), None when they run beside it (a GPU's copy engine)."""
        if capacity_blocks < 0 or block_size < 1 or block_bytes < 1:
            raise ValueError("the host tier needs a non-negative capacity and positive block sizes")
        self.capacity, self.bs, self.block_bytes = capacity_blocks, block_size, block_bytes
        self.link_bytes_per_s = link_bytes_per_s
        self.copy_out_bytes_per_s, self.copy_in_bytes_per_s = copy_out_bytes_per_s, copy_in_bytes_per_s
        self.now = 0.0  # the step being built starts here: what the scheduler knows is done by now
        self._link_free_at = 0.0
        self._keys: OrderedDict[int, float] = OrderedDict()  # key -> when its store is through, oldest use first
        self._reading: dict[int, int] = {}  # key -> loads reading it (not evictable)
        self._stored_upto: dict[str, int] = {}  # request -> blocks considered for storing (vLLM's stored index)
        self._busy_until: dict[str, float] = {}  # request -> when its last store is through
        self._admitted: list[_Load] = []  # loads admitted by the step being built
        self._loads: list[_Load] = []  # loads on the link
        # what the engine's HostTierReport counts
        self.blocks_stored = 0
        self.loads = 0
        self.tokens_loaded = 0
        self.deferred_lookups = 0
        self.dropped_stores = 0

    # ------------------------------------------------------------------ the scheduler's side
    def lookup(self, r: SimRequest, local_blocks: int) -> int | None:
        """Blocks past the `local_blocks` device hits the host can load; None: deferred."""
        if self._busy_until.get(r.rid, 0.0) > self.now:
            self.deferred_lookups += 1
            return None
        hits, pending = 0, False
        for idx in range(local_blocks, r.num_tokens // self.bs):
            done = self._keys.get(r.key + idx)
            if done is None:
                break
            pending |= done > self.now
            hits += 1
        if pending:
            self.deferred_lookups += 1
            return None
        return hits

    def admit_load(self, r: SimRequest, first_block: int, n_blocks: int) -> None:
        """The scheduler gave a request its blocks for `n_blocks` host blocks from `first_block` on."""
        keys = tuple(r.key + i for i in range(first_block, first_block + n_blocks))
        for k in keys:
            self._keys.move_to_end(k)  # vLLM's `touch`
            self._reading[k] = self._reading.get(k, 0) + 1
        self._admitted.append(_Load(r.rid, keys))
        self.loads += 1
        self.tokens_loaded += n_blocks * self.bs

    # ------------------------------------------------------------------ the step
    def start_step(self) -> tuple[int, float]:
        """The step built at `now` starts: the loads it admitted go on the link. Returns how many, and
        what their copies add to the step."""
        nbytes, started = 0, len(self._admitted)
        for load in self._admitted:
            n = len(load.keys) * self.block_bytes
            load.done_at = self._transfer(n, self.now)
            nbytes += n
            self._loads.append(load)
        self._admitted = []
        return started, (nbytes / self.copy_in_bytes_per_s if self.copy_in_bytes_per_s and nbytes else 0.0)

    def plan_stores(self, scheduled: Iterable[SimRequest]) -> list[tuple[str, list[int]]]:
        """The blocks this step completes that the host does not hold yet (issued at its end)."""
        out = []
        for r in scheduled:
            full = r.num_computed // self.bs
            start = self._stored_upto.get(r.rid, 0)
            if full <= start:
                continue
            self._stored_upto[r.rid] = full
            keys = [r.key + i for i in range(start, full) if r.key + i not in self._keys]
            if keys:
                out.append((r.rid, keys))
        return out

    def store_copy_s(self, stores: list[tuple[str, list[int]]]) -> float:
        n = sum(len(keys) for _, keys in stores) * self.block_bytes
        return n / self.copy_out_bytes_per_s if self.copy_out_bytes_per_s and n else 0.0

    def end_step(self, stores: list[tuple[str, list[int]]], now: float) -> None:
        """The step ended at `now`: its stores go on the link."""
        for rid, keys in stores:
            kept = 0
            for k in keys:  # room is made block by block, as vLLM's `prepare_store` evicts
                if self._make_room():
                    self._keys[k] = -1.0  # placeholder until the job's time is known (never ready before it)
                    kept += 1
            self.dropped_stores += len(keys) - kept
            if not kept:
                continue
            done = self._transfer(kept * self.block_bytes, now)
            for k in keys:
                if self._keys.get(k) == -1.0:
                    self._keys[k] = done
            self.blocks_stored += kept
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

    def forget(self, rid: str) -> None:
        """The request finished or was aborted (vLLM's `request_finished`): its host blocks stay."""
        self._stored_upto.pop(rid, None)
        self._busy_until.pop(rid, None)

    def abort_all(self) -> None:
        self._stored_upto.clear()
        self._busy_until.clear()
        self._admitted, self._loads, self._reading = [], [], {}

    def report(self) -> HostTierReport:
        return HostTierReport(host_blocks=self.capacity, blocks_stored=self.blocks_stored, loads=self.loads,
                              tokens_loaded=self.tokens_loaded)

    # ------------------------------------------------------------------ internals
    def _transfer(self, nbytes: int, started: float) -> float:
        if not self.link_bytes_per_s:
            return started
        begin = max(started, self._link_free_at)
        self._link_free_at = begin + nbytes / self.link_bytes_per_s
        return self._link_free_at

    def _make_room(self) -> bool:
        """Room for one more block, evicting the least recently used block that no transfer holds."""
        if len(self._keys) < self.capacity:
            return True
        for k, done in self._keys.items():
            if 0.0 <= done <= self.now and k not in self._reading:
                del self._keys[k]
                return True
        return False
