"""The swap connector's block copies (`kv_copy.BlockCopier`) through vLLM 0.32's real per-layer KV views,
and the ordering the CUDA path relies on, checked on CPU tensors with `FakeStreams` (deferred streams
that run unordered work in the worst order): each fence test fails when its fence line is removed.

Fences in `kv_copy.py` and the test that catches each one's removal:
* `s.wait(s.side, st["bind"])` (begin_step): test_copies_see_the_writes_queued_before_the_step
* `s.wait(compute, st["gathered"])` (begin_step): test_blocks_reused_in_the_copying_step_come_back_intact
* `done.synchronize()` (finish): test_finish_is_the_barrier
And the absence of fences that would serialize: test_copies_do_not_wait_for_the_forward (a wait on the
current stream at copy time), test_copy_calls_run_nothing_on_the_host (a host sync in the calls).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor, create_kv_cache_views
from vllm.v1.kv_cache_layout import KVCacheLayout

from engine_adapter.kv_copy import BlockCopier, FakeStreams, SyncStreams, allocate_host, layer_block_views

_spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(gpu_check)

NUM_BLOCKS, LAYERS, HEADS, HEAD = 12, 3, 2, 8
VLLM_LAYOUTS = {"NHD": KVCacheLayout.LBNHC, "HND": KVCacheLayout.LBHNC, "BL-NHD": KVCacheLayout.BLNHC,
                "BL-HND": KVCacheLayout.BLHNC}
CASES = [("NHD", 16, 16), ("HND", 16, 16), ("BL-NHD", 16, 16), ("BL-HND", 16, 16),
         ("NHD", 128, 16), ("NHD", 128, 32), ("NHD", 128, 64), ("HND", 128, 32)]


def vllm_views(layout: str, block_size: int, kernel_block: int, dtype: torch.dtype = torch.bfloat16,
               num_blocks: int = NUM_BLOCKS, heads: int = HEADS) -> dict[str, torch.Tensor]:
    """Random KV in the views vLLM 0.32 hands a connector (`create_kv_cache_views`)."""
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=HEAD, dtype=dtype)
    page = spec.page_size_bytes
    lc = VLLM_LAYOUTS[layout].is_layer_compact
    tensor = KVCacheTensor(size=page * num_blocks * LAYERS, layers=[f"l{i}" for i in range(LAYERS)],
                           layer_stride=page * num_blocks if lc else page, block_stride=page if lc else page * LAYERS)
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(-128, 128, (tensor.size,), dtype=torch.int8, generator=g)
    views = create_kv_cache_views(raw, spec, num_blocks, VLLM_LAYOUTS[layout], tensor,
                                  kernel_block_size=kernel_block if kernel_block != block_size else None)
    return dict(zip(tensor.layers, views))


def block(t: torch.Tensor, b: int, num_blocks: int = NUM_BLOCKS) -> torch.Tensor:
    return t.view(torch.uint8).unflatten(0, (num_blocks, -1))[b].reshape(-1).clone()


def make(streams: object, kv: dict[str, torch.Tensor], slots: int = 8) -> BlockCopier:
    return BlockCopier(kv, NUM_BLOCKS, host_slots=slots, streams=streams)


STREAMS = {"sync": lambda: SyncStreams(), "compute-first": lambda: FakeStreams("compute"),
           "side-first": lambda: FakeStreams("side")}
OUT = [(1, 5), (4, 0), (7, 3), (8, 4)]  # device block -> host slot; slots 3-5 are one run
INTO = [(9, 5), (2, 0), (11, 3), (10, 4)]


def drain(s: object) -> None:
    if isinstance(s, FakeStreams):
        s.drain()


@pytest.mark.parametrize("layout,block_size,kernel_block", CASES)
def test_gpu_check_builds_the_views_vllm_builds(layout: str, block_size: int, kernel_block: int) -> None:
    """gpu_check.py (no vLLM on a GPU box) rebuilds vLLM's views: same shapes, strides and bytes."""
    ours = vllm_views(layout, block_size, kernel_block)
    raw = ours["l0"].view(torch.int8).as_strided((ours["l0"].untyped_storage().nbytes(),), (1,), 0)
    theirs = gpu_check.vllm_layer_views(raw, LAYERS, NUM_BLOCKS, HEADS, HEAD, torch.bfloat16, block_size, kernel_block, layout)
    for a, b in zip(ours.values(), theirs):
        assert a.shape == b.shape and a.stride() == b.stride() and a.data_ptr() == b.data_ptr()


@pytest.mark.parametrize("streams", list(STREAMS))
@pytest.mark.parametrize("layout,block_size,kernel_block", CASES)
def test_round_trip_through_vllm_views_is_bit_exact(layout: str, block_size: int, kernel_block: int, streams: str) -> None:
    kv = vllm_views(layout, block_size, kernel_block)
    ref = {n: {b: block(t, b) for b in range(NUM_BLOCKS)} for n, t in kv.items()}
    s = STREAMS[streams]()
    copier = make(s, kv)
    copier.begin_step(swap_out=OUT)
    for n in kv:
        copier.copy_out(n)
    copier.finish()
    assert copier.bytes_moved == len(OUT) * LAYERS * ref["l0"][0].numel()
    for t in kv.values():
        t.view(torch.uint8).zero_()  # the device blocks are reused by others meanwhile
    copier.begin_step(swap_in=INTO)
    copier.copy_in()
    copier.finish()
    drain(s)
    for n, t in kv.items():
        for (src, _), (dst, _) in zip(OUT, INTO):
            assert torch.equal(block(t, dst), ref[n][src]), (n, src, dst)
        for b in set(range(NUM_BLOCKS)) - {d for d, _ in INTO}:
            assert not block(t, b).any()  # nothing else written


def test_fp8_kv_is_copied_as_bytes() -> None:
    kv = vllm_views("NHD", 16, 16, dtype=torch.float8_e4m3fn)
    ref = block(kv["l1"], 4)
    copier = make(SyncStreams(), kv)
    copier.begin_step(swap_out=[(4, 2)])
    copier.copy_out_all()
    copier.finish()
    copier.begin_step(swap_in=[(6, 2)])
    copier.copy_in()
    copier.finish()
    assert torch.equal(block(kv["l1"], 6), ref)


def test_kv_sharing_layers_are_copied_once() -> None:
    kv = vllm_views("NHD", 16, 16)
    kv["l3"] = kv["l1"]  # vLLM binds a KV-sharing layer to its target's tensor
    views, canonical = layer_block_views(kv, NUM_BLOCKS)
    assert list(views) == ["l0", "l1", "l2"] and canonical["l3"] == "l1"
    copier = make(SyncStreams(), kv)
    assert copier.host.numel() == 8 * 3 * block(kv["l0"], 0).numel()  # slots for the distinct tensors only
    copier.begin_step(swap_out=OUT)
    for n in ("l0", "l1", "l2", "l3"):
        copier.copy_out(n)
    copier.finish()
    assert copier.bytes_moved == len(OUT) * 3 * block(kv["l0"], 0).numel()


def test_the_block_axis_is_vllms_not_a_guess() -> None:
    """vLLM 0.32's views index blocks on axis 0, `r` kernel blocks per block; a size match elsewhere (here
    HEADS == num_blocks) must not matter, and a view that is not whole blocks is refused."""
    kv = vllm_views("HND", 128, 32, num_blocks=4, heads=4)
    views, _ = layer_block_views(kv, 4)
    assert views["l0"].shape[:2] == (4, 4)  # [B, r, H, N, C bytes]
    with pytest.raises(ValueError, match="not a multiple"):
        layer_block_views(kv, 3)
    with pytest.raises(ValueError, match="layer view"):
        layer_block_views({"mamba": torch.zeros(4096, dtype=torch.int8)}, 4)


def test_host_buffer_is_one_exact_allocation_made_at_start() -> None:
    kv = vllm_views("NHD", 16, 16)
    copier = make(SyncStreams(), kv, slots=5)
    assert copier.host.dim() == 1 and copier.host.numel() == 5 * LAYERS * block(kv["l0"], 0).numel()
    assert all(v.data_ptr() >= copier.host.data_ptr() for v in copier.host_layer.values())
    with pytest.raises(RuntimeError, match="host memory; lower swap_space_gib"):
        allocate_host(2**30, pin=False, ranks_on_host=4, available=3 * 2**30)


@pytest.mark.parametrize("prefer", ["compute", "side"])
def test_blocks_reused_in_the_copying_step_come_back_intact(prefer: str) -> None:
    """Released blocks vLLM hands to other requests in the copying step: the forward pass (queued on the
    compute stream after bind) writes them, and must wait for their gathers. Fails without the compute
    stream's wait on the `gathered` event (with prefer=compute: the write runs first)."""
    kv = vllm_views("HND", 128, 32)
    ref = {n: {b: block(t, b) for b in range(NUM_BLOCKS)} for n, t in kv.items()}
    s = FakeStreams(prefer)
    copier = make(s, kv)
    copier.begin_step(swap_out_first=OUT)

    def forward_writes() -> None:
        for t in kv.values():
            t.view(torch.uint8).unflatten(0, (NUM_BLOCKS, -1))[[d for d, _ in OUT]] = 7

    s.on(s.compute(), forward_writes)
    copier.finish()
    for n in kv:
        for d, slot in OUT:
            assert torch.equal(copier.host_layer[n][slot], ref[n][d]), (n, d)
    drain(s)
    assert all(bool((block(t, d) == 7).all()) for t in kv.values() for d, _ in OUT)  # the writes landed after


def test_copies_see_the_writes_queued_before_the_step() -> None:
    """The side stream waits on the event recorded at bind time: work queued on the compute stream before
    the step (the paused request's last KV writes) is in what gets copied. Fails without that wait (with
    prefer=side: the copy runs first)."""
    kv = vllm_views("NHD", 16, 16)
    s = FakeStreams("side")
    copier = make(s, kv)
    s.on(s.compute(), lambda: kv["l2"].view(torch.uint8).unflatten(0, (NUM_BLOCKS, -1))[4].fill_(42))  # earlier step
    copier.begin_step(swap_out=[(4, 1)])
    copier.copy_out_all()
    copier.finish()
    assert bool((copier.host_layer["l2"][1] == 42).all())


@pytest.mark.parametrize("direction", ["out", "in"])
def test_copies_do_not_wait_for_the_forward(direction: str) -> None:
    """Copies out and in wait on the bind event, not on the compute stream at copy time: the forward pass
    queued after bind need not run for the copies to complete (on a GPU: a step takes the max of the two,
    not their sum). A wait on the current stream in copy_out / copy_in fails this."""
    kv = vllm_views("NHD", 16, 16)
    s = FakeStreams("side")
    copier = make(s, kv)
    copier.begin_step(**{"swap_out" if direction == "out" else "swap_in": OUT})
    forward_ran: list[bool] = []
    s.on(s.compute(), lambda: forward_ran.append(True))
    copier.copy_out_all() if direction == "out" else copier.copy_in()
    s.side.synchronize()
    assert not forward_ran


def test_copy_calls_run_nothing_on_the_host() -> None:
    """Issuing a step's copies (bind, per-layer copy out, copy in) runs nothing: no host sync hides in the
    calls (the index upload is queued on the side stream too). Only finish() waits."""
    kv = vllm_views("NHD", 16, 16)
    s = FakeStreams("compute")
    copier = make(s, kv)
    copier.begin_step(swap_out=OUT[:2], swap_in=INTO[2:], swap_out_first=[(3, 6)])
    for n in kv:
        copier.copy_out(n)
    copier.copy_in()
    assert s.ops_run() == 0
    copier.finish()
    assert s.side.done == len(s.side.ops)


def test_finish_is_the_barrier() -> None:
    """When finish() returns, the step's copies are in the host slots (the scheduler then frees the device
    blocks). Fails without finish()'s `done.synchronize()`."""
    kv = vllm_views("BL-NHD", 16, 16)
    ref = block(kv["l0"], 7)
    s = FakeStreams("compute")
    copier = make(s, kv)
    copier.begin_step(swap_out=[(7, 2)])
    copier.copy_out_all()
    copier.finish()
    assert torch.equal(copier.host_layer["l0"][2], ref)


def test_copies_outside_the_cache_are_refused() -> None:
    copier = make(SyncStreams(), vllm_views("NHD", 16, 16), slots=4)
    with pytest.raises(IndexError):
        copier.begin_step(swap_out=[(1, 4)])
    with pytest.raises(IndexError):
        copier.begin_step(swap_in=[(NUM_BLOCKS, 0)])


def test_cuda_round_trip_is_bit_exact(uses_gpu: None) -> None:
    kv = {n: t.cuda() for n, t in vllm_views("HND", 128, 32).items()}
    ref = {n: block(t, 1) for n, t in kv.items()}
    copier = make(None, kv)
    copier.begin_step(swap_out=[(1, 3)])
    copier.copy_out_all()
    copier.finish()
    copier.begin_step(swap_in=[(5, 3)])
    copier.copy_in()
    copier.finish()
    assert all(torch.equal(block(t, 5), ref[n]) for n, t in kv.items())


def test_swap_stall_stats_reach_the_scheduler_as_the_slowest_workers() -> None:
    """The workers' measured stall and forward window travel in vLLM's connector stats: concatenated
    across workers (and across steps for the stats logger), read by the scheduler as the slowest worker's
    stall and the shortest window."""
    from types import SimpleNamespace

    from engine_adapter.swap_connector import InterceptSwapConnector, SwapStallStats, measured_stall_and_window

    a = SwapStallStats({"stall_s": [0.002], "window_s": [0.010]})
    b = SwapStallStats({"stall_s": [0.005], "window_s": [0.008]})
    both = a.aggregate(b)
    assert both.data == {"stall_s": [0.002, 0.005], "window_s": [0.010, 0.008]} and not both.is_empty()
    assert both.reduce() == {"swap_stall_s": 0.007, "steps_with_copies": 2}
    out = SimpleNamespace(kv_connector_output=SimpleNamespace(kv_connector_stats=both))
    assert measured_stall_and_window(out) == (0.005, 0.008)
    # No copies in the step (no stats), or another connector's stats: nothing measured.
    assert measured_stall_and_window(SimpleNamespace(kv_connector_output=None)) == (None, None)
    assert measured_stall_and_window(SimpleNamespace(kv_connector_output=SimpleNamespace(kv_connector_stats=None))) == (None, None)
    empty = SwapStallStats({"stall_s": []})
    assert empty.is_empty()
    assert measured_stall_and_window(SimpleNamespace(kv_connector_output=SimpleNamespace(kv_connector_stats=empty))) == (None, None)
    # vLLM's stats logger rebuilds the object from its dict.
    rebuilt = InterceptSwapConnector.build_kv_connector_stats(both.to_dict())
    assert isinstance(rebuilt, SwapStallStats) and rebuilt.reduce() == both.reduce()


def test_pinned_buffers_above_64_mib_are_exact_and_never_cached() -> None:
    """PyTorch's pinned allocator: blocks above pinned_max_cached_size_mb are neither rounded to a power of
    two nor cached; the setting is only ever lowered and keeps the other settings."""
    from engine_adapter.kv_copy import exact_pinned_above_mb

    before = torch._C._accelerator_getAllocatorSettings()
    try:
        torch._C._accelerator_setAllocatorSettings("pinned_max_cached_size_mb:1000,pinned_use_background_threads:True")
        assert exact_pinned_above_mb()  # torch 2.13 has the setting (2.11 has not: then cudaHostRegister)
        assert torch._C._accelerator_getAllocatorSettings() == "pinned_use_background_threads:True,pinned_max_cached_size_mb:64"
        torch._C._accelerator_setAllocatorSettings("pinned_max_cached_size_mb:16")
        exact_pinned_above_mb()
        assert torch._C._accelerator_getAllocatorSettings() == "pinned_max_cached_size_mb:16"
    finally:
        torch._C._accelerator_setAllocatorSettings(before or "pinned_max_cached_size_mb:64")
