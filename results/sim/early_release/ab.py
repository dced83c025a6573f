"""A/B in the simulator: the intercept core giving a swap-out's device blocks back in the step that copies its
last ones (`release_when_copied`, d73d607) against one step later (before), side by side on one bench's workloads
with the cost model fitted in results/sim/validation.json; `infercept` max rate at the bench's SLO and, per seed
and rate, latency, waste, recomputed tokens and swap stall.

    PYTHONPATH=. .venv/bin/python results/sim/early_release/ab.py results/bench/before_early_release/bench.json infercept
"""
import json, sys
from pathlib import Path
import benchmarks.sim.validate as val
from benchmarks.sim import setup
from benchmarks.sim.cost import context_shares, read_decode_grid
import engine_adapter.intercept.build as build

bench, pols = sys.argv[1], sys.argv[2].split(",")
bj = dict(val.read_bench(bench))
cm = json.loads(Path("results/sim/validation.json").read_text())["cost_model"]
prof = setup.profile_from_bench(bj["setting"], fallback=val.DEFAULT_PROFILE)
share = context_shares(read_decode_grid(cm["decode_grid"]), prof, None)
for release in (False, True):
    build.build_core.__kwdefaults__["release_when_copied"] = release
    out = val._validate(bj, pols, host_per_request_s=cm["host_per_request_s"], verbose=False, context_share=share,
                        frontend_s=tuple(cm["frontend_in_out_s"]), step_overhead_s=cm["step_overhead_s"],
                        pair_scale=cm["pair_scale"])
    for p in pols:
        o = out["policies"][p] if "policies" in out else out[p]
        print("release_when_copied", release, p, "sim max rate", o["simulated"], o["simulated_min_max"],
              "by seed", o["simulated_by_seed"], "waste", o["waste_share_at_slo_rate"]["simulated"], flush=True)
    pr = out.get("per_rate", {})
    for p in pols:
        for k, v in (pr.get(p) or {}).items():
            sm = v["simulated"]
            print("  ", p, k, "sim median lat %.1f ms" % (1e3 * (sm["median_normalized_latency_s"] or 0)), "done", sm["completed"], "/", sm["requests"],
                  "waste %.2f%%" % (100 * (sm["waste_share_of_capacity_time"] or 0)), "recomputed", sm["recomputed_tokens"], "stall %.2fs" % (sm["swap_stall_s"] or 0))
