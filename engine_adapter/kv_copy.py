"""Whole-block copies between vLLM 0.32's device KV cache and one flat host buffer. Imports torch only
(`scripts/gpu_check.py` runs it on machines without this project's vLLM).

Layout. vLLM 0.32 hands the connector one view per layer, `[B * r, H, N, C]` (`create_kv_cache_views`:
logical axes, strides from the resolved layout, NHD or HND, layer- or block-outermost), where `r` kernel
blocks make one manager block (`group_kernel_blocks`): the block axis is 0 by contract, `r` is the view's
first size over `num_blocks`. A block of a layer is copied as its bytes in logical order (a uint8 view:
fp8 and any packed page content travel as they are). Layers that share one KV tensor (KV sharing) are
copied once. The host buffer is one flat, exact-size allocation made at start (pinned with CUDA), one
region per layer, `[slots, block bytes]` each: a run of consecutive host slots is one contiguous copy.

Ordering, per step (`begin_step` at bind time, before the forward pass is launched; `finish` at the
step's barrier, `wait_for_save`):
* Everything runs on a side stream that waits on one event recorded on the compute stream at bind time:
  the work queued before this step's forward (earlier steps' writes of the blocks copied out). Nothing
  waits on the forward itself: a block copied out is not written by this step's forward (its request is
  paused), and a block copied in is not read by it (its request waits for the load), so copies overlap
  the whole forward pass, both ways.
* The exception, blocks released in the step that copies them and already handed to other requests
  (`swap_out_first`): they are gathered on the side stream at bind time and the compute stream waits for
  those gathers (device-to-device, short) before the forward writes them; their transfer to the host
  overlaps the forward like the others.
* The step's block indices go to the device once, non-blocking from pinned memory (no host sync).
* `finish` waits for the side stream (the step's copies are complete when the worker reports; the
  scheduler reuses a swapped-out block, or computes on a swapped-in one, only after that) and, on CUDA,
  measures with the events what the copies added to the step: the side stream's end past the compute
  stream's end.

Streams. `SyncStreams` (CPU serving: every copy runs at once on the host), `CudaStreams`, and
`FakeStreams`: deferred CPU "streams" that run queued work only when something waits for it, in an
adversarial order (the other stream first, as far as its dependencies allow). The CPU tests and
`gpu_check.py --dry-run` run the CUDA code path on it, so a missing fence changes what they read.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

Pairs = list[tuple[int, int]]  # (device block, host slot)


# ====================================================================== streams
class SyncStreams:
    """No streams: every operation runs on the host when issued (the CPU backend)."""

    timing = False
    pin = False
    deferred = False

    def __init__(self) -> None:
        self.side: Any = None

    def compute(self) -> Any:
        return None

    def event(self) -> Any:
        return _NullEvent()

    def on(self, stream: Any, fn: Callable[[], None]) -> None:
        fn()

    def wait(self, stream: Any, event: Any) -> None:
        return None


class _NullEvent:
    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None


class CudaStreams:
    """A side stream beside the current (compute) stream; timing events."""

    timing = True
    pin = True
    deferred = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device=device)

    def compute(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def on(self, stream: Any, fn: Callable[[], None]) -> None:
        with torch.cuda.stream(stream):
            fn()

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)


class FakeEvent:
    def __init__(self) -> None:
        self.stream: FakeStream | None = None
        self.pos = 0

    def record(self, stream: FakeStream) -> None:
        self.stream, self.pos = stream, len(stream.ops)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.owner.force(self.stream, self.pos)

    def query(self) -> bool:
        return self.stream is None or self.stream.done >= self.pos


@dataclass
class FakeStream:
    name: str
    owner: FakeStreams
    ops: list[tuple[tuple[tuple[FakeStream, int], ...], Callable[[], None]]] = field(default_factory=list)
    done: int = 0

    def submit(self, fn: Callable[[], None], deps: tuple[tuple[FakeStream, int], ...] = ()) -> None:
        self.ops.append((deps, fn))

    def wait_event(self, event: FakeEvent) -> None:
        # A marker op: everything queued after it (and events recorded after it) depend on the event.
        if event.stream is not None:
            self.submit(lambda: None, ((event.stream, event.pos),))

    def synchronize(self) -> None:
        self.owner.force(self, len(self.ops))

    def ready(self) -> bool:
        return self.done < len(self.ops) and all(s.done >= p for s, p in self.ops[self.done][0])

    def __hash__(self) -> int:
        return id(self)


class FakeStreams:
    """Two deferred streams on the CPU. Work runs when the host waits for it (`synchronize`), in the
    order a real GPU may well choose when nothing orders it: `prefer` runs first as far as its own
    dependencies allow. `prefer="compute"` exposes a missing wait of the compute stream on the side
    stream, `prefer="side"` the converse. `log` records (stream name, op label) as ops run."""

    timing = False
    pin = False
    deferred = True

    def __init__(self, prefer: str = "compute") -> None:
        self.compute_stream = FakeStream("compute", self)
        self.side = FakeStream("side", self)
        self.prefer = self.compute_stream if prefer == "compute" else self.side
        self.log: list[str] = []

    def compute(self) -> FakeStream:
        return self.compute_stream

    def event(self) -> FakeEvent:
        return FakeEvent()

    def on(self, stream: FakeStream, fn: Callable[[], None]) -> None:
        stream.submit(fn)

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        stream.wait_event(event)

    def ops_run(self) -> int:
        return self.compute_stream.done + self.side.done

    def force(self, stream: FakeStream, pos: int) -> None:
        while stream.done < pos:
            other = self.prefer
            if other is not stream:
                while other.ready():
                    self._run_one(other)
            deps, _ = stream.ops[stream.done]
            for s, p in deps:
                self.force(s, p)
            self._run_one(stream)

    def _run_one(self, stream: FakeStream) -> None:
        _, fn = stream.ops[stream.done]
        stream.done += 1
        self.log.append(stream.name)
        fn()

    def drain(self) -> None:
        for s in (self.prefer, self.compute_stream, self.side):
            s.synchronize()


def streams_for(kv: Iterable[torch.Tensor]) -> Any:
    tensors = list(kv)
    if tensors and tensors[0].is_cuda:
        return CudaStreams(tensors[0].device)
    return SyncStreams()


# ====================================================================== layout
def layer_block_views(kv: dict[str, torch.Tensor], num_blocks: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Each distinct KV tensor as uint8 `[num_blocks, block bytes...]` (`[B, r, H, N, C bytes]`), and
    every layer's name -> the name its tensor is copied under (KV sharing: one copy per tensor)."""
    views: dict[str, torch.Tensor] = {}
    canonical: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in kv.items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in seen:
            canonical[name] = seen[key]
            continue
        if t.dim() != 4:
            raise ValueError(f"{name}: KV tensor of shape {tuple(t.shape)} is not a [B, H, N, C] layer view "
                             "(a cache without per-layer views, e.g. Mamba state, cannot be swapped)")
        if t.shape[0] % num_blocks:
            raise ValueError(f"{name}: {t.shape[0]} (kernel) blocks are not a multiple of {num_blocks} KV blocks")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the content axis of the KV view is not contiguous (stride {t.stride()})")
        u8 = t.view(torch.uint8) if t.element_size() > 1 or t.dtype != torch.uint8 else t
        views[name] = u8.unflatten(0, (num_blocks, t.shape[0] // num_blocks))  # group_kernel_blocks
        seen[key] = canonical[name] = name
    return views, canonical


def meminfo_bytes(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


PINNED_EXACT_ABOVE_MB = 64


def exact_pinned_above_mb(mb: int = PINNED_EXACT_ABOVE_MB) -> bool:
    """PyTorch's pinned allocator rounds an allocation up to a power of two (224 GiB pinned for a 128 GiB
    buffer) and caches freed blocks in power-of-two buckets. Above `pinned_max_cached_size_mb` it does
    neither: the size is exact and the block is freed, not cached (a non-power-of-two block must never
    sit in a bucket, which hands out its blocks without checking their size). A process-wide setting, so
    a fixed value, only ever lowered (never raised above one set before). False where this torch has no
    such setting (2.11 rejects the key: measured on an H200 by scripts/gpu_check.py)."""
    try:
        items = [x for x in torch._C._accelerator_getAllocatorSettings().split(",") if x.strip()]
        for item in items:
            key, _, value = item.partition(":")
            if key.strip() == "pinned_max_cached_size_mb" and value.strip().isdigit() and int(value) <= mb:
                return True
        keep = [x for x in items if x.partition(":")[0].strip() != "pinned_max_cached_size_mb"]
        torch._C._accelerator_setAllocatorSettings(",".join([*keep, f"pinned_max_cached_size_mb:{mb}"]))
        return True
    except (AttributeError, RuntimeError, ValueError):
        return False


def _register_pinned(nbytes: int) -> torch.Tensor:
    """An exact-size buffer page-locked in place with cudaHostRegister (for a torch whose allocator would
    round it up). Unregistered when the tensor is collected; the copier holds it for its whole life, and
    a copy from memory unregistered early would only be slower (staged), never wrong."""
    t = torch.empty(nbytes, dtype=torch.uint8)
    cudart = torch.cuda.cudart()
    err = cudart.cudaHostRegister(t.data_ptr(), nbytes, 0)
    if int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    weakref.finalize(t, cudart.cudaHostUnregister, t.data_ptr())
    return t


def allocate_host(nbytes: int, pin: bool, ranks_on_host: int = 1, available: int | None = None) -> torch.Tensor:
    """One flat uint8 buffer of exactly `nbytes`, pinned when `pin`, with a clear error where it cannot be
    had: all ranks of this host together must fit in its available memory (pinned pages are locked now),
    or in its total memory (pageable, mapped as slots are first written)."""
    if available is None:
        available = meminfo_bytes("MemAvailable" if pin else "MemTotal")
    gib = 2**30
    if available is not None and nbytes * ranks_on_host > 0.9 * available:
        raise RuntimeError(
            f"swap space: {ranks_on_host} x {nbytes / gib:.2f} GiB of host buffer does not fit in the "
            f"{available / gib:.1f} GiB of {'available' if pin else 'total'} host memory; lower swap_space_gib")
    if not pin:
        # Mapped by the OS as slots are first written (no cost at start for a large, mostly unused buffer).
        return torch.empty(nbytes, dtype=torch.uint8)
    try:
        if nbytes > PINNED_EXACT_ABOVE_MB * 2**20 and not exact_pinned_above_mb():
            return _register_pinned(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as e:
        raise RuntimeError(f"swap space: cannot pin {nbytes / gib:.2f} GiB of host memory ({e}); lower "
                           "swap_space_gib, or raise the locked-memory limit of the container") from e


# ====================================================================== copies
@dataclass
class _Plan:
    """One list of copies, sorted by host slot: device ids in that order, runs of consecutive slots."""

    pairs: Pairs
    dev_ids: list[int]
    runs: list[tuple[int, int, int]]  # (first index into dev_ids, first host slot, length)
    offset: int = 0  # into the step's uploaded index tensor

    @classmethod
    def of(cls, pairs: Pairs) -> _Plan:
        srt = sorted(pairs, key=lambda p: p[1])
        runs: list[tuple[int, int, int]] = []
        for i, (_, slot) in enumerate(srt):
            if runs and runs[-1][1] + runs[-1][2] == slot:
                runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((i, slot, 1))
        return cls(pairs, [d for d, _ in srt], runs)


class BlockCopier:
    """Per worker: the layers' block views, the host buffer, and one step's copies at a time."""

    def __init__(self, kv: dict[str, torch.Tensor], num_blocks: int, host_slots: int, streams: Any = None,
                 ranks_on_host: int = 1) -> None:
        self.kv = kv
        self.views, self.canonical = layer_block_views(kv, num_blocks)
        self.num_blocks, self.host_slots = num_blocks, host_slots
        self.streams = streams_for(kv.values()) if streams is None else streams
        self.device = next(iter(kv.values())).device if kv else torch.device("cpu")
        self.page = {n: v[0].numel() for n, v in self.views.items()}  # bytes of one block of one layer
        self.slot_bytes = sum(self.page.values())
        self.host = allocate_host(host_slots * self.slot_bytes, self.streams.pin, ranks_on_host) if host_slots else \
            torch.empty(0, dtype=torch.uint8)
        self.host_layer: dict[str, torch.Tensor] = {}
        off = 0
        for n, p in self.page.items():
            self.host_layer[n] = self.host[off:off + host_slots * p].view(host_slots, p)
            off += host_slots * p
        self._ids_host = torch.empty(3 * num_blocks, dtype=torch.long, pin_memory=self.streams.pin)
        self.bytes_moved = 0
        # The last step's (copies' end, compute stream's end) in ms since bind, on CUDA; the second is None
        # where the compute stream was still busy when the copies ended.
        self.stats_ms: tuple[float, float | None] | None = None
        self._step: dict[str, Any] | None = None

    def block_bytes(self, layer: str) -> int:
        return self.page[self.canonical[layer]]

    # ------------------------------------------------------------------ per step
    def begin_step(self, swap_out: Pairs = (), swap_out_first: Pairs = (), swap_in: Pairs = ()) -> None:
        """At bind time, before the forward pass is launched: fence the side stream after the work queued so
        far, upload the step's block indices, and copy out the blocks the forward pass is about to reuse."""
        for pairs in (swap_out, swap_out_first, swap_in):
            for d, h in pairs:
                if not (0 <= d < self.num_blocks and 0 <= h < self.host_slots):
                    raise IndexError(f"copy ({d}, {h}) outside {self.num_blocks} device blocks / {self.host_slots} slots")
        if self._step is not None:
            self.finish()  # a step bound without its barrier: end it first (its index buffer is reused)
        s = self.streams
        plans = {"out": _Plan.of(list(swap_out)), "first": _Plan.of(list(swap_out_first)), "in": _Plan.of(list(swap_in))}
        st: dict[str, Any] = {"plans": plans, "out_done": set(), "in_done": False, "idx": None}
        self._step = st
        if not any(p.pairs for p in plans.values()):
            return
        compute = s.compute()
        st["bind"] = s.event()
        st["bind"].record(compute)
        s.wait(s.side, st["bind"])  # the one fence on the compute stream: what was queued before this step
        ids: list[int] = []
        for p in plans.values():
            p.offset = len(ids)
            ids += p.dev_ids
        # The pinned index buffer is reused every step: the previous step's upload has finished (its
        # barrier waited for the side stream), and no allocation (cudaHostAlloc may sync) happens here.
        host_ids = self._ids_host[:len(ids)]
        host_ids.copy_(torch.tensor(ids, dtype=torch.long))

        def upload() -> None:  # non-blocking from pinned memory: no host sync
            st["idx"] = host_ids.to(self.device, non_blocking=s.pin)

        s.on(s.side, upload)
        first = plans["first"]
        if first.pairs:
            gathered: dict[str, torch.Tensor] = {}

            def gather_all() -> None:
                for n in self.views:
                    gathered[n] = self._gather(n, st["idx"], first)

            s.on(s.side, gather_all)
            st["gathered"] = s.event()
            st["gathered"].record(s.side)
            s.wait(compute, st["gathered"])  # the forward pass writes these blocks only after their gathers
            for n in self.views:
                s.on(s.side, lambda n=n: self._to_host(n, gathered.pop(n), first))
                self.bytes_moved += len(first.pairs) * self.page[n]

    def _gather(self, name: str, idx: torch.Tensor, plan: _Plan) -> torch.Tensor:
        k = len(plan.dev_ids)
        return self.views[name].index_select(0, idx[plan.offset:plan.offset + k]).view(k, -1)

    def _to_host(self, name: str, gathered: torch.Tensor, plan: _Plan) -> None:
        host = self.host_layer[name]
        for i, slot, n in plan.runs:  # straight into the slots: one copy per run of consecutive slots
            host[slot:slot + n].copy_(gathered[i:i + n], non_blocking=self.streams.pin)

    def copy_out(self, layer: str) -> None:
        """This step's swap-out of one layer (once per tensor), on the side stream; returns at once."""
        st = self._step
        if st is None:
            raise RuntimeError("copy_out before begin_step")
        n = self.canonical[layer]
        plan = st["plans"]["out"]
        if not plan.pairs or n in st["out_done"]:
            return
        st["out_done"].add(n)

        def work() -> None:
            self._to_host(n, self._gather(n, st["idx"], plan), plan)

        self.streams.on(self.streams.side, work)
        self.bytes_moved += len(plan.pairs) * self.page[n]

    def copy_out_all(self) -> None:
        for n in self.views:
            self.copy_out(n)

    def copy_in(self) -> None:
        """This step's swap-in of every layer, on the side stream, ordered after the bind event only (not
        after the forward pass, which does not read these blocks); returns at once."""
        st = self._step
        if st is None:
            raise RuntimeError("copy_in before begin_step")
        plan = st["plans"]["in"]
        if not plan.pairs or st["in_done"]:
            return
        st["in_done"] = True
        k = len(plan.dev_ids)
        for n in self.views:
            def work(n: str = n) -> None:
                view, host = self.views[n], self.host_layer[n]
                staging = torch.empty((k, *view.shape[1:]), dtype=torch.uint8, device=self.device)
                flat = staging.view(k, -1)
                for i, slot, m in plan.runs:
                    flat[i:i + m].copy_(host[slot:slot + m], non_blocking=self.streams.pin)
                view.index_copy_(0, st["idx"][plan.offset:plan.offset + k], staging)

            self.streams.on(self.streams.side, work)
            self.bytes_moved += k * self.page[n]

    def finish(self) -> None:
        """The step's barrier: every copy issued in it is complete when this returns. On CUDA, also the
        step's timing from its events (`stats_ms`)."""
        st, self._step = self._step, None
        self.stats_ms = None
        if st is None or "bind" not in st:
            return
        s = self.streams
        done, fwd = s.event(), s.event()
        done.record(s.side)
        fwd.record(s.compute())
        done.synchronize()
        if s.timing:
            # Not waiting for the compute stream: where it is still busy, the copies added nothing.
            self.stats_ms = (st["bind"].elapsed_time(done), st["bind"].elapsed_time(fwd) if fwd.query() else None)


def env_ranks_on_host() -> int:
    """Ranks of this engine on this host (for the host-memory check): LOCAL_WORLD_SIZE where set."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
