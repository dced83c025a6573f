"""Where each policy's time goes in the simulator at the CPU bench's setting: per run, latency, TTFT and
resume tails, preemptions, recompute, prefix hits, swaps, host-tier loads, new requests' waits by reason.
Usage: diag_sim.py BENCH_JSON RATES SEEDS POLICIES OUT"""
import json, sys
from infercept.benchmarks.sim.validate import read_bench, fit_cost, sim_bench
from infercept.benchmarks.sim.sweep import sweep
from infercept.benchmarks.workload import ShareGPT

bench, rates, seeds, pols, out = sys.argv[1], [float(x) for x in sys.argv[2].split(",")], [int(x) for x in sys.argv[3].split(",")], sys.argv[4].split(","), sys.argv[5]
bj = read_bench(bench)
fitted = fit_cost(bj)
sb = sim_bench(bj, host_per_request_s=fitted.host_per_request_s, **fitted.kw)
sharegpt = sb.setting.model if bj["workload"] in ("mixed", "chatbot") and ShareGPT.available() else None
res = sweep(sb, pols, rates, float(bj["duration_s"]), seeds, workload=bj["workload"], slo_factor=float(bj["slo"]["slo_factor"]),
            slo_s=float(bj["slo"]["slo_normalized_latency_s"]), ttft_slo_s=bj["slo"].get("ttft_p99_bound_s"), sharegpt_model=sharegpt, verbose=False)
keys = ("completed", "requests", "preemptions", "recomputed_tokens", "prefix_hit_tokens", "swapped_out_tokens", "swapped_in_tokens",
        "waiting_evictions", "demoted", "discarded", "steps", "host_tier", "new_request_wait", "waste_share_by_kind")
rows = {}
for lab in pols:
    for seed, runs in res["results"][lab].items():
        for rk, r in runs.items():
            row = {"nl_ms": r["normalized_latency_s"]["median"] * 1e3, "ttft_p50": r["ttft_s"]["median"], "ttft_p99": r["ttft_s"]["p99"],
                   "resume_p50": r["resume_s"]["median"], "resume_p99": r["resume_s"]["p99"], **{k: r.get(k) for k in keys}}
            rows[f"{lab}/{seed}/{float(r['rate']):g}"] = row
            nw = (r.get("new_request_wait") or {}).get("mean_s") or {}
            print(f"{lab:16s} s{seed} {float(r['rate']):4g}  {row['nl_ms']:6.1f} ms  ttft p99 {row['ttft_p99']:.2f}  resume p99 {row['resume_p99']:.2f}  "
                  f"preempt {row['preemptions']}  recomp {row['recomputed_tokens']}  hits {row['prefix_hit_tokens']}  swapout {row['swapped_out_tokens']}  "
                  f"host {row['host_tier']}  waits {{{', '.join(f'{k}: {v:.3f}' for k, v in nw.items())}}}", flush=True)
json.dump({"bench": bench, "headline": res["headline"], "rows": rows}, open(out, "w"), indent=1, default=str)
