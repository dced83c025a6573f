"""Swap transport: a vLLM KV connector that moves paused requests' KV blocks to a host buffer and back.

Loaded by vLLM from `kv_transfer_config` (`kv_connector="InterceptSwapConnector"`,
`kv_connector_module_path="engine_adapter.swap_connector"`), one instance per role:

* scheduler role (in the engine core): a thin adapter over the intercept core (`bind_core`), which owns
  the host slots and decides who moves how much per step. Swap-ins go through vLLM's asynchronous
  KV-load path: `get_num_new_matched_tokens` answers (tokens, async) for an armed request, vLLM
  allocates its blocks and parks it in WAITING_FOR_REMOTE_KVS (`update_state_after_alloc`), and the
  core ships its blocks over as many steps as the per-step swap-in budget needs; the worker reports it
  loaded after its last chunk. `build_connector_meta` ships each step's copies.
* worker role (next to the model runner): holds the KV tensors and the host buffer (`kv_copy.py`).
  Swap-out of layer L is issued in `save_kv_layer(L)`, right after layer L's attention, so the copy
  overlaps the remaining layers' compute. The core releases a context's device blocks in the step that
  copies its last blocks, so vLLM may hand them to other requests in that very step; those copies
  (`swap_out_first`: released blocks vLLM reallocated) must read the blocks before the forward pass
  writes them. For such a step `build_connector_meta` asks vLLM to call `start_load_kv` before the
  forward (`SchedulerOutput.has_sync_kv_loads`, as vLLM's HiSparse connector does), which gathers them
  from every layer and makes the compute stream wait for those gathers only; their transfer to the host
  overlaps the forward (`BlockCopier.copy_out_before_writes`). Swap-in chunks are issued in
  `start_load_kv` when vLLM calls it after launching the forward, or else in `wait_for_save` (the
  loading request does not compute in that step). `wait_for_save` is the step's barrier. A step without
  a forward pass copies everything there. Where copies are synchronous (the CPU copier, and an emulated
  link's wait), the worker measures what they added to the step and reports it through vLLM's connector
  stats (`SwapStallStats`); the scheduler meters that stall instead of the core's estimate.

vLLM 0.32 internals relied on: `KVConnectorBase_V1` (the hooks above, `request_finished`,
`get_finished`, `get_kv_connector_stats` and `build_kv_connector_stats`; the step's stats reach the
scheduler as `ModelRunnerOutput.kv_connector_output.kv_connector_stats`, concatenated across workers
by `aggregate`), `KVConnectorStats`, `KVConnectorMetadata`, `KVCacheBlocks.get_block_ids()`, `KVCacheConfig.{num_blocks,
kv_cache_groups[*].kv_cache_spec.page_size_bytes}`, and the worker's per-layer KV tensors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from engine_adapter.vllm_port import connector_metadata

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

    from engine_adapter.intercept.core import InterceptCore
    from engine_adapter.kv_copy import BlockCopier

CONNECTOR_NAME = "InterceptSwapConnector"
MODULE_PATH = "engine_adapter.swap_connector"


@dataclass
class SwapMeta(KVConnectorMetadata):
    host_slots: int
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, host slot)
    swap_out_first: list[tuple[int, int]] = field(default_factory=list)  # before the forward writes them
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    loads_done: list[str] = field(default_factory=list)  # requests whose last chunk is in this step


@dataclass
class SwapStallStats(KVConnectorStats):
    """What one step's swap copies added to it, and the forward window they could hide behind, measured
    by the workers (`data["stall_s"]`, `data["window_s"]`: one value per worker and step; vLLM
    concatenates them across workers, and across steps for its stats logger)."""

    def reset(self) -> None:
        self.data = {"stall_s": [], "window_s": []}

    def aggregate(self, other: KVConnectorStats) -> SwapStallStats:
        return SwapStallStats({k: [*self.data.get(k, []), *other.data.get(k, [])] for k in ("stall_s", "window_s")})

    def reduce(self) -> dict[str, int | float]:
        xs = self.data.get("stall_s", [])
        return {"swap_stall_s": round(sum(xs), 6), "steps_with_copies": len(xs)}

    def is_empty(self) -> bool:
        return not self.data.get("stall_s")


def measured_stall_and_window(model_runner_output: Any) -> tuple[float | None, float | None]:
    """The step's measured swap stall (the slowest worker's) and forward window (the shortest), or None
    where the workers did not measure them (no copies in the step, or copies on a CUDA side stream: see
    `InterceptSwapConnector`)."""
    kvo = getattr(model_runner_output, "kv_connector_output", None)
    stats = getattr(kvo, "kv_connector_stats", None)
    if isinstance(stats, SwapStallStats) and not stats.is_empty():
        windows = stats.data.get("window_s") or []
        return max(stats.data["stall_s"]), (min(windows) if windows else None)
    return None, None


def kv_block_bytes(kv_cache_config: KVCacheConfig) -> int:
    """Bytes of KV one block holds across every layer (one host slot; M = this / block_size)."""
    return sum(len(g.layer_names) * g.kv_cache_spec.page_size_bytes for g in kv_cache_config.kv_cache_groups)


class InterceptSwapConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.swap_space_bytes = int(float(extra.get("swap_space_gib", 1.0)) * 2**30)
        link = extra.get("link_bytes_per_s")
        self.link_bytes_per_s: float | None = float(link) if link else None
        self._kv_cfg = kv_cache_config
        self.core: InterceptCore | None = None  # scheduler role
        self.copier: BlockCopier | None = None  # worker role
        self._saved: set[str] = set()
        self._loaded_step = False
        self._done_loads: set[str] = set()
        self._first_done = False
        self._step_started = time.perf_counter()
        self._stall_s: float | None = None  # this step's measured stall (worker; synchronous copies only)
        self._window_s = 0.0  # this step's forward window (worker)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return SwapStallStats(data=dict(data or {}))

    # ============================================================== scheduler side
    @property
    def host_slots(self) -> int:
        assert self._kv_cfg is not None
        return max(0, self.swap_space_bytes // max(1, kv_block_bytes(self._kv_cfg)))

    def bind_core(self, core: InterceptCore) -> None:
        self.core = core

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.core.load_lookup(request.request_id, num_computed_tokens) if self.core else (0, False)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if self.core is not None:
            self.core.load_allocated(request.request_id, list(blocks.get_block_ids()[0]), num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self.core is None:
            return SwapMeta(host_slots=0)
        c = self.core.step_copies()
        if c.swap_out_first:
            scheduler_output.has_sync_kv_loads = True  # start_load_kv before the forward pass
        return SwapMeta(host_slots=self.host_slots, swap_out=c.swap_out, swap_out_first=c.swap_out_first,
                        swap_in=c.swap_in, loads_done=c.loads_done)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None  # the intercept core already forgot it (InterceptScheduler._free_request)

    # ============================================================== worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from engine_adapter.kv_copy import BlockCopier, block_dims

        num_blocks = self._kv_cfg.num_blocks if self._kv_cfg is not None else None
        self.copier = BlockCopier(dict(kv_caches), block_dims(kv_caches, num_blocks), host_slots=0)

    def _meta(self) -> SwapMeta | None:
        if not self.has_connector_metadata():
            return None
        meta = connector_metadata(self)
        if not isinstance(meta, SwapMeta) or not (meta.swap_in or meta.swap_out or meta.swap_out_first or meta.loads_done):
            return None
        return meta

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._saved.clear()
        self._loaded_step = False
        self._first_done = False
        self._step_started = time.perf_counter()
        self._stall_s = None
        if self.copier is not None and isinstance(connector_metadata, SwapMeta) and connector_metadata.host_slots:
            self.copier.host_slots = connector_metadata.host_slots

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is None or self.copier is None:
            return
        if meta.swap_out_first and not self._first_done:
            # Called before the forward pass (the step asked for it): swap-ins wait for `wait_for_save`,
            # off the forward's critical path.
            self._copy_reused(meta)
            return
        self._load(meta)

    def _copy_reused(self, meta: SwapMeta) -> None:
        """Released blocks vLLM gave to other requests in this step: read before the forward writes them."""
        if self._first_done or self.copier is None:
            return
        self._first_done = True
        with self._timed():
            self.copier.copy_out_before_writes(meta.swap_out_first)

    def _load(self, meta: SwapMeta) -> None:
        if self._loaded_step or self.copier is None:
            return
        self._loaded_step = True
        with self._timed():
            for name in self.copier.kv:
                self.copier.copy_in(name, meta.swap_in)
        self._done_loads.update(meta.loads_done)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: the loading request does not compute in this step

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is not None and meta.swap_out_first and not self._first_done:
            # vLLM ran the forward before start_load_kv although the step asked otherwise: reused blocks
            # were overwritten before their copy. Fail loudly rather than resume a corrupt context.
            raise RuntimeError("swap-out of reused blocks was not issued before the forward pass")
        if meta is None or not meta.swap_out or layer_name in self._saved or self.copier is None:
            return
        with self._timed():
            self.copier.copy_out(layer_name, meta.swap_out)
        self._saved.add(layer_name)

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is not None and self.copier is not None:
            # A step without a forward pass (or layers without the hooks) still moves everything; the
            # swap-ins of a step whose start_load_kv ran before the forward are issued here.
            self._copy_reused(meta)
            for name in self.copier.kv:
                if meta.swap_out and name not in self._saved:
                    self.save_kv_layer(name, self.copier.kv[name], None)
            self._load(meta)
        if self.copier is None:
            return
        # The forward window: what this step's copies could hide behind (the copier's own synchronous
        # work in it included, as the emulated link counts it).
        self._window_s = time.perf_counter() - self._step_started
        moved = self.copier.bytes_moved
        with self._timed() if meta is not None else nullcontext():
            self.copier.finish()
        if self.link_bytes_per_s and moved:
            # Emulated link: this step's copies take bytes / bandwidth, overlapped with the forward
            # pass; only the part that outlasts it holds the step back.
            self.copier.bytes_moved = 0
            left = moved / self.link_bytes_per_s - (time.perf_counter() - self._step_started)
            if left > 0:
                with self._timed():
                    time.sleep(left)
        self.copier.bytes_moved = 0

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Adds the block's wall time to the step's measured stall, where copies are synchronous (the
        CPU copier: they run on the cores the forward pass uses, so all of their time delays the step;
        an emulated link's wait too). On CUDA they run on a side stream beside the forward pass, and the
        host's time in them says nothing about what they added to the step: not measured there (the
        intercept core estimates it from the profile's bandwidth)."""
        if self.copier is None or self.copier.stream is not None:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._stall_s = (self._stall_s or 0.0) + time.perf_counter() - t0

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        # Worker: called after wait_for_save, once per step. Scheduler: nothing of its own to add.
        if self._stall_s is None:
            return None
        stall, self._stall_s = self._stall_s, None
        return SwapStallStats({"stall_s": [stall], "window_s": [self._window_s]})

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # Called after wait_for_save in the same step: this step's copies are complete.
        done, self._done_loads = self._done_loads, set()
        return None, (done or None)
