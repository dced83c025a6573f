"""vLLM's `OffloadingConnector` as the `vllm-offload` policy runs it: vLLM's scheduler side, hashing and
LRU host-chunk manager unchanged (`infercept-offload`: with `host_tier.SessionEndLRU` instead of the LRU),
our data mover (`host_tier.py`), and two small additions.

* Stores are issued at the step's barrier (`wait_for_save`), not at the next step's start. vLLM defers
  them so that a GPU's copies start after the sampled tokens' transfers; its safety rests on a freed
  block's pending stores being flushed before the block is reused, which it arranges for finished and
  preempted requests. Our pause frees a paused request's blocks (`InterceptCore.free` ->
  `VllmPort.release`) without finishing the request, so a store deferred past the pause could read a
  block the next step already overwrote. Issued at the barrier, a step's stores have copied their bytes
  before the scheduler sees the step's output, let alone frees anything; in time it is the same moment
  (the end of step N is the start of step N+1), and the emulated link still carries them asynchronously.
* The scheduler side counts what the host tier did (`HostTierReport`: blocks stored, loads and the
  tokens they brought back), which the engine's stats report.

Loaded by vLLM from `kv_transfer_config` (`kv_connector="InterceptOffloadingConnector"`,
`kv_connector_module_path="engine_adapter.offload_connector"`), one instance per role.

vLLM 0.32 internals relied on: `OffloadingConnector.{connector_worker, connector_scheduler}`,
`OffloadingConnectorWorker.start_kv_transfers` (submits the stores queued by `prepare_store_kv`, and the
loads of the metadata it is given), `OffloadingConnectorMetadata(load_jobs, store_jobs)`, `build_offloading_config`,
`GPULoadStoreSpec.block_ids`, `KVCacheBlocks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

from engine_adapter.config import host_chunks
from engine_adapter.host_tier import SPEC_MODULE_PATH, SPEC_NAME, InterceptHostTierSpec
from engine_adapter.intercept.reports import HostTierReport

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

CONNECTOR_NAME = "InterceptOffloadingConnector"
MODULE_PATH = "engine_adapter.offload_connector"


def extra_config(swap_space_gib: float, link_bytes_per_s: float | None, eviction_policy: str = "lru") -> dict[str, Any]:
    """`kv_connector_extra_config` of the host tier: our spec, the swap policies' buffer size and link,
    the eviction policy (vLLM's LRU, or `host_tier.SessionEndLRU`), and generated tokens stored too (vLLM's
    default stores only prompts)."""
    return {
        "spec_name": SPEC_NAME,
        "spec_module_path": SPEC_MODULE_PATH,
        "swap_space_gib": swap_space_gib,
        "link_bytes_per_s": link_bytes_per_s,
        "eviction_policy": eviction_policy,
        "offload_prompt_only": False,
        "blocks_per_chunk": 1,
    }


class InterceptOffloadingConnector(OffloadingConnector):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = build_offloading_config(vllm_config, kv_cache_config)
        spec = InterceptHostTierSpec(cfg)
        self._host_blocks = host_chunks(spec.swap_space_bytes, cfg.worker_kv_bytes_per_block)
        self._eviction = spec.eviction_policy
        self._blocks_stored = 0
        self._loads = 0
        self._tokens_loaded = 0

    # ============================================================== worker side
    def wait_for_save(self) -> None:
        super().wait_for_save()  # queues this step's stores
        assert self.connector_worker is not None
        # Issue them now (see the module docstring); no loads ride along.
        self.connector_worker.start_kv_transfers(OffloadingConnectorMetadata(load_jobs={}, store_jobs={}))

    # ============================================================== scheduler side
    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens:
            self._loads += 1
            self._tokens_loaded += num_external_tokens

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)
        if isinstance(meta, OffloadingConnectorMetadata):
            self._blocks_stored += sum(len(job.src_spec.block_ids) for job in meta.store_jobs.values())
        return meta

    def host_tier_report(self) -> HostTierReport:
        return HostTierReport(host_blocks=self._host_blocks, blocks_stored=self._blocks_stored,
                              loads=self._loads, tokens_loaded=self._tokens_loaded, eviction=self._eviction)
