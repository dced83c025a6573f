"""The data mover of the `vllm-offload` policy's host KV tier: an `OffloadingSpec` for vLLM's own
`OffloadingConnector` that runs on the CPU backend.

vLLM 0.32's host tier (`--kv-offloading-backend native`) is its `OffloadingConnector` with
`CPUOffloadingSpec`, whose worker is CUDA/XPU only (`vllm/v1/kv_offload/cpu/spec.py` raises,
`cpu/gpu_worker.py` asserts). Here only the worker is ours: the scheduler side (which blocks to store,
lookup by block hash, when to load) is vLLM's `OffloadingConnectorScheduler`, the host-chunk bookkeeping
and eviction are vLLM's `CPUOffloadingManager` with its `lru` policy. vLLM loads this spec by name from
`kv_connector_extra_config` (`spec_name`, `spec_module_path`: `OffloadingSpecFactory`).

Sized and linked like the `swap` policies' host buffer: `swap_space_gib` of host memory in whole-block
chunks (`blocks_per_chunk` must be 1, so a chunk is exactly one swap slot), copied with `kv_copy.BlockCopier`,
over the same emulated link (`link_bytes_per_s`). The link is an asynchronous copy engine, as a GPU's DMA
engine is to vLLM's worker: each copy's bytes take `bytes / link` on one link shared by both directions,
behind the copies queued before it, and a job is reported finished only once its link time has passed,
while the forward passes go on. The bytes themselves move at submit time (so nothing a later step writes
can reach a copy in flight); `wait` (vLLM's flush before reusing a block) sleeps out the link time left.

Eviction: vLLM's `lru`, or `SessionEndLRU` (`eviction_policy: "SessionEndLRU"`), vLLM's LRU except that
a finished request's blocks are evicted first instead of becoming the most recently used (below).

vLLM 0.32 internals relied on (all public names): `OffloadingSpec`, `OffloadingWorker`,
`TransferResult`, `GPULoadStoreSpec.block_ids`, `CanonicalKVCaches.tensors[*].tensor` (`[num_blocks, page
bytes]` int8 views), `OffloadingConfig.{worker_kv_bytes_per_block, cache.blocks_per_chunk, extra_config}`,
`vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager` (its `cache_policy_module_path` for ours),
`vllm.v1.kv_offload.cpu.common.CPULoadStoreSpec`; `LRUCachePolicy` (its privates through
`vllm_port.lru_set_ranks`), its `chunks`, and `order_request_keys` (`vllm/v1/kv_offload/cpu/policies/`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import order_request_keys
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from engine_adapter.config import host_chunks
from engine_adapter.kv_copy import BlockCopier, env_ranks_on_host
from engine_adapter.policy.table import HOST_TIER_EVICTIONS, SESSION_END_LRU
from engine_adapter.vllm_port import lru_set_ranks

SPEC_NAME = "InterceptHostTierSpec"
SPEC_MODULE_PATH = "engine_adapter.host_tier"


class SessionEndLRU(LRUCachePolicy):
    """vLLM's LRU for agent sessions. An agent session is one vLLM request for its whole life (each turn
    resumes it), so a request finishes when its session ends, and vLLM's LRU then makes every block it
    stored the most recently used: the contexts of sessions that ended, which nothing reads again unless
    another request shares their prefix, are kept over those of sessions paused in a call, which come back
    within seconds. Here a finished request's blocks are evicted first instead: below every rank vLLM's
    LRU gives (those count up from 0), the earliest finished first, each request's last block before its
    first (a load needs a leading run of blocks). A block a live request touches again gets a live rank.
    (A session also ends its request when a turn is aborted, and goes on with a new one: that one's prefix
    hits find the old blocks while they last, first in line for eviction.)

    At the paper's scale in the simulator (`results/sim/paper_offload/`: GPT-J-6B, 128 GiB of host memory)
    this moves `vllm-offload`'s host tier from 2.75 to 3.75 req/s (vLLM's LRU evicts contexts before their
    sessions return, and the recompute tips the engine over)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._ended_rank = -(1 << 62)

    def on_request_finished(self, key_groups: Any, insertion_only_keys: set[Any], reused_keys: set[Any],
                            req_context: Any) -> None:
        del insertion_only_keys, reused_keys
        self._ended_rank = lru_set_ranks(self, reversed(order_request_keys(key_groups, req_context)), self._ended_rank)


class InterceptHostTierSpec(OffloadingSpec):
    """`kv_connector_extra_config`: `swap_space_gib` (host buffer per worker), `link_bytes_per_s` (None:
    unthrottled), `eviction_policy` (`lru`, vLLM's, the default; or `SessionEndLRU`), and vLLM's own keys
    (`offload_prompt_only`)."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        if self.blocks_per_chunk != 1:
            raise ValueError("the host tier stores whole KV blocks: blocks_per_chunk must be 1")
        self.swap_space_bytes = int(float(self.extra_config.get("swap_space_gib", 1.0)) * 2**30)
        link = self.extra_config.get("link_bytes_per_s")
        self.link_bytes_per_s: float | None = float(link) if link else None
        self.num_chunks = host_chunks(self.swap_space_bytes, config.worker_kv_bytes_per_block)
        self.eviction_policy = str(self.extra_config.get("eviction_policy", "lru"))
        if self.eviction_policy not in HOST_TIER_EVICTIONS:
            raise ValueError(f"host tier: unknown eviction_policy {self.eviction_policy!r}; "
                             f"choose one of {', '.join(HOST_TIER_EVICTIONS)}")
        self._manager: OffloadingManager | None = None
        self._worker: HostTierWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = CPUOffloadingManager(
                num_chunks=self.num_chunks, cache_policy=self.eviction_policy,
                cache_policy_module_path=SPEC_MODULE_PATH if self.eviction_policy == SESSION_END_LRU else None,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=0,  # vLLM's default: every offered block is stored
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            ranks = max(env_ranks_on_host(), self.config.parallel.world_size)
            self._worker = HostTierWorker(kv_caches, self.num_chunks, self.link_bytes_per_s, ranks_on_host=ranks)
        return self._worker


@dataclass
class _Job:
    job_id: int
    done_at: float  # when the emulated link has carried its bytes (perf_counter seconds)
    nbytes: int
    seconds: float  # its link time (the copy itself included)


class EmulatedLink:
    """One link for both directions: a transfer starts when the ones queued before it are through."""

    def __init__(self, bytes_per_s: float | None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.bytes_per_s = bytes_per_s
        self.clock = clock
        self.free_at = 0.0

    def transfer(self, nbytes: int, started: float) -> float:
        """When a transfer of `nbytes` whose copy began at `started` (and ran until now) is done."""
        now = self.clock()
        if not self.bytes_per_s:
            return now
        begin = max(started, self.free_at)
        self.free_at = max(now, begin + nbytes / self.bytes_per_s)
        return self.free_at


class HostTierWorker(OffloadingWorker):
    """Copies whole blocks between vLLM's KV cache tensors and one exact-size host buffer (chunk i is
    host slot i of a `BlockCopier`)."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int, link_bytes_per_s: float | None,
                 ranks_on_host: int = 1, clock: Callable[[], float] = time.perf_counter) -> None:
        tensors = [t.tensor for t in kv_caches.tensors]
        if not tensors:
            raise ValueError("host tier: no KV cache tensors to offload")
        num_blocks = tensors[0].shape[0]
        if any(t.dim() != 2 or t.shape[0] != num_blocks for t in tensors):
            raise ValueError("host tier: expected [num_blocks, page bytes] block views of equal length")
        # The canonical views as BlockCopier's [blocks, 1, 1, bytes] layer views: one region each in the host buffer.
        views = {f"kv{i}": t[:, None, None, :] for i, t in enumerate(tensors)}
        self.copier = BlockCopier(views, num_blocks, num_chunks, ranks_on_host=ranks_on_host)
        self.num_chunks = num_chunks
        self.link = EmulatedLink(link_bytes_per_s, clock)
        self.clock = clock
        self._pending: list[_Job] = []

    @property
    def block_bytes(self) -> int:
        return self.copier.slot_bytes

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, CPULoadStoreSpec)
        pairs = _pairs(src_spec.block_ids, dst_spec.block_ids)
        return self._run(job_id, lambda: (self.copier.begin_step(swap_out=pairs), self.copier.copy_out_all()))

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, CPULoadStoreSpec)
        pairs = _pairs(dst_spec.block_ids, src_spec.block_ids)
        return self._run(job_id, lambda: (self.copier.begin_step(swap_in=pairs), self.copier.copy_in()))

    def _run(self, job_id: int, issue: Callable[[], Any]) -> bool:
        started = self.clock()
        issue()
        self.copier.finish()
        nbytes, self.copier.bytes_moved = self.copier.bytes_moved, 0
        done_at = self.link.transfer(nbytes, started)
        self._pending.append(_Job(job_id, done_at, nbytes, done_at - started))
        return True

    def get_finished(self) -> list[TransferResult]:
        now = self.clock()
        done = [j for j in self._pending if j.done_at <= now]
        self._pending = [j for j in self._pending if j.done_at > now]
        return [TransferResult(j.job_id, True, j.nbytes, j.seconds) for j in done]

    def wait(self, job_ids: set[int]) -> None:
        """vLLM's flush: block until these jobs' link time has passed (the step waits for the link)."""
        until = max((j.done_at for j in self._pending if j.job_id in job_ids), default=0.0)
        left = until - self.clock()
        if left > 0:
            time.sleep(left)


def _pairs(src: Any, dst: Any) -> list[tuple[int, int]]:
    """(device block, host chunk) pairs of one job: one chunk per block (blocks_per_chunk == 1)."""
    if len(src) != len(dst):
        raise ValueError(f"host tier: {len(src)} blocks for {len(dst)} chunks")
    return [(int(d), int(h)) for d, h in zip(src, dst)]


def host_tensor_bytes(worker: HostTierWorker) -> int:
    """Bytes of the host buffer the worker allocated (exactly `num_chunks` blocks)."""
    return int(worker.copier.host.numel()) * worker.copier.host.element_size()

