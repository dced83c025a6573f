"""Swap: paused requests' KV blocks copied to a host buffer and back, through a vLLM KV connector.

Loaded by vLLM from `kv_transfer_config` (`kv_connector="InterceptSwapConnector"`,
`kv_connector_module_path="engine_adapter.swap_connector"`), one instance per role:

* scheduler role (in the engine core, next to `InterceptScheduler`): owns the host buffer's slot map
  (one slot = one KV block, all layers). The scheduler plans swap-outs (`plan_swap_out`); swap-ins go
  through vLLM's asynchronous KV-load path: `get_num_new_matched_tokens` answers (tokens, async) for an
  armed request, vLLM allocates its blocks and parks it in WAITING_FOR_REMOTE_KVS, and the connector
  ships its blocks over as many steps as the per-step swap-in budget needs (`in_budget_blocks`);
  the worker reports it loaded after its last chunk. `build_connector_meta` ships each step's copies.
* worker role (next to the model runner): holds the real KV tensors (`register_kv_caches`) and a host
  buffer per layer. Swap-out moves layer L in `save_kv_layer(L)`, right after layer L's attention, so
  the copy overlaps the remaining layers' compute; swap-in chunks are copied in `start_load_kv`, which
  vLLM calls after launching the forward for asynchronous loads (the loading request does not compute
  in that step). On CUDA all copies run on a side stream with pinned host memory; `wait_for_save` is
  the barrier before the step reports. A step without a forward pass copies everything there.

Only full blocks travel: a context's partial last block (< block_size tokens) is recomputed at the
resume. That keeps the copy layout-agnostic (whole blocks along the block dimension).

Safety: a swapped-out block stays owned by its paused request until the step that copied it has
finished; the scheduler frees it only in a later step. A swapped-in block is written before any layer
reads it (`wait_for_layer_load` blocks until that layer's copy is done).

vLLM 0.32 internals relied on: `KVConnectorBase_V1` (above hooks, `build_connector_meta`,
`get_num_new_matched_tokens`, `update_state_after_alloc`, `request_finished`), `KVConnectorMetadata`,
`KVCacheBlocks.get_block_ids()`, `KVCacheConfig.{num_blocks, kv_cache_groups[*].kv_cache_spec.
page_size_bytes}`, the worker's per-layer KV tensors (the block dimension is found by its size).
"""

from __future__ import annotations

import contextlib
import time
import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.logger import init_logger
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger("vllm.infercept." + __name__)  # under vLLM's configured logger tree
_DEBUG = bool(os.environ.get("INFERCEPT_SWAP_DEBUG"))

CONNECTOR_NAME = "InterceptSwapConnector"
MODULE_PATH = "engine_adapter.swap_connector"


@dataclass
class SwapMeta(KVConnectorMetadata):
    host_slots: int
    # (device block id, host slot) pairs
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    loads_done: list[str] = field(default_factory=list)  # requests whose last chunk is in this step


@dataclass
class HostCopy:
    """A paused request's KV in the host buffer (or on its way there)."""

    slots: list[int]  # host slot of the request's i-th block
    tokens: int  # context tokens covered
    copied_blocks: int = 0  # how many of its blocks have been planned for copy so far


class SlotPool:
    """Host buffer slots (pure bookkeeping, scheduler side)."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def give(self, slots: list[int]) -> None:
        self._free.extend(reversed(slots))
        assert len(self._free) <= self.num_slots, "host slot freed twice"


class InterceptSwapConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.swap_space_bytes = int(float(extra.get("swap_space_gib", 1.0)) * 2**30)
        self.block_size = vllm_config.cache_config.block_size
        self._kv_cfg = kv_cache_config
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler()
        else:
            self._init_worker()

    # ============================================================== scheduler side
    def _init_scheduler(self) -> None:
        assert self._kv_cfg is not None
        self.block_bytes = kv_block_bytes(self._kv_cfg)
        self.slots = SlotPool(max(0, self.swap_space_bytes // max(1, self.block_bytes)))
        self.host: dict[str, HostCopy] = {}  # request id -> its host copy
        self._pending_in: dict[str, int] = {}  # armed: request id -> tokens vLLM should allocate for
        self._loading: dict[str, deque[tuple[int, int]]] = {}  # allocated: (block, slot) still to copy
        self._abandoned: list[str] = []  # closed while loading: vLLM frees their blocks once reported
        self.in_budget_blocks = 0  # set by the scheduler every step
        self.last_in_blocks = 0  # what the last built step moved in
        self._out: list[tuple[int, int]] = []
        self.stats = {"tokens_out": 0, "tokens_in": 0, "blocks_out": 0, "blocks_in": 0, "fallbacks": 0}

    @property
    def kv_bytes_per_token(self) -> int:
        return self.block_bytes // self.block_size

    def reserve(self, request_id: str, context_tokens: int) -> int:
        """Claim host slots for a request's full blocks. Returns the tokens that will travel (0: none,
        because the context is shorter than a block or the swap space is full)."""
        num_blocks = context_tokens // self.block_size
        tokens = num_blocks * self.block_size
        if num_blocks == 0:
            return 0
        slots = self.slots.take(num_blocks)
        if slots is None:
            self.stats["fallbacks"] += 1
            return 0
        self.host[request_id] = HostCopy(slots=slots, tokens=tokens)
        return tokens

    def plan_swap_out(self, request_id: str, block_ids: list[int], max_blocks: int) -> int:
        """Plan the next up-to-`max_blocks` blocks of a reserved request for copy-out in this step.
        Returns how many were planned; the copy is complete once `out_complete(request_id)`."""
        hc = self.host[request_id]
        start = hc.copied_blocks
        n = min(max_blocks, len(hc.slots) - start)
        for i in range(start, start + n):
            self._out.append((block_ids[i], hc.slots[i]))
        hc.copied_blocks += n
        self.stats["blocks_out"] += n
        if self.out_complete(request_id):
            self.stats["tokens_out"] += hc.tokens
        return n

    def out_complete(self, request_id: str) -> bool:
        hc = self.host[request_id]
        return hc.copied_blocks == len(hc.slots)

    def drop(self, request_id: str) -> None:
        """Forget a request's host copy (resumed before its swap-out finished, restored, or closed)."""
        hc = self.host.pop(request_id, None)
        if hc is not None:
            self.slots.give(hc.slots)
        self._pending_in.pop(request_id, None)
        if self._loading.pop(request_id, None) is not None:
            # Closed mid-load: vLLM keeps its device blocks until the worker reports the load
            # finished, so report it with the next step (nothing more is copied for it).
            self._abandoned.append(request_id)

    def host_tokens(self) -> int:
        return sum(hc.tokens for hc in self.host.values())

    def arm_swap_in(self, request_id: str) -> None:
        """The next prefix-cache lookup of this request should load its host copy."""
        self._pending_in[request_id] = self.host[request_id].tokens

    def loading_blocks(self) -> int:
        """Blocks allocated on the device and still to be copied in (the swap-in pipeline)."""
        return sum(len(q) for q in self._loading.values())

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        if rid in self._pending_in:
            n = max(0, self._pending_in[rid] - num_computed_tokens)
            return n, n > 0  # asynchronous: copied over the next steps within the swap-in budget
        hc = self.host.get(rid)
        if hc is not None and hc.copied_blocks != -1:
            return None, False  # its KV is on the host and not yet armed: ask again next step
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        if num_external_tokens == 0 or rid not in self._pending_in:
            return
        hc = self.host[rid]
        block_ids = blocks.get_block_ids()[0]
        n = len(hc.slots)
        assert len(block_ids) >= n, "vLLM allocated fewer blocks than the swapped context needs"
        self._loading[rid] = deque(zip(block_ids[:n], hc.slots[:n]))
        del self._pending_in[rid]

    def restored(self) -> list[str]:
        """Requests whose swap-in was executed in the previous step: release their host slots."""
        done = [rid for rid, hc in self.host.items() if hc.copied_blocks == -1]
        for rid in done:
            self.drop(rid)
        return done

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        swap_in: list[tuple[int, int]] = []
        done: list[str] = []
        budget = self.in_budget_blocks
        if budget == 0 and self._loading:
            budget = 1  # a budget under one block still moves one, so loads always finish
        for rid in list(self._loading):  # FCFS: in the order the requests were allocated
            q = self._loading[rid]
            while q and budget > 0:
                swap_in.append(q.popleft())
                budget -= 1
            if not q:
                del self._loading[rid]
                done.append(rid)
                hc = self.host[rid]
                self.stats["tokens_in"] += hc.tokens
                # Its slots are read during this step; `restored` returns them to the pool next step.
                hc.copied_blocks = -1
            if budget == 0:
                break
        self.stats["blocks_in"] += len(swap_in)
        self.last_in_blocks = len(swap_in)
        meta = SwapMeta(
            host_slots=self.slots.num_slots, swap_out=self._out, swap_in=swap_in,
            loads_done=done + self._abandoned,
        )
        self._out, self._abandoned = [], []
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.drop(request.request_id)
        return False, None

    # ============================================================== worker side
    def _init_worker(self) -> None:
        extra = self._vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        link = extra.get("link_bytes_per_s")
        self.link_bytes_per_s: float | None = float(link) if link else None
        self._step_started = time.perf_counter()
        self._step_bytes = 0
        self.kv: dict[str, torch.Tensor] = {}
        self.block_dim: dict[str, int] = {}
        self.host_kv: dict[str, torch.Tensor] = {}
        self._stream: Any = None
        self._saved: set[str] = set()
        self._loaded_step = False
        self._done_loads: set[str] = set()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        num_blocks = self._kv_cfg.num_blocks if self._kv_cfg is not None else None
        for name, t in kv_caches.items():
            dims = [d for d, s in enumerate(t.shape) if s == num_blocks] if num_blocks else [0]
            if not dims:
                raise RuntimeError(f"{name}: no dimension of {tuple(t.shape)} has {num_blocks} blocks")
            self.kv[name] = t
            self.block_dim[name] = dims[0]
        if _DEBUG:
            logger.info("swap connector: %d layers, shapes %s, block dims %s", len(self.kv),
                        {n: tuple(t.shape) for n, t in list(self.kv.items())[:1]}, set(self.block_dim.values()))
        if any(t.is_cuda for t in self.kv.values()):
            self._stream = torch.cuda.Stream()

    def _ensure_host(self, slots: int) -> None:
        if self.host_kv or slots == 0:
            return
        for name, t in self.kv.items():
            shape = list(t.shape)
            shape[self.block_dim[name]] = slots
            # empty, not zeros: slots are always written before they are read, and the OS then maps
            # the (possibly large) buffer lazily instead of at the first swap.
            self.host_kv[name] = torch.empty(shape, dtype=t.dtype, pin_memory=t.is_cuda)

    def _meta(self) -> SwapMeta | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        if not isinstance(meta, SwapMeta) or not (meta.swap_in or meta.swap_out or meta.loads_done):
            return None
        return meta

    def _copy(self, name: str, pairs: list[tuple[int, int]], to_host: bool) -> None:
        if _DEBUG:
            logger.info("swap %s %s %s", "out" if to_host else "in", name, pairs)
        copy_blocks(self.kv[name], self.host_kv[name], self.block_dim[name], pairs, to_host)
        t = self.kv[name]
        self._step_bytes += len(pairs) * (t.numel() // t.shape[self.block_dim[name]]) * t.element_size()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._saved.clear()
        self._loaded_step = False
        self._step_started = time.perf_counter()
        self._step_bytes = 0

    def _side(self) -> Any:
        """Context for issuing copies: the side stream on CUDA (ordered after the work so far)."""
        if self._stream is None:
            return contextlib.nullcontext()
        self._stream.wait_stream(torch.cuda.current_stream())
        return torch.cuda.stream(self._stream)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is None or self._loaded_step:
            return
        self._loaded_step = True
        if meta.swap_in:
            self._ensure_host(meta.host_slots)
            with self._side():
                for name in self.kv:
                    self._copy(name, meta.swap_in, to_host=False)
        self._done_loads.update(meta.loads_done)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: the loading request does not compute in this step

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is None or not meta.swap_out or layer_name in self._saved:
            return
        self._ensure_host(meta.host_slots)
        with self._side():
            self._copy(layer_name, meta.swap_out, to_host=True)
        self._saved.add(layer_name)

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is not None:
            # A step without a forward pass (or layers without the hooks) still moves everything.
            for name in self.kv:
                if meta.swap_out and name not in self._saved:
                    self.save_kv_layer(name, self.kv[name], None)
            self.start_load_kv(None)
        if self._stream is not None:
            self._stream.synchronize()
        if self.link_bytes_per_s and self._step_bytes:
            # Emulated link: this step's copies take bytes / bandwidth, overlapped with the forward
            # pass; only the part that outlasts it holds the step back.
            left = self._step_bytes / self.link_bytes_per_s - (time.perf_counter() - self._step_started)
            self._step_bytes = 0
            if left > 0:
                time.sleep(left)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # Called after wait_for_save in the same step: this step's copies are complete.
        done, self._done_loads = self._done_loads, set()
        return None, (done or None)


def kv_block_bytes(kv_cache_config: KVCacheConfig) -> int:
    """Bytes of KV one block holds across every layer (one host slot; M = this / block_size)."""
    return sum(len(g.layer_names) * g.kv_cache_spec.page_size_bytes for g in kv_cache_config.kv_cache_groups)


def copy_blocks(dev: torch.Tensor, host: torch.Tensor, dim: int, pairs: list[tuple[int, int]], to_host: bool) -> None:
    """Copy whole blocks along `dim` between a device KV tensor and a host buffer: one gather and one
    scatter per call (not one copy per block), asynchronous on CUDA with a pinned host buffer."""
    dev_idx = torch.tensor([d for d, _ in pairs], dtype=torch.long, device=dev.device)
    host_idx = torch.tensor([h for _, h in pairs], dtype=torch.long)
    if to_host:
        host.index_copy_(dim, host_idx, dev.index_select(dim, dev_idx).to("cpu", non_blocking=dev.is_cuda))
    else:
        dev.index_copy_(dim, dev_idx, host.index_select(dim, host_idx).to(dev.device, non_blocking=dev.is_cuda))
