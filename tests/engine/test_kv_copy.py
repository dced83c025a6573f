"""The swap connector's block copies (`kv_copy.BlockCopier`): random KV swapped out to the host buffer and
back into other device blocks comes back bit-exact, in both the plain CPU path and the staged path CUDA
uses (pinned staging, scatter after the stream's barrier), and on a real GPU where there is one; and
blocks overwritten in the very step that copies them out (released and reused at once) still come
back as they were (`copy_out_before_writes`: the compute stream waits for the gathers)."""

from __future__ import annotations

import pytest
import torch

from engine_adapter.kv_copy import BlockCopier, block_dims

# Two layers in the CPU attention layout ([blocks, heads, block_size, 2 * head]) and one in the CUDA
# flash layout ([2, blocks, block_size, heads, head]): the block dimension differs.
NUM_BLOCKS = 12


def layers(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "l0": torch.randn((NUM_BLOCKS, 2, 16, 8), generator=g).to(torch.bfloat16).to(device),
        "l1": torch.randn((NUM_BLOCKS, 2, 16, 8), generator=g).to(torch.bfloat16).to(device),
        "flash": torch.randn((2, NUM_BLOCKS, 16, 2, 4), generator=g).to(torch.float16).to(device),
    }


def round_trip(device: str, staged: bool | None, reused_in_step: bool = False) -> None:
    """Out to the host and back into other device blocks. `reused_in_step`: the blocks are released and
    written by the forward pass in the very step that copies them out (`copy_out_before_writes`)."""
    kv = layers(device)
    original = {n: t.clone() for n, t in kv.items()}
    dims = block_dims(kv, NUM_BLOCKS)
    assert dims == {"l0": 0, "l1": 0, "flash": 1}
    copier = BlockCopier(kv, dims, host_slots=8, staged=staged)
    out_pairs = [(1, 5), (4, 0), (7, 3)]  # device block -> host slot, scattered both ways
    if reused_in_step:
        if device == "cuda":
            # Keep the compute stream busy, so the side stream's copies (ordered after it) start late: an
            # unordered write below would race them.
            busy = torch.randn((2048, 2048), device=device)
            for _ in range(30):
                busy = torch.tanh(busy @ busy)
        copier.copy_out_before_writes(out_pairs)
        for name, t in kv.items():  # the forward pass, layer by layer, writes other KV into those blocks
            t.index_fill_(dims[name], torch.tensor([d for d, _ in out_pairs], device=t.device), 7.0)
        copier.finish()
    else:
        for name in kv:
            copier.copy_out(name, out_pairs)
        copier.finish()
        for t in kv.values():
            t.zero_()  # the device blocks are reused by others meanwhile
    in_pairs = [(9, 5), (2, 0), (11, 3)]  # back into different device blocks
    for name in kv:
        copier.copy_in(name, in_pairs)
    copier.finish()
    for name, t in kv.items():
        dim = dims[name]
        for (src, _), (dst, _) in zip(out_pairs, in_pairs):
            got, want = t.select(dim, dst), original[name].select(dim, src)
            assert torch.equal(got.cpu(), want.cpu()), (name, src, dst)
            if reused_in_step:
                assert bool((t.select(dim, src) == 7.0).all())  # the reuse's writes landed after the copy
        if not reused_in_step:
            untouched = [b for b in range(NUM_BLOCKS) if b not in {d for d, _ in in_pairs}]
            assert not t.index_select(dim, torch.tensor(untouched, device=t.device)).any()  # nothing else written
    assert copier.bytes_moved == 2 * 3 * sum(copier.block_bytes(n) for n in kv)


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
def test_cpu_round_trip_is_bit_exact(staged: bool) -> None:
    round_trip("cpu", staged)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_round_trip_is_bit_exact() -> None:
    round_trip("cuda", None)  # staged by default on CUDA: pinned host memory, side stream


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
def test_cpu_blocks_reused_in_the_copying_step_come_back_intact(staged: bool) -> None:
    round_trip("cpu", staged, reused_in_step=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_blocks_reused_in_the_copying_step_come_back_intact() -> None:
    round_trip("cuda", None, reused_in_step=True)


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
