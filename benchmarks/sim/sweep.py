"""A simulated benchmark sweep, as `infercept bench` runs one (`infercept.benchmarks.runner.bench`), in simulated
time: the SLO first (the bound's engine at the default token budget, the first seed's lowest-rate
requests one at a time with zero-time calls, times the SLO factor), then seeds outermost, each policy
on a fresh engine over every rate, and the headline over seeds by the benchmark's own rule. The
result has bench.json's shape (`results[policy][seed][rate]`, `headline`, `bound_violations`, ...)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from infercept.benchmarks.metrics import BOUND, bound_violations, first_token_bound
from infercept.benchmarks.runner import context_tokens
from infercept.benchmarks.sim.report import headline
from infercept.benchmarks.sim.run import run_policy, unloaded_latency
from infercept.benchmarks.sim.setup import SimBench
from infercept.benchmarks.sim.workloads import bench_workloads
from infercept.benchmarks.workload import WORKLOADS


def sweep(bench: SimBench, labels: Sequence[str], rates: Sequence[float], duration_s: float, seeds: Sequence[int], *,
          workload: str = "mixed", slo_factor: float = 5.0, slo_s: float | None = None, ttft_factor: float | None = 10.0,
          ttft_slo_s: float | None = None, resume_slo_s: float | None = None,
          sharegpt_model: str | None = None, verbose: bool = True,
          speeds: Mapping[str, Mapping[int, Mapping[float, float]]] | None = None) -> dict[str, Any]:
    """`slo_s` (with `ttft_slo_s` and `resume_slo_s`, the bounds on the p99 of new requests' time to first
    token and of resumed turns' wait for their next token): judge the headline by these instead of the
    simulated calibration's (which is reported all the same; it bounds both first tokens alike). `speeds`:
    the machine's speed per policy label, seed and rate (`SimEngine.speed`; 1.0 where not given)."""
    s = bench.setting
    results: dict[str, dict[int, dict[str, Any]]] = {lab: {} for lab in labels}
    notes: set[str] = set()
    engines: dict[str, Any] = {}
    per_rate: dict[str, int] = {}
    mix: dict[str, dict[str, int]] = {}
    calib: dict[str, Any] | None = None
    t_start = time.time()
    for seed in seeds:
        w, note = bench_workloads(workload, rates, duration_s, seed, context_scale=s.context_scale,
                                  max_context=s.max_context, sharegpt_model=sharegpt_model)
        notes.add(note)
        for rate, reqs in w.items():
            per_rate[f"{seed}/{rate:g}"] = len(reqs)
            mix[f"{seed}/{rate:g}"] = {t: sum(1 for q in reqs if q.aug_type == t) for t in WORKLOADS[workload]}
        # The bound's KV holds every request of the busiest workload at its largest context at once
        # (the runner's rule; set here when the setting does not say, grown if a later seed needs more).
        need = max((sum(context_tokens(r) for r in reqs) for reqs in w.values()), default=0)
        s.unlimited_kv_tokens = max(s.unlimited_kv_tokens, need)
        s.unlimited_kv_slots = max([s.unlimited_kv_slots, *(len(reqs) for reqs in w.values())])
        if calib is None:
            eng = bench.engine(BOUND, token_budget=bench.budget(None))
            calib = unloaded_latency(eng, bench, BOUND, w[min(rates)])
        for lab in labels:
            t0 = time.time()
            results[lab][seed], engines[lab] = run_policy(bench, lab, w, s.drain_s, speeds=((speeds or {}).get(lab) or {}).get(seed))
            if verbose:
                print(f"  seed {seed} {lab:18s} {time.time() - t0:6.1f} s wall  "
                      + "  ".join(f"{r}: {x['normalized_latency_s']['median'] * 1000:.1f} ms" for r, x in results[lab][seed].items()
                                  if x["normalized_latency_s"]["median"] is not None), file=sys.stderr, flush=True)
        del w
    assert calib is not None
    own_slo = slo_factor * calib["median_s"] if calib["median_s"] else float("inf")
    judged = own_slo if slo_s is None else slo_s
    # The benchmark's other rules: the p99 of new requests' time to first token, and of resumed turns' wait
    # for their next token, within ttft_factor x the unloaded TTFT p90.
    ttft_slo = first_token_bound(ttft_factor, calib)
    head = headline(results, judged, *((ttft_slo, ttft_slo) if slo_s is None else (ttft_slo_s, resume_slo_s)))
    return {
        "workload": workload, "rates": list(rates), "duration_s": duration_s, "seeds": list(seeds), "policies": list(labels),
        "replay": sorted(notes),
        "token_budget": {lab: bench.budget(lab) for lab in labels}, "token_budget_default": bench.budget(None),
        "setting": dataclasses.asdict(s),
        "requests_per_rate": per_rate, "request_mix": mix,
        "engines": engines,
        "slo": {"slo_factor": slo_factor,
                "reference": f"{BOUND} engine, {calib['requests']} requests one at a time, zero-time calls (simulated)",
                "unloaded_normalized_latency_s": calib["median_s"], "slo_normalized_latency_s": own_slo,
                "unloaded_ttft_p90_s": calib.get("ttft_p90_s"), "ttft_p99_bound_s": ttft_slo, "resume_p99_bound_s": ttft_slo,
                "judged_at_s": judged, "judged_at": "simulated SLO" if slo_s is None else "given SLO"},
        "headline": head, "bound_violations": bound_violations(head),
        "results": results,
        "sim_wall_s": time.time() - t_start,
    }

