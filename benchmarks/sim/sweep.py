"""A simulated benchmark sweep: every policy over the same seeded requests at each rate, the SLO from
an unloaded calibration (requests one at a time, zero-time calls) times a factor, and the headline
over seeds. What `infercept bench` does, in simulated time."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.sim.report import headline
from benchmarks.sim.run import run_policy, unloaded_latency
from benchmarks.sim.setup import SimBench
from benchmarks.sim.workloads import bench_workloads


def sweep(bench: SimBench, labels: Sequence[str], rates: Sequence[float], duration_s: float, seeds: Sequence[int], *,
          workload: str = "mixed", slo_factor: float = 5.0, calibrate_label: str = "unlimited-kv",
          sharegpt_model: str | None = None, bound: str = "unlimited-kv", verbose: bool = True) -> dict[str, Any]:
    s = bench.setting
    per_seed: list[dict[str, Any]] = []
    slos: list[float] = []
    calib: list[dict[str, Any]] = []
    notes: set[str] = set()
    engines: dict[str, Any] = {}
    t_start = time.time()
    for seed in seeds:
        w, note = bench_workloads(workload, rates, duration_s, seed, context_scale=s.context_scale,
                                  max_context=s.max_context, sharegpt_model=sharegpt_model)
        notes.add(note)
        u = unloaded_latency(bench.engine(calibrate_label), bench, calibrate_label, w[rates[0]])
        calib.append(u | {"seed": seed, "engine": calibrate_label})
        slos.append(slo_factor * u["median_s"] if u["median_s"] else float("inf"))
        per: dict[str, Any] = {}
        for lab in labels:
            t0 = time.time()
            per[lab], engines[lab] = run_policy(bench, lab, w, s.drain_s)
            if verbose:
                print(f"  seed {seed} {lab:20s} {time.time() - t0:6.1f} s wall  "
                      + "  ".join(f"{r}: {x['normalized_latency_s']['median'] * 1000:.1f} ms" for r, x in per[lab].items()
                                  if x["normalized_latency_s"]["median"] is not None), file=sys.stderr, flush=True)
        per_seed.append(per)
    head = headline(per_seed, slos, bound=bound)
    return {
        "workload": workload, "rates": list(rates), "duration_s": duration_s, "seeds": list(seeds), "policies": list(labels),
        "replay": sorted(notes),
        "token_budget": {lab: bench.budget(lab) for lab in labels},
        "slo": {"slo_factor": slo_factor, "reference": f"unloaded median normalized latency ({calib[0]['requests']} requests "
                f"one at a time, zero-time calls) on a {calibrate_label} engine",
                "unloaded_normalized_latency_s": [c["median_s"] for c in calib], "slo_normalized_latency_s": slos},
        "engines": engines,
        "headline": head,
        "results": per_seed[0] if len(per_seed) == 1 else {str(sd): p for sd, p in zip(seeds, per_seed)},
        "sim_wall_s": time.time() - t_start,
    }
