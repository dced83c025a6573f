"""Swap transport: a vLLM KV connector that moves paused requests' KV blocks to a host buffer and back.

Loaded by vLLM from `kv_transfer_config` (`kv_connector="InterceptSwapConnector"`,
`kv_connector_module_path="engine_adapter.swap_connector"`), one instance per role:

* scheduler role (in the engine core): a thin adapter over the intercept core (`bind_core`), which owns
  the host slots and decides who moves how much per step. Swap-ins go through vLLM's asynchronous
  KV-load path: `get_num_new_matched_tokens` answers (tokens, async) for an armed request, vLLM
  allocates its blocks and parks it in WAITING_FOR_REMOTE_KVS (`update_state_after_alloc`), and the
  core ships its blocks over as many steps as the per-step swap-in budget needs; the worker reports it
  loaded after its last chunk. `build_connector_meta` ships each step's copies.
* worker role (next to the model runner): holds the KV tensors and the host buffer (`kv_copy.py`:
  one exact-size buffer, pinned on CUDA, allocated in `register_kv_caches`). `bind_connector_metadata`
  (before vLLM launches the forward pass) fences the step's copies after the work queued so far and
  uploads their block indices. The core releases a context's device blocks in the step that copies its
  last blocks, so vLLM may hand them to other requests in that very step; those copies
  (`swap_out_first`) are gathered there and the compute stream waits for the gathers only. Swap-out of
  layer L is issued in `save_kv_layer(L)`; swap-in chunks in `start_load_kv`, which vLLM calls right
  after launching the forward pass (the loading request does not compute in that step): both run on a
  side stream beside the whole forward pass. `wait_for_save` is the step's barrier and issues what the
  hooks did not (a step without a forward pass, a full CUDA graph). The worker measures what the
  copies added to the step (CPU: their wall time, they run on the forward's cores; CUDA: the side
  stream's end past the compute stream's, with events; an emulated link's wait) and reports it through
  vLLM's connector stats (`SwapStallStats`); the scheduler meters that stall instead of the core's
  estimate.

vLLM 0.32 internals relied on: `KVConnectorBase_V1` (the hooks above, `request_finished`,
`get_finished`, `get_kv_connector_stats` and `build_kv_connector_stats`; the step's stats reach the
scheduler as `ModelRunnerOutput.kv_connector_output.kv_connector_stats`, concatenated across workers
by `aggregate`), `KVConnectorStats`, `KVConnectorMetadata`, `KVCacheBlocks.get_block_ids()`, `KVCacheConfig.{num_blocks,
kv_cache_groups[*].kv_cache_spec.page_size_bytes, kv_cache_tensors}`, the worker's per-layer KV views
(`[B * r, H, N, C]`, `vllm/v1/kv_cache_interface.py`), `requires_piecewise_for_cudagraph`.
"""

from __future__ import annotations

import functools
import time
from collections import deque
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

from engine_adapter.config import host_chunks
from engine_adapter.vllm_port import connector_metadata, connector_vllm_config

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


def check_supported(kv_cache_config: KVCacheConfig, vllm_config: Any) -> None:
    """Refuse at start, with the reason, the KV caches the swap path cannot copy correctly (see
    docs/gpu.md for the table). Handled, not refused: fp8 KV (copied as bytes), KV-sharing layers
    (copied once per tensor), kernel-block splitting (the view's block axis is grouped)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(f"swap connector: {len(groups)} KV cache groups (a hybrid model: sliding-window, "
                         "Mamba or cross-attention layers beside full attention); only one group is supported")
    spec = groups[0].kv_cache_spec
    if not hasattr(spec, "num_kv_heads") or not getattr(spec, "has_layer_views", True):
        raise ValueError(f"swap connector: KV cache spec {type(spec).__name__} has no per-layer block views")
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        # vLLM zeroes newly allocated blocks on the compute stream before the step's bind; a block released
        # by a swap-out and reused in the same step would then be gathered after its zeroing.
        raise ValueError("swap connector: KV caches whose new blocks vLLM zeroes (Mamba layers, mixed-precision "
                         "caches) are not supported")
    if any(getattr(t, "host_resident", False) for t in kv_cache_config.kv_cache_tensors):
        raise ValueError("swap connector: host-resident KV tensors (HiSparse) are not supported")
    tp = vllm_config.parallel_config.tensor_parallel_size
    if tp > 1 and (type(spec).__name__.startswith("MLA") or getattr(kv_cache_config, "kv_tp_replicas", 1) > 1):
        import logging

        logging.getLogger(__name__).warning(
            "swap connector: the KV cache (MLA latent) is replicated on all %d tensor-parallel ranks; every "
            "rank swaps its own replica (host memory and PCIe traffic x%d)", tp, tp)


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
        self._done_loads: set[str] = set()
        self._step_started = time.perf_counter()
        self._stall_s: float | None = None  # this step's measured stall (worker; synchronous copies only)
        self._window_s: float | None = 0.0  # this step's forward window (worker)
        # Steps whose barrier ran but whose stall was not yet reported, oldest first: vLLM asks for the stats
        # after the barrier, except where it defers the barrier (speculative decoding), which asks before it.
        self._unreported: deque[tuple[float, float | None]] = deque()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return SwapStallStats(data=dict(data or {}))

    # ============================================================== scheduler side
    @functools.cached_property
    def host_slots(self) -> int:
        # Computed once: it is read every step (`build_connector_meta`), and vLLM's page size makes a
        # tensor per call (`get_dtype_size`): it was 0.43 ms of every step's schedule() on the CPU
        # engine under `infercept` at 4 req/s (timed step log and py-spy, docs/results.md "Session 13").
        assert self._kv_cfg is not None
        return host_chunks(self.swap_space_bytes, kv_block_bytes(self._kv_cfg))

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
        return SwapMeta(host_slots=self.host_slots, swap_out=c.swap_out, swap_out_first=c.swap_out_first,
                        swap_in=c.swap_in, loads_done=c.loads_done)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None  # the intercept core already forgot it (InterceptScheduler._free_request)

    # ============================================================== worker side
    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # The per-layer hooks issue each layer's swap-out while later layers compute; under piecewise
        # CUDA graphs vLLM runs attention (and these hooks) eagerly between the graph pieces.
        return True

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from engine_adapter.kv_copy import BlockCopier, env_ranks_on_host

        assert self._kv_cfg is not None, "the worker's connector needs vLLM's KVCacheConfig"
        vllm_config = connector_vllm_config(self)
        check_supported(self._kv_cfg, vllm_config)
        pc = vllm_config.parallel_config
        ranks = max(env_ranks_on_host(), pc.tensor_parallel_size * pc.pipeline_parallel_size)
        # The whole host buffer now, exactly sized (pinned on CUDA), not at the first swap.
        self.copier = BlockCopier(dict(kv_caches), self._kv_cfg.num_blocks, self.host_slots, ranks_on_host=ranks)

    def _meta(self) -> SwapMeta | None:
        if not self.has_connector_metadata():
            return None
        meta = connector_metadata(self)
        if not isinstance(meta, SwapMeta) or not (meta.swap_in or meta.swap_out or meta.swap_out_first or meta.loads_done):
            return None
        return meta

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        """Before the forward pass is launched: fence the copies after the work queued so far, and copy out
        the released blocks this step's forward reuses (the compute stream waits for their gathers)."""
        super().bind_connector_metadata(connector_metadata)
        self._step_started = time.perf_counter()
        self._stall_s = None
        meta = self._meta()
        if meta is None or self.copier is None:
            return
        if meta.host_slots > self.copier.host_slots:
            raise RuntimeError(f"the scheduler plans {meta.host_slots} host slots, the worker has {self.copier.host_slots}")
        with self._timed():
            self.copier.begin_step(meta.swap_out, meta.swap_out_first, meta.swap_in)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        # vLLM calls it right after launching the forward pass: the loads run beside it.
        if self._meta() is not None:
            self._load()

    def _load(self) -> None:
        if self.copier is None:
            return
        with self._timed():
            self.copier.copy_in()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: the loading request does not compute in this step

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is None or not meta.swap_out or self.copier is None or layer_name not in self.copier.canonical:
            return
        with self._timed():
            self.copier.copy_out(layer_name)

    def wait_for_save(self) -> None:
        """The step's barrier: this step's copies are complete when it returns."""
        meta = self._meta()
        if self.copier is None:
            return
        if meta is not None:
            # Layers whose hooks did not run (a step without a forward pass, or a full CUDA graph) and the
            # loads of a step where vLLM did not call start_load_kv: issued now (each copy once).
            with self._timed():
                self.copier.copy_out_all()
            self._load()
        # The forward window: what this step's copies could hide behind (the copier's own synchronous
        # work in it included, as the emulated link counts it).
        self._window_s = time.perf_counter() - self._step_started
        moved = self.copier.bytes_moved
        with self._timed() if meta is not None else nullcontext():
            self.copier.finish()
        if self.copier.stats_ms is not None:
            # CUDA: measured on the GPU from the bind event: the copies' end past the compute stream's (0
            # where the compute stream was still busy; its window is then unknown).
            copies_ms, compute_ms = self.copier.stats_ms
            self._stall_s = max(0.0, copies_ms - compute_ms) / 1e3 if compute_ms is not None else 0.0
            self._window_s = compute_ms / 1e3 if compute_ms is not None else None
        if self.link_bytes_per_s and moved:
            # Emulated link: this step's copies take bytes / bandwidth, overlapped with the forward
            # pass; only the part that outlasts it holds the step back.
            left = moved / self.link_bytes_per_s - (time.perf_counter() - self._step_started)
            if left > 0:
                t0 = time.perf_counter()
                time.sleep(left)
                self._stall_s = (self._stall_s or 0.0) + time.perf_counter() - t0
        self.copier.bytes_moved = 0
        if meta is not None:
            # Reported by get_finished only now that their copies are complete (vLLM may ask before the barrier).
            self._done_loads.update(meta.loads_done)
        if self._stall_s is not None:
            self._unreported.append((self._stall_s, self._window_s))
            self._stall_s = None

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Adds the block's wall time to the step's measured stall where copies are synchronous (the CPU
        copier: they run on the cores the forward pass uses, so all of their time delays the step). On
        CUDA the copies run on a side stream and the GPU's events measure them (`wait_for_save`)."""
        if self.copier is None or self.copier.streams.deferred:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._stall_s = (self._stall_s or 0.0) + time.perf_counter() - t0

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        # Worker: called after wait_for_save, once per step. Scheduler: nothing of its own to add.
        # One step per report (a report's list holds one entry per worker, reduced by the slowest); a step
        # whose stats were asked for before its barrier is reported at the next ask.
        if not self._unreported:
            return None
        stall, window = self._unreported.popleft()
        return SwapStallStats({"stall_s": [stall], "window_s": [window] if window is not None else []})

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # The loads whose copies completed at a barrier that has run (this step's, where vLLM calls this after
        # wait_for_save; the previous step's where it defers the barrier).
        done, self._done_loads = self._done_loads, set()
        return None, (done or None)
