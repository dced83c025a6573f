"""The swap connector's worker side driven through vLLM's hook order without an engine: the host buffer is
allocated at registration (exact size), a step's copies are bound, issued by the per-layer hooks and
complete at `wait_for_save`; loads are reported by `get_finished` in the step that completes them; KV
caches the copies cannot handle are refused at start; CUDA graphs are piecewise on a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, create_kv_cache_views
from vllm.v1.kv_cache_layout import KVCacheLayout

from engine_adapter.config import EngineConfig
from engine_adapter.swap_connector import InterceptSwapConnector, SwapMeta, SwapStallStats, kv_block_bytes

BLOCKS, LAYERS = 10, 2
SPEC = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32)


def setup(groups: int = 1, slots: int = 6) -> tuple[InterceptSwapConnector, dict[str, torch.Tensor]]:
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    page = SPEC.page_size_bytes
    tensor = KVCacheTensor(size=page * BLOCKS * LAYERS, layers=names, layer_stride=page * BLOCKS, block_stride=page)
    group_specs = [KVCacheGroupSpec(layer_names=names, kv_cache_spec=SPEC)]
    if groups == 2:
        group_specs.append(KVCacheGroupSpec(layer_names=["sliding"], kv_cache_spec=SPEC))
    kv_cfg = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[tensor], kv_cache_groups=group_specs)
    swap_gib = slots * kv_block_bytes(kv_cfg) / 2**30
    cfg = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={"swap_space_gib": swap_gib}),
                          parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))
    conn = InterceptSwapConnector(cfg, KVConnectorRole.WORKER, kv_cfg)  # type: ignore[arg-type]
    raw = torch.randn(tensor.size // 4).view(torch.int8)
    kv = dict(zip(names, create_kv_cache_views(raw, SPEC, BLOCKS, KVCacheLayout.LBNHC, tensor)))
    return conn, kv


def run_step(conn: InterceptSwapConnector, meta: SwapMeta, forward: bool = True) -> tuple[SwapStallStats | None, set[str] | None]:
    """One step in the order vLLM's runners call the hooks."""
    conn.bind_connector_metadata(meta)
    if forward:
        for name in conn.copier.kv:  # attention layer by layer: save_kv_layer after each
            conn.wait_for_layer_load(name)
            conn.save_kv_layer(name, conn.copier.kv[name], None)
        conn.start_load_kv(None)  # after the forward is launched
    conn.wait_for_save()
    _, loaded = conn.get_finished(set())
    stats = conn.get_kv_connector_stats()
    conn.clear_connector_metadata()
    return stats, loaded


@pytest.mark.parametrize("forward", [True, False], ids=["with-forward", "no-forward"])
def test_a_context_goes_out_and_comes_back_through_the_hooks(forward: bool) -> None:
    conn, kv = setup()
    conn.register_kv_caches(kv)
    assert conn.copier is not None and conn.copier.host_slots == conn.host_slots == 6
    assert conn.copier.host.numel() == 6 * kv_block_bytes(conn._kv_cfg)  # allocated now, exactly
    ref = {n: t[[3, 7]].clone() for n, t in kv.items()}
    stats, loaded = run_step(conn, SwapMeta(host_slots=6, swap_out=[(3, 0), (7, 1)]), forward)
    assert loaded is None
    assert isinstance(stats, SwapStallStats) and stats.data["stall_s"][0] >= 0 and len(stats.data["window_s"]) == 1
    for t in kv.values():
        t.zero_()
    stats, loaded = run_step(conn, SwapMeta(host_slots=6, swap_in=[(5, 0), (1, 1)], loads_done=["r1"]), forward)
    assert loaded == {"r1"}
    for n, t in kv.items():
        assert torch.equal(t[[5, 1]], ref[n])
    stats, loaded = run_step(conn, SwapMeta(host_slots=6))
    assert stats is None and loaded is None  # nothing moved, nothing measured


def test_reused_blocks_are_copied_at_bind_before_the_forward_writes_them() -> None:
    conn, kv = setup()
    conn.register_kv_caches(kv)
    ref = {n: t[4].clone() for n, t in kv.items()}
    conn.bind_connector_metadata(SwapMeta(host_slots=6, swap_out_first=[(4, 2)]))
    for t in kv.values():
        t[4] = -1.0  # the forward pass writes the block another request got in this step
    conn.wait_for_save()
    conn.clear_connector_metadata()
    for t in kv.values():
        t.zero_()
    run_step(conn, SwapMeta(host_slots=6, swap_in=[(8, 2)], loads_done=["r"]))
    for n, t in kv.items():
        assert torch.equal(t[8], ref[n])


def test_more_host_slots_than_the_worker_allocated_is_an_error() -> None:
    conn, kv = setup()
    conn.register_kv_caches(kv)
    with pytest.raises(RuntimeError, match="host slots"):
        conn.bind_connector_metadata(SwapMeta(host_slots=7, swap_out=[(1, 6)]))


def test_hybrid_kv_caches_are_refused_at_start() -> None:
    conn, kv = setup(groups=2)
    with pytest.raises(ValueError, match="KV cache groups"):
        conn.register_kv_caches(kv)


def test_cuda_graphs_are_piecewise_on_a_gpu_and_off_on_a_cpu() -> None:
    assert InterceptSwapConnector.requires_piecewise_for_cudagraph({})
    assert EngineConfig().resolved_enforce_eager(cuda=False) is True
    assert EngineConfig().resolved_enforce_eager(cuda=True) is False
    assert EngineConfig(enforce_eager=True).resolved_enforce_eager(cuda=True) is True


@pytest.mark.parametrize("timing,stall,window", [((12.0, 10.0), 0.002, [0.010]), ((5.0, None), 0.0, [])],
                         ids=["copies-outlast-the-forward", "forward-still-running"])
def test_cuda_steps_report_the_stall_their_events_measured(monkeypatch: pytest.MonkeyPatch, timing: tuple, stall: float,
                                                           window: list[float]) -> None:
    """On CUDA the copier's events give (copies' end, compute stream's end) in ms since bind: the stall is
    the copies' end past the compute stream's, 0 where the compute stream was still busy (window unknown)."""
    conn, kv = setup()
    conn.register_kv_caches(kv)
    finish = conn.copier.finish

    def timed_finish() -> None:
        finish()
        conn.copier.stats_ms = timing

    monkeypatch.setattr(conn.copier, "finish", timed_finish)
    stats, _ = run_step(conn, SwapMeta(host_slots=6, swap_out=[(3, 0)]))
    assert stats is not None and stats.data["stall_s"] == [pytest.approx(stall)] and stats.data["window_s"] == pytest.approx(window)


def test_a_deferred_barrier_reports_loads_and_stalls_after_it_runs() -> None:
    """With speculative decoding vLLM defers the barrier: it asks for finished loads and stats before
    `wait_for_save`. A load is reported only once its barrier has run, and no step's stall is lost."""
    conn, kv = setup()
    conn.register_kv_caches(kv)
    ref = {n: t[[3]].clone() for n, t in kv.items()}
    run_step(conn, SwapMeta(host_slots=6, swap_out=[(3, 0)]))
    for t in kv.values():
        t.zero_()

    conn.bind_connector_metadata(SwapMeta(host_slots=6, swap_in=[(5, 0)], loads_done=["r1"]))
    conn.start_load_kv(None)
    assert conn.get_finished(set()) == (None, None)  # asked before the barrier: not yet
    early = conn.get_kv_connector_stats()
    conn.wait_for_save()  # the deferred barrier (vLLM's finalize), metadata still bound
    conn.clear_connector_metadata()
    stats, loaded = run_step(conn, SwapMeta(host_slots=6))  # the next step reports what the barrier completed
    assert loaded == {"r1"}
    for n, t in kv.items():
        assert torch.equal(t[[5]], ref[n])
    reported = [s for s in (early, stats) if s is not None]
    assert len(reported) == 1 and reported[0].data["stall_s"][0] >= 0  # the load step's stall, once
    assert conn.get_kv_connector_stats() is None
