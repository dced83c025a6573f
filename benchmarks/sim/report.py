"""Headline numbers from simulated sweeps, in the shape the fair benchmark (issue 12) gives bench.json:
per policy the max rate at the SLO (the runner's `max_rate_at_slo`: the median normalized latency,
interpolated between the last passing and the first failing rate), its ratios to discard, vllm-apc,
ttl and the bound (`unlimited-kv`), and, at the highest rate that passes, the waste share and the mean
job completion time."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.metrics import max_rate_at_slo

BOUND = "unlimited-kv"
RATIO_TO = ("discard", "vllm-apc", "ttl")


def points(runs: Mapping[str, Mapping[str, Any]]) -> list[tuple[float, float | None]]:
    return [(float(r["rate"]), r["normalized_latency_s"]["median"]) for r in runs.values()]


def at_highest_passing(runs: Mapping[str, Mapping[str, Any]], slo_s: float) -> Mapping[str, Any] | None:
    ok = [r for r in runs.values() if r["normalized_latency_s"]["median"] is not None
          and r["normalized_latency_s"]["median"] <= slo_s]
    return max(ok, key=lambda r: r["rate"]) if ok else None


def headline(per_seed: Sequence[Mapping[str, Mapping[str, Mapping[str, Any]]]], slo_s: Sequence[float],
             bound: str = BOUND) -> dict[str, dict[str, Any]]:
    """`per_seed[i][policy][rate]` = a rate's summary; `slo_s[i]` the SLO of seed i. The headline is
    the median over seeds (with min and max)."""
    labels = list(per_seed[0])
    rates: dict[str, list[float]] = {lab: [] for lab in labels}
    censored: dict[str, bool] = {lab: False for lab in labels}
    waste: dict[str, list[float]] = {lab: [] for lab in labels}
    waste_true: dict[str, list[float]] = {lab: [] for lab in labels}
    jct: dict[str, list[float]] = {lab: [] for lab in labels}
    for runs_by_policy, slo in zip(per_seed, slo_s):
        for lab in labels:
            r, c = max_rate_at_slo(points(runs_by_policy[lab]), slo)
            rates[lab].append(r)
            censored[lab] |= c
            best = at_highest_passing(runs_by_policy[lab], slo)
            if best is not None:
                if best.get("waste_share_of_capacity_time") is not None:
                    waste[lab].append(best["waste_share_of_capacity_time"])
                if best.get("waste_share_true_stall") is not None:
                    waste_true[lab].append(best["waste_share_true_stall"])
                if (best.get("jct_s") or {}).get("mean") is not None:
                    jct[lab].append(best["jct_s"]["mean"])
    med = {lab: statistics.median(v) for lab, v in rates.items()}

    def ratio(a: str, b: str) -> float | None:
        return med[a] / med[b] if b in med and med[b] > 0 else None

    out = {}
    for lab in labels:
        h: dict[str, Any] = {"max_rate_at_slo": med[lab], "max_rate_min": min(rates[lab]), "max_rate_max": max(rates[lab]),
                             "censored": censored[lab]}
        for other in RATIO_TO:
            h[f"ratio_vs_{other}"] = ratio(lab, other)
        h["ratio_vs_bound"] = ratio(lab, bound)
        h["waste_share_at_slo_rate"] = statistics.median(waste[lab]) if waste[lab] else None
        h["waste_share_at_slo_rate_true_stall"] = statistics.median(waste_true[lab]) if waste_true[lab] else None
        h["jct_mean_s"] = statistics.median(jct[lab]) if jct[lab] else None
        out[lab] = h
    return out


def table(head: Mapping[str, Mapping[str, Any]]) -> str:
    def f(x: float | None, pct: bool = False) -> str:
        if x is None:
            return "-"
        return f"{x * 100:.2f}%" if pct else f"{x:.2f}"

    lines = [f"{'policy':20s} {'max rate@SLO':>12s} {'vs discard':>10s} {'vs vllm-apc':>11s} {'vs ttl':>7s} {'vs bound':>8s} "
             f"{'waste@SLO':>9s} {'JCT mean':>9s}"]
    for lab, h in head.items():
        mark = "+" if h.get("censored") else " "
        lines.append(f"{lab:20s} {h['max_rate_at_slo']:11.2f}{mark} {f(h['ratio_vs_discard']):>10s} {f(h['ratio_vs_vllm-apc']):>11s} "
                     f"{f(h['ratio_vs_ttl']):>7s} {f(h['ratio_vs_bound']):>8s} {f(h['waste_share_at_slo_rate'], True):>9s} "
                     f"{f(h['jct_mean_s']):>8s}s")
    lines.append("(+: met the SLO at every rate tried; waste share and JCT at the highest rate that meets the SLO)")
    return "\n".join(lines)
