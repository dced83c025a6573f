"""The profile's saturation point from whole iterations, and the benchmark's check of a fresh profile."""

from __future__ import annotations

import pytest

from engine_adapter.policy.profile import saturation_point
from engine_adapter.profiler import ImplausibleProfile, check_fwd, iteration_saturation

GRID = (64, 256, 512, 1024, 2048)


def test_s_counts_the_iteration_fixed_part() -> None:
    shipped = (0.0029, 0.0037, 0.0045, 0.0198, 0.0452)  # tiny-cpu-bench.json, T_fwd(N) over a 1-token prompt
    assert iteration_saturation(GRID, shipped, step_s=0.0046) == saturation_point(GRID, shipped) == 512
    # Measured on this machine on 2026-12-03, three times: T_fwd(64) ~ 0 (the step's fixed part hides the
    # first tokens). On T_fwd alone 64 tokens look free and S collapses to 64; whole iterations give 512.
    today = (1e-6, 0.00232, 0.00259, 0.01829, 0.04228)
    assert saturation_point(GRID, today) == 64
    assert iteration_saturation(GRID, today, step_s=0.0046) == 512
    check_fwd(GRID, today)  # plausible: more tokens never cost less


def test_a_collapsing_curve_is_refused() -> None:
    with pytest.raises(ImplausibleProfile, match="fell from 4.50 ms at 512 tokens to 1.00 ms at 1024"):
        check_fwd(GRID, (0.0029, 0.0037, 0.0045, 0.0010, 0.0452))
    # Measured on 2026-12-04 by a bench's fresh profile (median of two 1-token runs, one slow): 256 tokens
    # "free" on a CPU. Refused there; on a GPU a flat start is what a forward pass looks like.
    broken = (1e-6, 1e-6, 0.0008, 0.01195, 0.03803)
    with pytest.raises(ImplausibleProfile, match=r"T_fwd\(256 tokens\) measured 1 us on a CPU"):
        check_fwd(GRID, broken, "cpu")
    check_fwd(GRID, broken, "cuda")
    check_fwd(GRID, (1e-6, 0.00232, 0.00259, 0.01829, 0.04228), "cpu")  # 64 tokens hidden by the fixed part: fine
