"""The step-cost models: the measured one reproduces the profile's own numbers, the derived GPU profiles
are what their derivation gives (and S is the engine's own saturation rule applied to their grid)."""

from __future__ import annotations

import json

import pytest

from infercept.benchmarks.sim import gpu_profiles
from infercept.benchmarks.sim.cost import MeasuredCost, StepLoad, copies_s, make_cost, overlapped, step_s
from engine_adapter.policy.profile import Profile, saturation_point
from tests.sim.helpers import toy_profile

CPU = Profile(model="m", device="cpu", fwd_tokens=(64, 512, 2048), fwd_seconds=(0.003, 0.005, 0.045), saturation_tokens=512,
              kv_bytes_per_token=1024, swap_out_bytes_per_s=1e9, swap_in_bytes_per_s=2e9,
              extra={"decode": {"batch1_ctx512_s": 0.0046, "batch8_ctx512_s": 0.0062, "batch32_ctx512_s": 0.0153}})


@pytest.mark.parametrize("phi", [0.0, 0.5, 1.0])
def test_measured_cost_reproduces_the_profile(phi: float) -> None:
    c = MeasuredCost(CPU, context_share=phi)
    # A lone prompt of n tokens: T_fwd(n) more than a one-token step, as the profiler measures it
    # (time to first token of n tokens, less that of one token); a one-token step at context 512 is
    # the measured decode step, of which a share phi is its context.
    one = 0.0046 - CPU.t_fwd_s(1)
    for n, t in zip(CPU.fwd_tokens, CPU.fwd_seconds):
        assert c.forward_s(StepLoad(n, 1, 0, n * (n + 1) // 2)) == pytest.approx(t + (1 - phi) * one)
    for b, t in ((1, 0.0046), (8, 0.0062), (32, 0.0153)):  # B requests decoding at context 512
        assert c.forward_s(StepLoad(b, b, b * 512, b * 512)) == pytest.approx(t)
    # Between the measured batch sizes the step lies between its neighbours' (the steps' totals are
    # interpolated, not their cost per request, which falls steeply from B = 1); beyond the largest,
    # its cost per request holds.
    at = {b: c.forward_s(StepLoad(b, b, b * 512, b * 512)) for b in range(1, 65)}
    assert all(at[b] < at[b + 1] for b in range(1, 64))
    assert at[3] == pytest.approx(0.0046 + (0.0062 - 0.0046) * 2 / 7)  # T_fwd(B) is 0 below the grid's 64
    assert at[64] - CPU.t_fwd_s(64) == pytest.approx(2 * (0.0153 - CPU.t_fwd_s(32)))
    grows = c.forward_s(StepLoad(8, 8, 8 * 2048, 0)) - c.forward_s(StepLoad(8, 8, 8 * 512, 0))
    assert grows == pytest.approx(phi * (0.0062 - 0.003) / (8 * 512) * 8 * 1536)


def test_the_refined_profile_of_the_core_never_changes_the_device_cost() -> None:
    p = toy_profile()
    c = make_cost(p)
    p.observe(100, 1.0)  # the intercept core refines its own copy
    assert p.t_fwd_s(100) > 0.05 and c.forward_s(StepLoad(100, 1, 0, 0)) == pytest.approx(0.01)


def test_copies_overlap_on_gpus_and_links_but_add_on_a_plain_cpu() -> None:
    assert copies_s(CPU, 1000, 1000) == pytest.approx(1000 * 1024 / 1e9 + 1000 * 1024 / 2e9)
    assert not overlapped(CPU) and overlapped(toy_profile()) and overlapped(toy_profile(device="cpu+link"))
    assert step_s(0.01, 0.004, overlap=True) == 0.01 and step_s(0.01, 0.03, overlap=True) == 0.03
    assert step_s(0.01, 0.004, overlap=False) == pytest.approx(0.014)


@pytest.mark.parametrize("key", list(gpu_profiles.SETUPS))
def test_the_committed_gpu_profiles_are_what_the_derivation_gives(key: str) -> None:
    derived = gpu_profiles.derive(key)
    committed = json.loads((gpu_profiles.PROFILES / gpu_profiles.SETUPS[key].file).read_text())
    assert committed["fwd_seconds"] == pytest.approx(list(derived.fwd_seconds))
    assert committed["saturation_tokens"] == derived.saturation_tokens == saturation_point(derived.fwd_tokens, derived.fwd_seconds)
    assert committed["kv_bytes_per_token"] == {"gptj-6b-a100": 458_752, "llama2-70b-8xa100": 327_680}[key]
    assert committed["extra"]["kv_capacity_tokens"] == derived.extra["kv_capacity_tokens"]


def test_gptj_on_an_a100_is_weight_bound_when_decoding_and_compute_bound_in_prefill() -> None:
    p = gpu_profiles.derive("gptj-6b-a100")
    cost = make_cost(p)
    weights_s = 2 * gpu_profiles.GPTJ_6B.params / (2.0e12 * gpu_profiles.HBM_EFFICIENCY)
    one = cost.forward_s(StepLoad(1, 1, 0, 1))
    assert weights_s < one < weights_s + 2e-3  # ~7-8 ms a token: the weights stream once per step
    # Past the knee, time per token approaches 2 x params FLOPs at the tile efficiency.
    per_token = cost.forward_s(StepLoad(2048, 1, 0, 2048 * 2049 // 2)) / 2048
    ideal = 2 * gpu_profiles.GPTJ_6B.params / (312e12 * gpu_profiles.MMA_EFFICIENCY)
    assert ideal < per_token < 1.15 * ideal
    # The KV of a decode batch is read every step: 32 requests at 2k context cost more than at 512.
    assert cost.forward_s(StepLoad(32, 32, 32 * 2048, 32 * 2048)) > cost.forward_s(StepLoad(32, 32, 32 * 512, 32 * 512))
    assert gpu_profiles.GPTJ_6B.params == pytest.approx(6.05e9, rel=0.01)
    assert gpu_profiles.LLAMA2_70B.params == pytest.approx(69.0e9, rel=0.01)


def test_a_chunk_attending_to_earlier_context_costs_the_grids_quadratic_term() -> None:
    from infercept.benchmarks.sim.cost import attention_pair_s

    # A grid that is exactly a + b n + k n (n + 1) / 2: the fit finds k.
    k = 2e-8
    grid = (64, 256, 512, 1024, 2048)
    p = Profile(model="m", device="cpu", fwd_tokens=grid, fwd_seconds=tuple(0.002 + 1e-6 * n + k * n * (n + 1) / 2 for n in grid),
                saturation_tokens=512, kv_bytes_per_token=1024, swap_out_bytes_per_s=1e9, swap_in_bytes_per_s=1e9)
    assert attention_pair_s(p) == pytest.approx(k, rel=1e-6)
    c = MeasuredCost(p)
    # A 512-token chunk after 1024 tokens of context costs 512 x 1024 pairs more than a lone prompt of 512.
    lone, chunk = StepLoad(512, 1, 0, 512 * 513 // 2), StepLoad(512, 1, 1024, 512 * 1024 + 512 * 513 // 2, 512 * 1024)
    assert c.forward_s(chunk) - c.forward_s(lone) == pytest.approx(k * 512 * 1024)


def _decode_rows(jump: float = 0.0, threshold_tokens: int = 40_000) -> list[tuple[int, int, float]]:
    """A decode grid that is exactly a + b B + c B C, plus `jump` above `threshold_tokens` of KV."""
    rows = []
    for b in (1, 8, 16, 32, 48, 64):
        for ctx in (256, 512, 1024, 2048):
            rows.append((b, ctx, 0.006 + 3e-4 * b + 3e-7 * b * ctx + (jump if b * ctx > threshold_tokens else 0.0)))
    return rows


def test_the_cache_cliff_is_found_where_the_grid_jumps_and_not_where_it_is_smooth() -> None:
    from infercept.benchmarks.sim.cost import KVSpill

    cliff = KVSpill.fit(_decode_rows(jump=0.06), kv_bytes_per_token=1024)
    assert cliff is not None and cliff.jump_s == pytest.approx(0.06, rel=1e-6)
    # Midway between the largest measured KV below the jump (32 x 1024 tokens) and the smallest above (48 x 1024).
    assert cliff.threshold_bytes == pytest.approx((32 * 1024 + 48 * 1024) / 2 * 1024)
    assert KVSpill.fit(_decode_rows(), kv_bytes_per_token=1024) is None
    # Charged by the measured cost model only above the threshold, on top of what the profile says.
    c, plain = MeasuredCost(CPU, spill=cliff), MeasuredCost(CPU)
    small, large = StepLoad(32, 32, 32 * 512, 32 * 512), StepLoad(64, 64, 64 * 1024, 64 * 1024)
    assert c.forward_s(small) == pytest.approx(plain.forward_s(small))
    assert c.forward_s(large) == pytest.approx(plain.forward_s(large) + 0.06)
    assert KVSpill.from_dict(cliff.to_dict()) == cliff


def test_context_shares_come_from_a_grid_over_context_and_keep_the_profiles_steps() -> None:
    from infercept.benchmarks.sim.cost import context_shares

    shares = context_shares(_decode_rows(jump=0.06), CPU, below_bytes=40_000 * 1024)
    for b in (1, 8, 32):  # c B C / (D(B, C) - T_fwd(B)) at the profile's context 512
        d = 0.006 + 3e-4 * b + 3e-7 * b * 512
        assert shares[b] == pytest.approx(3e-7 * b * 512 / (d - CPU.t_fwd_s(b)), rel=1e-6)
    c = MeasuredCost(CPU, context_share=shares)
    for b, t in ((1, 0.0046), (8, 0.0062), (32, 0.0153)):  # the profile's own decode steps, unchanged
        assert c.forward_s(StepLoad(b, b, b * 512, b * 512)) == pytest.approx(t)
    # A step at batch 8 grows with context by its own share of the excess.
    grows = c.forward_s(StepLoad(8, 8, 8 * 2048, 0)) - c.forward_s(StepLoad(8, 8, 8 * 512, 0))
    assert grows == pytest.approx(shares[8] * (0.0062 - CPU.t_fwd_s(8)) / (8 * 512) * 8 * 1536)


def test_the_committed_decode_grid_reads() -> None:
    from pathlib import Path

    from infercept.benchmarks.sim.cost import read_decode_grid

    rows = read_decode_grid(Path(__file__).resolve().parents[2] / "results" / "sim" / "decode_context" / "decode.json")
    assert len(rows) >= 50 and all(b > 0 and c > 0 and t > 0 for b, c, t in rows)


def test_a_step_pays_the_prefill_paths_cost_per_prefilled_request_which_the_front_end_then_does_not(tmp_path) -> None:
    import dataclasses

    from infercept.benchmarks.sim.setup import SimBench
    from tests.sim.helpers import toy_bench

    prof = dataclasses.replace(CPU, extra={**CPU.extra, "per_request_overhead_s": 0.0096, "chunk_step_s": 0.002})
    c, given, plain = MeasuredCost(prof), MeasuredCost(prof, chunk_s=0.0005), MeasuredCost(CPU)
    decode, mixed = StepLoad(8, 8, 8 * 512, 8 * 512), StepLoad(40, 8, 8 * 512, 8 * 512 + 2 * 16 * 512, 2 * 16 * 512, chunks=2)
    assert c.forward_s(decode) == pytest.approx(plain.forward_s(decode))  # decodes alone: the profile's own steps
    assert c.forward_s(mixed) - plain.forward_s(mixed) == pytest.approx(2 * 0.002)
    assert given.forward_s(mixed) - plain.forward_s(mixed) == pytest.approx(2 * 0.0005)
    with pytest.raises(ValueError, match="chunk step cost"):
        MeasuredCost(prof, chunk_s=-0.001)
    # The profiler's one-token prompt (9.6 ms) beyond a one-token step (4.6 ms) paid it too: the front end
    # gets the rest, so an idle engine's time to first token is unchanged.
    sb: SimBench = toy_bench(tmp_path, profile=prof)
    assert sb.chunk_s() == 0.002
    assert sb.frontend() == pytest.approx((0.0015, 0.0015))
    assert dataclasses.replace(sb, chunk_step_s=0.0, workdir=tmp_path / "b").frontend() == pytest.approx((0.0025, 0.0025))
