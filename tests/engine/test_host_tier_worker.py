"""The host tier's data mover on CPU tensors, without an engine: a block stored and loaded back is
byte-identical, the host buffer is exactly the configured size, vLLM's LRU manager built by our spec
never hands out more chunks than that (it evicts the least recently used), and the emulated link
holds a job back for its bytes' time."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from engine_adapter.host_tier import EmulatedLink, HostTierWorker, InterceptHostTierSpec, host_tensor_bytes

NUM_BLOCKS, PAGE, LAYERS = 8, 96, 2  # bytes per block per layer


def caches() -> tuple[list[torch.Tensor], CanonicalKVCaches]:
    # vLLM's canonical views: one [num_blocks, page bytes] int8 tensor per layer.
    ts = [torch.randint(-128, 127, (NUM_BLOCKS, PAGE), dtype=torch.int8) for _ in range(LAYERS)]
    return ts, CanonicalKVCaches([CanonicalKVCacheTensor(t, PAGE) for t in ts],
                                 [[CanonicalKVCacheRef(i, PAGE) for i in range(LAYERS)]])


def dev(ids: list[int]) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_store_then_load_restores_blocks_exactly() -> None:
    ts, kv = caches()
    w = HostTierWorker(kv, num_chunks=4, link_bytes_per_s=None)
    assert host_tensor_bytes(w) == 4 * LAYERS * PAGE  # exactly the configured chunks
    before = [t.clone() for t in ts]
    assert w.submit_store(1, dev([5, 2]), CPULoadStoreSpec([3, 0]))
    for t in ts:
        t[5].zero_()
        t[2].zero_()
    assert w.submit_load(2, CPULoadStoreSpec([3, 0]), dev([6, 1]))  # into other device blocks
    for t, b in zip(ts, before):
        assert torch.equal(t[6], b[5]) and torch.equal(t[1], b[2])
        assert not torch.equal(t[5], b[5])  # the source really was overwritten: the copy came from the host
    assert sorted(r.job_id for r in w.get_finished()) == [1, 2]
    assert w.get_finished() == []
    with pytest.raises(IndexError):  # a chunk past the host buffer
        w.submit_store(3, dev([0]), CPULoadStoreSpec([4]))


def test_link_holds_jobs_for_their_bytes_time() -> None:
    clock = Clock()
    _, kv = caches()
    block = LAYERS * PAGE
    w = HostTierWorker(kv, num_chunks=4, link_bytes_per_s=block / 0.5, clock=clock)  # 0.5 s per block
    w.submit_store(1, dev([1, 2]), CPULoadStoreSpec([0, 1]))  # 1 s of link
    w.submit_load(2, CPULoadStoreSpec([0]), dev([3]))  # queued behind it: done at 1.5 s
    clock.t += 0.9
    assert w.get_finished() == []
    clock.t += 0.2
    [r] = w.get_finished()
    assert (r.job_id, r.transfer_size) == (1, 2 * block)
    clock.t += 0.5
    assert [r.job_id for r in w.get_finished()] == [2]
    link = EmulatedLink(None, clock)
    assert link.transfer(10**9, clock.t) == clock.t  # unthrottled: done when copied


def offloading_config(chunks: int, block_bytes: int, eviction: str = "lru") -> OffloadingConfig:
    return OffloadingConfig(
        groups=(), worker_kv_bytes_per_block=block_bytes, enable_kv_cache_events=False,
        extra_config={"swap_space_gib": chunks * block_bytes / 2**30, "eviction_policy": eviction},
        engine_id="e", model=OffloadingModelConfig("m", "float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=32, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True))


def test_lru_manager_never_exceeds_the_host_buffer() -> None:
    spec = InterceptHostTierSpec(offloading_config(chunks=3, block_bytes=32 * 1024))
    assert spec.num_chunks == 3
    mgr = spec.get_manager()
    ctx = ReqContext("r")
    mgr.on_new_request(ctx)
    keys = [make_offload_key(bytes([i]) * 8, 0) for i in range(6)]
    used: set[int] = set()
    evicted: list[bytes] = []
    for i, key in enumerate(keys):
        out = mgr.prepare_store([key], ctx)
        assert out is not None and out.keys_to_store == [key]
        chunk_ids = [int(c) for c in out.store_spec.block_ids]
        assert all(0 <= c < 3 for c in chunk_ids)  # within the host buffer, always
        used.update(chunk_ids)
        evicted += out.evicted_keys
        mgr.complete_store([key], ctx)
        if i == 2:
            mgr.touch([keys[0]], ctx)  # keys[0] recently used: keys[1] is now the least recent
    assert used == {0, 1, 2}
    assert evicted == [keys[1], keys[2], keys[0]]  # least recently used first
    assert [mgr.lookup(k, ctx).name for k in keys] == ["MISS", "MISS", "MISS", "HIT", "HIT", "HIT"]


@pytest.mark.parametrize("eviction", ["lru", "SessionEndLRU"])
def test_an_ended_sessions_blocks_go_first_under_session_end_lru(eviction: str) -> None:
    """Sessions a and b store two blocks each; a ends (its one vLLM request finishes); c needs two chunks.
    vLLM's LRU has just made a's blocks the most recent and evicts b's, the session still paused in a call;
    `SessionEndLRU` evicts a's, its last block first."""
    mgr = InterceptHostTierSpec(offloading_config(chunks=4, block_bytes=32 * 1024, eviction=eviction)).get_manager()
    ctx = {r: ReqContext(r) for r in "abc"}
    keys = {r: [make_offload_key(bytes([i, j]) * 4, 0) for j in range(2)] for i, r in enumerate("abc")}
    evicted: list = []
    for r in "abc":
        mgr.on_new_request(ctx[r])
        out = mgr.prepare_store(keys[r], ctx[r])
        assert out is not None and out.keys_to_store == keys[r]
        evicted += out.evicted_keys
        mgr.complete_store(keys[r], ctx[r])
        if r == "b":
            mgr.on_request_finished(ctx["a"])
    gone = "b" if eviction == "lru" else "a"
    assert evicted == (keys["b"] if eviction == "lru" else keys["a"][::-1])
    assert [mgr.lookup(k, ctx["c"]).name for k in keys[gone]] == ["MISS", "MISS"]


def test_unknown_eviction_policies_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown eviction_policy 'fifo'; choose one of lru, SessionEndLRU"):
        InterceptHostTierSpec(offloading_config(chunks=4, block_bytes=1024, eviction="fifo"))


def test_spec_refuses_multi_block_chunks() -> None:
    import dataclasses

    cfg = offloading_config(chunks=3, block_bytes=1024)
    with pytest.raises(ValueError, match="blocks_per_chunk must be 1"):
        InterceptHostTierSpec(dataclasses.replace(cfg, cache=OffloadingCacheConfig(32, 2)))
