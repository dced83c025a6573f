"""The per-point numbers docs/results.md quotes for a full run at one rate: forward seconds as a share of
wall time, steps and ms per step, median normalized latency, and the rank correlation between each point's
machine probe (mean of before and after) and its median latency (at that rate, and over every sweep
point). Reads the points only (no engine, seconds of CPU); in infercept's venv (scipy):

    python results/bench/knee_stats.py results/bench/qa-full 2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scipy.stats import spearmanr

from infercept.benchmarks.metrics import point_probe_s as probe


def sweep_points(run: Path) -> list[dict]:
    """Every point of the seeds' sweeps (grid and bisection rounds; not the pilot or the references), with
    its policy's label from the file name (round__label__budget__seed__rate: the bound's engine runs
    `preserve`)."""
    out = []
    for p in sorted((run / "points").glob("round*__*.json")):
        d = json.loads(p.read_text())
        d["label"] = p.stem.split("__")[1]
        out.append(d)
    return out


def main(run: Path, rate: float) -> None:
    points = sweep_points(run)
    at = [d for d in points if float(d["rate"]) == rate]
    if not at:
        raise SystemExit(f"no sweep point at {rate:g} req/s in {run}")
    print(f"{run}: {len(at)} sweep points at {rate:g} req/s ({len(points)} in all)")
    print("policy            seed  forward/wall  steps  ms/step  median ms/token  probe ms/token")
    for d in sorted(at, key=lambda d: (d["label"], d["seed"])):
        label = d["label"]
        n = d.get("iterations") or 0
        p = probe(d)
        print(f"{label:<17} {d['seed']:>4}  {d['forward_s'] / d['wall_s']:>11.0%}  {n:>5}  {1e3 * d['forward_s'] / max(n, 1):>7.1f}"
              f"  {1e3 * d['normalized_latency_s']['median']:>15.1f}  {1e3 * p if p else float('nan'):>14.2f}")
    share = [d["forward_s"] / d["wall_s"] for d in at]
    steps = [d["iterations"] for d in at if d.get("iterations")]
    print(f"forward/wall {min(share):.0%}..{max(share):.0%}; steps {min(steps):,}..{max(steps):,}; "
          f"ms/step {1e3 * min(d['forward_s'] / d['iterations'] for d in at):.1f}..{1e3 * max(d['forward_s'] / d['iterations'] for d in at):.1f}; "
          f"median latency {1e3 * min(d['normalized_latency_s']['median'] for d in at):.1f}..{1e3 * max(d['normalized_latency_s']['median'] for d in at):.1f} ms/token")
    for name, ds in ((f"at {rate:g} req/s", at), ("over every sweep point", points)):
        pairs = [(probe(d), d["normalized_latency_s"]["median"]) for d in ds if probe(d) and d["normalized_latency_s"]["median"]]
        print(f"rank correlation, probe vs median latency, {name}: {spearmanr(*zip(*pairs)).statistic:.2f} ({len(pairs)} points)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python results/bench/knee_stats.py RUN_DIR RATE")
    main(Path(sys.argv[1]), float(sys.argv[2]))
