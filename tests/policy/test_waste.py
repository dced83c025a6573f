"""The waste equations against hand-computed values, on a profile with round numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapter.policy.estimator import (
    DurationEstimator,
    load_priors,
    lognormal_quantiles,
)
from engine_adapter.policy.profile import Profile, kv_bytes_per_token, saturation_point
from engine_adapter.policy.waste import (
    recompute_chunk_tokens,
    split_swap_budget,
    swap_limit_tokens,
    waste_chunked_discard_byte_s,
    waste_discard_byte_s,
    waste_min_byte_s,
    waste_preserve_byte_s,
    waste_swap_byte_s,
)

REPO = Path(__file__).resolve().parents[2]

# T_fwd: 10 ms up to 100 tokens, then 0.1 ms per token (linear): T(200) = 20 ms, T(1000) = 100 ms.
P = Profile(
    model="m", device="d", fwd_tokens=(100, 1000), fwd_seconds=(0.010, 0.100), saturation_tokens=400,
    kv_bytes_per_token=1000, swap_out_bytes_per_s=1e7, swap_in_bytes_per_s=2e7,
)


def test_t_fwd_interpolation() -> None:
    assert P.t_fwd_s(100) == pytest.approx(0.010)
    assert P.t_fwd_s(550) == pytest.approx(0.055)
    assert P.t_fwd_s(2000) == pytest.approx(0.200)  # extrapolated along the last segment
    assert P.t_fwd_s(50) == pytest.approx(0.010)  # below the grid: the smallest measured step
    assert P.t_fwd_s(0) == 0.0
    assert P.t_swap_out_s(1000) == pytest.approx(0.1) and P.t_swap_in_s(1000) == pytest.approx(0.05)


def test_preserve_eq2() -> None:
    # 2 s * 500 tokens * 1000 B
    assert waste_preserve_byte_s(2.0, 500, 1000) == pytest.approx(1e6)


def test_discard_eq1() -> None:
    # T(1000) = 0.1 s; 0.1 * 1000 * 1000 + 0.1 * 3000 * 1000
    assert waste_discard_byte_s(P, 1000, 3000) == pytest.approx(1e5 + 3e5)


def test_chunked_discard_eq4() -> None:
    # C = 1000 in chunks of 250 -> n = 4, T(250) = 0.025 s
    # 0.1 * 1000 * 1000 / 2 + 4 * 0.025 * 3000 * 1000 = 5e4 + 3e5
    assert waste_chunked_discard_byte_s(P, 1000, 3000, chunk_tokens=250) == pytest.approx(5e4 + 3e5)
    # Never more than Eq. 1 (n * T(C/n) <= T(C) on a concave-or-linear T_fwd).
    assert waste_chunked_discard_byte_s(P, 1000, 3000, 250) <= waste_discard_byte_s(P, 1000, 3000)
    # Prefix-cache hits: only 600 tokens recomputed, n = 3 chunks of 200 -> T(600)=0.06, T(200)=0.02
    assert waste_chunked_discard_byte_s(P, 1000, 3000, 250, cached_tokens=400) == pytest.approx(
        0.06 * 600 * 1000 / 2 + 3 * 0.02 * 3000 * 1000
    )
    assert waste_chunked_discard_byte_s(P, 1000, 3000, 250, cached_tokens=1000) == 0.0


def test_swap_eq3() -> None:
    # mean of out 0.1 s and in 0.05 s over 1000 tokens = 0.075; 2 * 0.075 * 4000 * 1000
    assert waste_swap_byte_s(P, 1000, 4000) == pytest.approx(6e5)


def test_min_waste_eq5_short_call_preserves_long_call_discards() -> None:
    short = waste_min_byte_s(P, t_int_s=0.001, context_tokens=1000, other_tokens=3000, chunk_tokens=250)
    long = waste_min_byte_s(P, t_int_s=20.0, context_tokens=1000, other_tokens=3000, chunk_tokens=250)
    assert short == (pytest.approx(1e3), "preserve")
    assert long == (pytest.approx(3.5e5), "discard")


def test_chunk_size_and_swap_limit() -> None:
    assert recompute_chunk_tokens(P, running_batch_tokens=100) == 300
    assert recompute_chunk_tokens(P, running_batch_tokens=1000) == 16  # always progresses
    # T_fwd(550) = 55 ms at min(1e7, 2e7) B/s = 550 kB = 550 tokens of 1000 B
    assert swap_limit_tokens(P, 550) == 550


@pytest.mark.parametrize(
    "n, want_out, want_in, host, dev",
    [(500, 300, 300, 1000, 1000), (500, 1000, 0, 200, 0), (500, 0, 400, 0, 100), (100, 80, 80, 0, 0), (0, 5, 5, 5, 5),
     (1000, 600, 700, 100, 50)],
)
def test_swap_budget_invariants(n: int, want_out: int, want_in: int, host: int, dev: int) -> None:
    b = split_swap_budget(n, want_out, want_in, host, dev)
    assert 0 <= b.out_tokens <= want_out and 0 <= b.in_tokens <= want_in
    assert b.out_tokens + b.in_tokens <= n
    assert b.out_tokens <= host + b.in_tokens
    assert b.in_tokens <= dev + b.out_tokens


def test_swap_budget_prefers_swap_in_and_uses_freed_room() -> None:
    assert split_swap_budget(500, 300, 300, 1000, 1000) == split_swap_budget(500, 300, 300, 1000, 1000)
    b = split_swap_budget(500, 300, 300, 1000, 1000)
    assert (b.in_tokens, b.out_tokens) == (300, 200)
    # No free device memory: swap-in can only use what swap-out frees in the same iteration.
    b = split_swap_budget(1000, 400, 400, 1000, 0)
    assert b.in_tokens <= b.out_tokens and b.in_tokens > 0


def test_saturation_point_and_m() -> None:
    tokens = [16, 64, 256, 512, 1024]
    seconds = [0.05, 0.07, 0.20, 0.40, 0.91]  # per token: 3.1, 1.1, 0.78, 0.78, 0.89 ms
    assert saturation_point(tokens, seconds) == 256
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, bf16 -> 22.5 KiB per token (NOTES.md)
    assert kv_bytes_per_token(30, 3, 64, 2) == 23040


def test_profile_validation_and_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(P.to_json())
    assert Profile.load(f) == P
    with pytest.raises(ValueError):
        Profile("m", "d", (10, 5), (0.1, 0.2), 4, 1, 1.0, 1.0)


def test_estimators() -> None:
    priors = load_priors(str(REPO / "configs" / "augmentations.yaml"))
    assert priors["chat"] == (28.6, 15.6) and set(priors) == {"math", "qa", "ve", "chat", "image", "tts"}
    q = lognormal_quantiles(20.0, 8.0, 2000)
    assert sum(q) / len(q) == pytest.approx(20.0, rel=0.02)

    dyn = DurationEstimator("dynamic", priors)
    assert dyn.remaining_s("chat", 3.0) == 3.0
    orc = DurationEstimator("oracle", priors)
    assert orc.remaining_s("chat", 3.0, true_duration_s=10.0) == 7.0
    pri = DurationEstimator("prior", priors)
    # Just paused: about the type's mean; a fast type stays fast; a long-running call keeps a
    # positive expected remainder.
    assert pri.remaining_s("chat", 0.0) == pytest.approx(28.6, rel=0.15)
    assert pri.remaining_s("math", 0.0) < 1e-3
    assert 0 < pri.remaining_s("chat", 40.0) < 40.0
    # Past every sample: fall back to the dynamic estimate.
    assert pri.remaining_s("math", 5.0) == 5.0
    # Observations move the estimate.
    for _ in range(256):
        pri.observe("qa", 5.0)
    assert pri.remaining_s("qa", 0.0) == pytest.approx(5.0, rel=0.1)
    with pytest.raises(ValueError):
        DurationEstimator("magic")


def test_online_refinement_scales_only_nearby_sizes() -> None:
    p = Profile.from_dict(__import__("json").loads(P.to_json()))
    for _ in range(200):
        p.observe(1000, 0.2)  # the engine sees iterations of 1000 tokens take twice the profile
    assert p.t_fwd_s(1000) == pytest.approx(0.2, rel=0.01)
    assert p.t_fwd_s(100) == pytest.approx(0.010)  # the other grid point is untouched
    assert p == P and "_ratios" not in p.to_json()  # refinement is runtime state, not profile data


def test_grid_bucket_is_the_nearest_point_on_a_log_scale() -> None:
    """`Profile._bucket` finds the grid point by bisection (it runs for every paused request in every step);
    it must pick what the nearest point on a log scale is, ties to the smaller, on every shipped grid."""
    import json
    import math
    import random

    def nearest(xs: tuple[int, ...], t: float) -> int:
        return min(xs, key=lambda x: abs(math.log(x) - math.log(max(t, 1e-9))))

    rng = random.Random(0)
    for path in sorted((REPO / "configs" / "profiles").glob("*.json")):
        p = Profile.from_dict(json.loads(path.read_text()))
        xs = p.fwd_tokens
        sizes = [0, -5, 1e-12, 0.5, *xs, *range(1, 2 * xs[-1], 7), *(rng.uniform(0, 3 * xs[-1]) for _ in range(2000))]
        assert [p._bucket(t) for t in sizes] == [nearest(xs, t) for t in sizes], path.name


def test_mean_residual_life_is_the_mean_excess_of_the_longer_samples() -> None:
    """The prior estimator's remaining time, from the ordered samples' tail sums, against its definition:
    the mean of (x - elapsed) over the samples longer than elapsed (elapsed itself when none is), as the
    samples change with observations."""
    import random

    est = DurationEstimator("prior", {"a": (0.5, 1.0), "b": (3.0, 0.1)})
    rng = random.Random(1)
    for k in range(600):
        if k % 5 == 0:
            est.observe(rng.choice("ab"), rng.expovariate(1.0))
        t, e = rng.choice("ab"), rng.choice([0.0, rng.uniform(0, 6), 100.0])
        longer = [x - e for x in est.samples(t) if x > e]
        want = sum(longer) / len(longer) if longer else e
        assert est.remaining_s(t, e) == pytest.approx(want, rel=1e-12, abs=1e-12)
