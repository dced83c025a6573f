"""What every benchmark run's summary must hold, on the real engine (`infercept bench`) and in the simulator
(`infercept simulate`) alike: both go through `infercept.benchmarks.metrics`, so one check serves both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HEADLINE_KEYS = {"max_rate_at_slo", "max_rate_min", "max_rate_max", "waste_share_at_slo_rate", "jct_mean_s"}
RUN_KEYS = ("normalized_latency_s", "jct_s", "ttft_s", "throughput_rps", "waste", "waste_share_of_capacity_time",
            "recompute_share_of_forward", "swap_stall_s")


def check_headline(h: Mapping[str, Any], peers: list[str]) -> None:
    assert set(h) >= HEADLINE_KEYS | {f"ratio_vs_{p}" for p in peers}, sorted(set(h))


def check_run(run: Mapping[str, Any], capacity_tokens: int) -> None:
    """One run's figures, from the real engine's replay or the simulator's (both time every turn)."""
    # Every request is accounted for exactly once: finished, failed, or still running at the cutoff.
    assert run["requests"] > 0 and run["completed"] + run["timed_out"] + run["failed"] == run["requests"]
    assert run["failed"] == 0, run.get("errors")
    for k in RUN_KEYS:
        assert k in run, k
    assert run["capacity_tokens"] == capacity_tokens  # one denominator for every policy
    assert set(run["waste"]) == {"preserved_idle", "recompute", "swap_stall"}
    tt = run["turn_timing"]
    # Every turn a request ran is timed: at least one per request that got its first token.
    assert tt["turns"] >= run["completed"] > 0 and tt["decode_per_token_s"]["median"] > 0
    assert tt["new_first_token_s"]["median"] > 0 and tt["resume_first_token_s"]["median"] is not None
