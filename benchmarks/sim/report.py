"""Headline numbers from simulated sweeps, by the benchmark's own rule (`infercept.benchmarks.metrics.headline`:
per policy the median over seeds of the max rate at the SLO with min and max, ratios to discard,
vllm-apc, ttl and the bound, waste share and JCT at the highest rate within the SLO), so that a
simulated headline has bench.json's shape; plus what only the simulator knows (the waste share with
the true swap stall instead of the core meter's estimate)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from infercept.benchmarks.metrics import headline as bench_headline
from infercept.benchmarks.metrics import meets_slo, run_at_knee

Runs = Mapping[str, Mapping[int, Mapping[str, Mapping[str, Any]]]]  # runs[policy][seed][rate] = a run's summary


def points(runs: Mapping[str, Mapping[str, Any]]) -> list[tuple[float, float | None]]:
    return [(float(r["rate"]), r["normalized_latency_s"]["median"]) for r in runs.values()]


def headline(runs: Runs, slo_s: float, ttft_slo_s: float | None = None,
             resume_slo_s: float | None = None) -> dict[str, dict[str, Any]]:
    """bench.json's headline over `runs[policy][seed][rate]` at one SLO, plus the true-stall waste share."""
    head = bench_headline(runs, slo_s, ttft_slo_s, resume_slo_s)
    for label, by_seed in runs.items():
        # at the run headline() reads its other numbers from: the knee by the same rule, first tokens included
        knee_runs = [run_at_knee(r, slo_s, ttft_slo_s, resume_slo_s) for r in by_seed.values()]
        xs = [best["waste_share_true_stall"] for best in knee_runs
              if meets_slo(best, slo_s, ttft_slo_s, resume_slo_s) and best.get("waste_share_true_stall") is not None]
        head[label]["waste_share_at_slo_rate_true_stall"] = statistics.median(xs) if xs else None
    return head


def table(head: Mapping[str, Mapping[str, Any]], budgets: Mapping[str, Any] | None = None) -> str:
    def f(x: float | None, pct: bool = False) -> str:
        if x is None:
            return "-"
        return f"{x * 100:.2f}%" if pct else f"{x:.2f}"

    budgets = budgets or {}
    lines = [(f"{'policy':18s} {'budget':>6s} {'max rate@SLO (min..max)':>24s} {'vs discard':>10s} {'vs apc':>7s} {'vs ttl':>7s} "
              f"{'vs bound':>8s} {'waste@SLO':>9s} {'JCT mean':>9s}")]
    for lab, h in head.items():
        mark = "+" if h.get("censored") else " "
        rate = f"{h['max_rate_at_slo']:.2f}{mark} ({h['max_rate_min']:.2f}..{h['max_rate_max']:.2f})"
        lines.append(f"{lab:18s} {budgets.get(lab, '')!s:>6s} {rate:>24s} {f(h['ratio_vs_discard']):>10s} "
                     f"{f(h.get('ratio_vs_vllm-apc')):>7s} {f(h.get('ratio_vs_ttl')):>7s} {f(h.get('ratio_vs_bound')):>8s} "
                     f"{f(h['waste_share_at_slo_rate'], True):>9s} {f(h['jct_mean_s']):>8s}s")
    lines.append("(max rate@SLO: median over seeds; +: met the SLO at every rate tried; waste share of the real KV "
                 "capacity x time and JCT at the highest rate within the SLO)")
    return "\n".join(lines)
