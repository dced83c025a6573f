"""The benchmark refuses a CPU profile whose T_fwd curve a busy machine swamped (its S would be wrong)."""

from __future__ import annotations

import pytest

from engine_adapter.policy.profile import saturation_point
from engine_adapter.profiler import ImplausibleProfile, check_fwd

GRID = (64, 256, 512, 1024, 2048)


def test_a_plausible_curve_passes() -> None:
    fwd = (0.0029, 0.0037, 0.0045, 0.0198, 0.0452)  # the shipped tiny-cpu-bench.json
    check_fwd(GRID, fwd)
    assert saturation_point(GRID, fwd) == 512


def test_a_swamped_point_or_a_collapse_is_refused() -> None:
    swamped = (1e-6, 0.00373, 0.00391, 0.01613, 0.04164)  # measured while another job ran: S would be 64
    assert saturation_point(GRID, swamped) == 64
    with pytest.raises(ImplausibleProfile, match=r"T_fwd\(64 tokens\) measured 0.001 ms"):
        check_fwd(GRID, swamped)
    with pytest.raises(ImplausibleProfile, match="fell from 4.50 ms at 512 tokens to 1.00 ms at 1024"):
        check_fwd(GRID, (0.0029, 0.0037, 0.0045, 0.0010, 0.0452))
