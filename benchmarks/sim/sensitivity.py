"""How the ranking moves with the two knobs that decide it: the device's KV capacity and the device-host
link. The benchmark's setting (the tiny model's measured CPU profile, `Setting`'s defaults, generic priors)
is simulated at KV x 0.5 / 1 / 2 / 4 and a link of 0.1 / 0.25 / 1 GB/s, every policy the simulator models
in each cell, with the benchmark's own rule for the max rate at the SLO (its first-token rule included).
Where `infercept`'s lead over the best peer grows, and where it vanishes, is read off one table.

    infercept simulate --sensitivity [--policies ...] [--seeds 1,2,3] [--rates ...] [--duration 30]
        [--cost-from BENCH_JSON]   # that run's profile, setting and cost constants (fitted as --validate fits them)
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infercept.benchmarks.metrics import BOUND
from infercept.benchmarks.replay import Setting
from infercept.benchmarks.sim.setup import SimBench, load_profile
from infercept.benchmarks.sim.sweep import sweep
from engine_adapter.paths import configs_dir

KV_FACTORS = (0.5, 1.0, 2.0, 4.0)
LINKS_GBPS = (0.1, 0.25, 1.0)
POLICIES = ("discard", "vllm-apc", "vllm-offload", "continuum", "swap", "infercept-paper", "infercept", BOUND)
RATES = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0)


def sensitivity(policies: Sequence[str] = POLICIES, *, kv_factors: Sequence[float] = KV_FACTORS,
                links_gbps: Sequence[float] = LINKS_GBPS, rates: Sequence[float] = RATES, duration_s: float = 30.0,
                seeds: Sequence[int] = (1, 2, 3), workload: str | None = None, subject: str = "infercept",
                cost_from: str | Path | None = None, **cost: Any) -> dict[str, Any]:
    """`cost_from`: a bench.json whose profile, engine setting, token budgets, workload (unless given) and
    cost constants (`validate.fit_cost`, with `cost`'s options) every cell starts from; else the shipped
    profile and `Setting`'s defaults, with none, on `workload` (default mixed)."""
    labels = list(policies) + ([BOUND] if BOUND not in policies else [])
    profile_name = "configs/profiles/tiny-cpu-bench.json"
    start = SimBench(Setting(), load_profile(configs_dir() / "profiles" / "tiny-cpu-bench.json"))
    cost_model: dict[str, Any] | None = None
    if cost_from is not None:
        from infercept.benchmarks.sim.validate import fit_cost, read_bench, sim_bench

        bj = read_bench(cost_from)
        workload = workload or bj["workload"]
        fitted = fit_cost(bj, **cost)
        # The bench's setting, profile, budgets and every fitted constant; the bound's KV is sized per
        # cell by `sweep`, as the runner sizes it.
        start = sim_bench(bj, host_per_request_s=fitted.host_per_request_s, **fitted.kw)
        start.setting = dataclasses.replace(start.setting, unlimited_kv_tokens=0)
        profile_name = f"{cost_from} (setting.profile_data)"
        cost_model = {"host_per_request_s": fitted.host_per_request_s, "step_overhead_s": fitted.kw["step_overhead_s"],
                      **fitted.fits(), "bench": str(cost_from)}
    workload = workload or "mixed"
    base = start.setting
    cells = []
    for kvf in kv_factors:
        for link in links_gbps:
            t0 = time.time()
            s = dataclasses.replace(base, kv_tokens=int(base.kv_tokens * kvf), swap_link_gbps=link)
            res = sweep(dataclasses.replace(start, setting=s), labels, rates, duration_s, seeds, workload=workload, verbose=False)
            head = res["headline"]
            peers = {lab: h["max_rate_at_slo"] for lab, h in head.items() if lab not in (subject, BOUND)}
            best = max(peers, key=lambda lab: peers[lab]) if peers else None
            mine = head.get(subject, {}).get("max_rate_at_slo")
            cells.append({
                "kv_factor": kvf, "kv_tokens": s.kv_tokens, "link_gbps": link,
                "max_rate_at_slo": {lab: h["max_rate_at_slo"] for lab, h in head.items()},
                "censored": {lab: h["censored"] for lab, h in head.items()},
                "best_peer": best, "ratio_vs_best_peer": (mine / peers[best]) if best and peers[best] and mine is not None else None,
                "ratio_vs_bound": head.get(subject, {}).get("ratio_vs_bound"),
                "bound_violations": res["bound_violations"],
                "slo_normalized_latency_s": res["slo"]["slo_normalized_latency_s"], "wall_s": time.time() - t0,
            })
            c = cells[-1]
            print(f"  KV x{kvf:<4g} link {link:<5g} GB/s: {subject} {mine} req/s, best peer {best} "
                  f"{peers.get(best) if best else None} -> {c['ratio_vs_best_peer']}  ({c['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    return {"subject": subject, "policies": labels, "workload": workload, "rates": list(rates), "duration_s": duration_s,
            "seeds": list(seeds), "kv_factors": list(kv_factors), "links_gbps": list(links_gbps),
            "setting": dataclasses.asdict(base), "profile": profile_name, "cost_model": cost_model, "cells": cells,
            "rule": "max rate at the SLO by the benchmark's headline (knee over the rate grid, median over seeds); "
                    "ratio_vs_best_peer: the subject's over the best other policy's, the bound excluded"}


def table(res: dict[str, Any]) -> str:
    links = res["links_gbps"]
    lines = [f"{res['subject']} / best peer (max rate at the SLO), by device KV (rows) and link GB/s (columns)",
             "KV      " + "".join(f"{f'{x:g} GB/s':>26s}" for x in links)]
    for kvf in res["kv_factors"]:
        row = [c for c in res["cells"] if c["kv_factor"] == kvf]
        cells = []
        for c in row:
            r = c["ratio_vs_best_peer"]
            cells.append(f"{'-' if r is None else f'{r:.2f}'} ({c['best_peer']})")
        lines.append(f"x{kvf:<6g} " + "".join(f"{x:>26s}" for x in cells))
    return "\n".join(lines)
