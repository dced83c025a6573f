"""The documentation's tables from the committed results (`docs/simulator.md` quotes this output):

    python -m infercept.benchmarks.sim.tables [--paper results/sim/paper_scale.json] [--validation results/sim/validation.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infercept.benchmarks.replay import REPO


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def waste_at(res: Mapping[str, Any], label: str, rate: str) -> float | None:
    """A policy's waste share at one rate, median over seeds."""
    xs = sorted(r[rate]["waste_share_of_capacity_time"] for r in res["results"][label].values()
                if rate in r and r[rate].get("waste_share_of_capacity_time") is not None)
    return xs[len(xs) // 2] if xs else None


def within(res: Mapping[str, Any], label: str, slo_s: float) -> str:
    """The rates whose median normalized latency met the SLO (first seed): shows a curve that is not
    monotone (the max rate at the SLO stops at the first rate that fails)."""
    runs = next(iter(res["results"][label].values()))
    ok = [float(k) for k, r in runs.items() if (r["normalized_latency_s"]["median"] or float("inf")) <= slo_s]
    return ", ".join(f"{x:g}" for x in sorted(ok)) or "none"


def paper_table(res: Mapping[str, Any], common_rates: tuple[str, ...] = ("1", "3")) -> str:
    claims = res.get("paper_claims") or {}
    waste_claims = claims.get("waste") or {}
    rates = [r for r in common_rates if all(r in by_rate for runs in res["results"].values() for by_rate in runs.values())]
    slo = res["slo"].get("judged_at_s") or res["slo"]["slo_normalized_latency_s"]
    rows = ["| policy | max rate at SLO (req/s) | rates within the SLO | vs vllm-apc | vs discard | vs bound | waste share at that rate | "
            + "".join(f"waste share at {r} req/s | " for r in rates) + "paper |",
            "|---|---|---|---|---|---|---|" + "---|" * len(rates) + "---|"]
    for lab, h in res["headline"].items():
        rate = f"{h['max_rate_at_slo']:.2f}{'+' if h['censored'] else ''}"
        if h["max_rate_min"] != h["max_rate_max"]:
            rate += f" ({h['max_rate_min']:.2f}..{h['max_rate_max']:.2f})"
        paper = []
        if lab == "infercept" and claims.get("ratio_vs_vllm"):
            paper.append(f"{claims['ratio_vs_vllm']} vLLM's rate")
        if lab in waste_claims:
            paper.append(f"waste {waste_claims[lab]:.2%}")
        rows.append(f"| {lab} | {rate} | {within(res, lab, slo)} | {_f(h.get('ratio_vs_vllm-apc'))} | {_f(h.get('ratio_vs_discard'))} | "
                    f"{_f(h.get('ratio_vs_bound'))} | {_f(h.get('waste_share_at_slo_rate'), '{:.2%}')} | "
                    + "".join(f"{_f(waste_at(res, lab, r), '{:.2%}')} | " for r in rates) + f"{'; '.join(paper)} |")
    return "\n".join(rows)


def validation_table(v: Mapping[str, Any]) -> str:
    rows = ["| policy | token budget | measured (req/s) | simulated (req/s) | rel. error | simulated at the simulated SLO |",
            "|---|---|---|---|---|---|"]
    for lab, p in v["policies"].items():
        rows.append(f"| {lab} | {p.get('token_budget', '-')} | {_f(p['measured'])} | {_f(p['simulated'])} | "
                    f"{_f(p['rel_error'], '{:+.1%}')} | {_f(p.get('simulated_at_simulated_slo'))} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paper", default=str(REPO / "results" / "sim" / "paper_scale.json"))
    ap.add_argument("--validation", default=str(REPO / "results" / "sim" / "validation.json"))
    args = ap.parse_args(argv)
    for title, path, fn in (("paper scale", args.paper, paper_table), ("validation", args.validation, validation_table)):
        p = Path(path)
        if p.is_file():
            print(f"### {title} ({p.name})\n\n{fn(json.loads(p.read_text()))}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
