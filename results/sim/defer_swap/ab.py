"""A/B in the simulator: `infercept` deciding a call that only missed this iteration's swap budget by the paper's rule
(discard when recomputing wastes less than preserving for the whole call: `min_waste`) against waiting for a later
iteration's budget when holding it until then wastes less (`min_waste_deferred`), side by side on one bench's
workloads with the cost model fitted in results/sim/validation.json.

    PYTHONPATH=. .venv/bin/python results/sim/defer_swap/ab.py results/bench/bench.json infercept
"""
import dataclasses
import json
import sys
from pathlib import Path

import benchmarks.sim.validate as val
from benchmarks.sim import setup
from benchmarks.sim.cost import context_shares, read_decode_grid
from engine_adapter.policy import decide, table

bench, pols = sys.argv[1], sys.argv[2].split(",")
bj = dict(val.read_bench(bench))
cm = json.loads(Path("results/sim/validation.json").read_text())["cost_model"]
prof = setup.profile_from_bench(bj["setting"], fallback=val.DEFAULT_PROFILE)
share = context_shares(read_decode_grid(cm["decode_grid"]), prof, None)
spec = table.POLICIES["infercept"]
for fn in (decide.min_waste, decide.min_waste_deferred):
    table.POLICIES["infercept"] = dataclasses.replace(spec, decide=fn)
    out = val._validate(bj, pols, host_per_request_s=cm["host_per_request_s"], verbose=False, context_share=share,
                        frontend_s=tuple(cm["frontend_in_out_s"]), step_overhead_s=cm["step_overhead_s"],
                        pair_scale=cm["pair_scale"])
    for p in pols:
        o = out["policies"][p] if "policies" in out else out[p]
        print(fn.__name__, p, "sim max rate", o["simulated"], o["simulated_min_max"], "by seed", o["simulated_by_seed"],
              "waste", o["waste_share_at_slo_rate"]["simulated"], flush=True)
    for p in pols:
        for k, v in (out.get("per_rate", {}).get(p) or {}).items():
            sm = v["simulated"]
            print("  ", p, k, "sim median lat %.1f ms" % (1e3 * (sm["median_normalized_latency_s"] or 0)), "done",
                  sm["completed"], "/", sm["requests"], "waste %.2f%%" % (100 * (sm["waste_share_of_capacity_time"] or 0)),
                  "recomputed", sm["recomputed_tokens"], "stall %.2fs" % (sm["swap_stall_s"] or 0), flush=True)
table.POLICIES["infercept"] = spec
