"""Whole-block copies between the device KV cache and a host buffer, correct under CUDA's asynchrony.

One `BlockCopier` per worker holds, per layer, the device KV tensor, the dimension that indexes blocks,
and a host buffer with one slot per block. Copies are (device block, host slot) pairs.

On CUDA (`staged`), everything is issued on a side stream, after the work already queued on the compute
stream (so a layer's KV written by this step's forward is complete before it is read):
* out (device -> host): gather the blocks on the device (one kernel), copy them into a pinned staging
  tensor (asynchronous D2H), and only in `finish()`, once the side stream has completed, scatter the
  staging tensor into the host slots. A CPU-side `index_copy_` of a tensor that a non_blocking D2H copy
  is still writing would read garbage (PyTorch's CUDA semantics notes); this ordering never does.
* in (host -> device): gather the host slots into a pinned staging tensor on the CPU (the host buffer is
  complete: every out copy was scattered in an earlier `finish()`), copy it to the device asynchronously
  and scatter it into the device blocks on the side stream. The staging tensor is kept alive until
  `finish()`, so the pinned memory is never reused while the DMA reads it.
`finish()` is the step's barrier: the worker calls it before the step reports, so the scheduler frees a
swapped-out block, or schedules a swapped-in one, only after its copy is done.

Blocks released in the step that copies them out (and reallocated by vLLM in that same step) must be read
before the forward pass writes them: `copy_out_before_writes` gathers them from every layer on the side
stream first, makes the compute stream wait for those gathers (device-to-device copies, short), and only
then issues the transfers to the host, which overlap the forward pass like any other copy out. It relies
on nothing about the order in which layers run or which hooks they call.

On the CPU the copies are plain synchronous gathers and scatters (`staged=False`); `staged=True` runs
the CUDA ordering on CPU tensors too, which is how the CPU tests exercise it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _PendingOut:
    layer: str
    host_idx: torch.Tensor
    staging: torch.Tensor


class BlockCopier:
    def __init__(self, kv: dict[str, torch.Tensor], block_dim: dict[str, int], host_slots: int,
                 staged: bool | None = None) -> None:
        self.kv, self.block_dim, self.host_slots = kv, block_dim, host_slots
        cuda = any(t.is_cuda for t in kv.values())
        self.staged = cuda if staged is None else staged
        self.pin = cuda  # pinned host memory: only meaningful (and only available) with CUDA
        self.stream: Any = torch.cuda.Stream() if cuda else None
        self.host: dict[str, torch.Tensor] = {}
        self._pending_out: list[_PendingOut] = []
        self._keep_alive: list[torch.Tensor] = []
        self.bytes_moved = 0

    def block_bytes(self, layer: str) -> int:
        t = self.kv[layer]
        return t.numel() // t.shape[self.block_dim[layer]] * t.element_size()

    def _ensure_host(self) -> None:
        if self.host or self.host_slots == 0:
            return
        for name, t in self.kv.items():
            shape = list(t.shape)
            shape[self.block_dim[name]] = self.host_slots
            # empty, not zeros: slots are always written before they are read, and the OS maps the
            # (possibly large) buffer lazily instead of at the first swap.
            self.host[name] = torch.empty(shape, dtype=t.dtype, pin_memory=self.pin)

    @contextlib.contextmanager
    def _side(self) -> Iterator[None]:
        """Issue on the side stream, ordered after the work queued on the compute stream so far."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            yield

    def copy_out(self, layer: str, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        self._ensure_host()
        with self._side():
            host_idx, gathered = self._gather(layer, pairs)
            self._to_host(layer, host_idx, gathered)
        self.bytes_moved += len(pairs) * self.block_bytes(layer)

    def copy_out_before_writes(self, pairs: list[tuple[int, int]]) -> None:
        """Copy blocks of every layer to their host slots, reading them before anything the compute
        stream queues next (the forward pass that reuses them) can write them."""
        if not pairs:
            return
        self._ensure_host()
        compute = torch.cuda.current_stream() if self.stream is not None else None
        with self._side():
            gathered = {layer: self._gather(layer, pairs) for layer in self.kv}
            if compute is not None:
                done = torch.cuda.Event()
                done.record(self.stream)
        if compute is not None:
            compute.wait_event(done)  # only the gathers: the host transfers below overlap the forward
        with self._side():
            for layer, (host_idx, g) in gathered.items():
                self._to_host(layer, host_idx, g)
                self.bytes_moved += len(pairs) * self.block_bytes(layer)

    def _gather(self, layer: str, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(host slot index, the blocks gathered on the device); on the side stream."""
        dev, dim = self.kv[layer], self.block_dim[layer]
        dev_idx = torch.tensor([d for d, _ in pairs], dtype=torch.long, device=dev.device)
        return torch.tensor([h for _, h in pairs], dtype=torch.long), dev.index_select(dim, dev_idx)

    def _to_host(self, layer: str, host_idx: torch.Tensor, gathered: torch.Tensor) -> None:
        if self.staged:
            staging = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=self.pin)
            staging.copy_(gathered, non_blocking=self.pin)
            self._pending_out.append(_PendingOut(layer, host_idx, staging))
        else:
            self.host[layer].index_copy_(self.block_dim[layer], host_idx, gathered)

    def copy_in(self, layer: str, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        self._ensure_host()
        dev, host, dim = self.kv[layer], self.host[layer], self.block_dim[layer]
        host_idx = torch.tensor([h for _, h in pairs], dtype=torch.long)
        if self.staged:
            shape = list(host.shape)
            shape[dim] = len(pairs)
            staging = torch.empty(shape, dtype=host.dtype, pin_memory=self.pin)
            torch.index_select(host, dim, host_idx, out=staging)
            self._keep_alive.append(staging)
        else:
            staging = host.index_select(dim, host_idx)
        with self._side():
            dev_idx = torch.tensor([d for d, _ in pairs], dtype=torch.long, device=dev.device)
            dev.index_copy_(dim, dev_idx, staging.to(dev.device, non_blocking=self.pin))
        self.bytes_moved += len(pairs) * self.block_bytes(layer)

    def finish(self) -> None:
        """Wait for this step's copies; then scatter the staged swap-outs into the host slots."""
        if self.stream is not None:
            self.stream.synchronize()
        for p in self._pending_out:
            self.host[p.layer].index_copy_(self.block_dim[p.layer], p.host_idx, p.staging)
        self._pending_out.clear()
        self._keep_alive.clear()


def block_dims(kv: dict[str, torch.Tensor], num_blocks: int | None) -> dict[str, int]:
    """The dimension of each layer's KV tensor that indexes blocks (found by its size)."""
    dims = {}
    for name, t in kv.items():
        found = [d for d, s in enumerate(t.shape) if s == num_blocks] if num_blocks else [0]
        if not found:
            raise RuntimeError(f"{name}: no dimension of {tuple(t.shape)} has {num_blocks} blocks")
        dims[name] = found[0]
    return dims
