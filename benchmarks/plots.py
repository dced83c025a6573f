"""The benchmark's figures: normalized latency over request rate with the spread over seeds (the
paper's Fig. 2) and the ablation's max rate at the SLO step by step (Fig. 3)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from infercept.benchmarks.replay import ABLATION


def plots(result: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    slo = result["slo"]["slo_normalized_latency_s"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label, by_seed in result["results"].items():
        rates = sorted({r["rate"] for runs in by_seed.values() for r in runs.values()})
        med, lo, hi = [], [], []
        for rate in rates:
            vals = [r["normalized_latency_s"]["median"] * 1000 for runs in by_seed.values() for r in runs.values()
                    if r["rate"] == rate and r["normalized_latency_s"]["median"]]
            med.append(statistics.median(vals) if vals else float("nan"))
            lo.append(min(vals) if vals else float("nan"))
            hi.append(max(vals) if vals else float("nan"))
        line, = ax.plot(rates, med, marker="o", label=label, linewidth=2.5 if label.startswith("infercept") else 1.2,
                        linestyle="--" if label == "unlimited-kv" else "-")
        ax.fill_between(rates, lo, hi, color=line.get_color(), alpha=0.15)
    if slo:
        ax.axhline(slo * 1000, color="grey", linestyle=":", linewidth=1, label=f"SLO ({result['slo']['slo_factor']:g}x unloaded)")
    ax.set_yscale("log")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("median normalized latency (ms/token)")
    seeds = ", ".join(str(s) for s in result["seeds"])
    ax.set_title(f"workload {result['workload']}: median over seeds {seeds}, band = min..max (cf. paper Fig. 2)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig2_latency_vs_rate.png", dpi=120)
    plt.close(fig)
    made.append("fig2_latency_vs_rate.png")

    head = result.get("ablation_headline") or {}
    steps = [(name, head[label]) for name, label in ABLATION if label in head]
    if steps:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        xs = range(len(steps))
        vals = [h["max_rate_at_slo"] for _, h in steps]
        err = [[v - h["max_rate_min"] for v, (_, h) in zip(vals, steps)], [h["max_rate_max"] - v for v, (_, h) in zip(vals, steps)]]
        ax.bar(xs, vals, yerr=err, capsize=4, color="#4f7cac")
        ax.set_xticks(list(xs), [n for n, _ in steps], rotation=15, fontsize=8)
        ax.set_ylabel("max rate at SLO (req/s)")
        budget = result.get("ablation_token_budget")
        ax.set_title(f"ablation: adding InferCept's techniques one at a time (cf. paper Fig. 3); token budget {budget}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "fig3_ablation.png", dpi=120)
        plt.close(fig)
        made.append("fig3_ablation.png")
    return made
