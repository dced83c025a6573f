"""A simulator estimate of the chatbot knees on the machine of a finished bench (its profile, setting and fitted
costs), to choose the chatbot full run's rate grid. Usage: chat_est.py BENCH_JSON WORKLOAD RATES SEEDS POLICIES OUT"""
import json, sys
from infercept.benchmarks.sim.validate import read_bench, fit_cost, sim_bench
from infercept.benchmarks.sim.sweep import sweep
from infercept.benchmarks.workload import ShareGPT

bench, workload = sys.argv[1], sys.argv[2]
rates, seeds, pols, out = [float(x) for x in sys.argv[3].split(",")], [int(x) for x in sys.argv[4].split(",")], sys.argv[5].split(","), sys.argv[6]
bj = read_bench(bench)
fitted = fit_cost(bj)
sb = sim_bench(bj, host_per_request_s=fitted.host_per_request_s, **fitted.kw)
sharegpt = sb.setting.model if workload in ("mixed", "chatbot") and ShareGPT.available() else None
res = sweep(sb, pols, rates, float(bj["duration_s"]), seeds, workload=workload, slo_factor=float(bj["slo"]["slo_factor"]), verbose=True,
            sharegpt_model=sharegpt)
print(json.dumps(res["slo"], indent=1))
for lab, h in res["headline"].items():
    print(lab, {k: v for k, v in h.items() if "rate" in k and not isinstance(v, dict)})
for lab in pols:
    for seed, runs in res["results"][lab].items():
        print(lab, seed, "  ".join(f"{float(r['rate']):g}: {r['normalized_latency_s']['median'] * 1e3:.1f} ms ttft99 {r['ttft_s']['p99']:.2f} res99 {r['resume_s']['p99']:.2f}"
                                   for r in runs.values() if r['normalized_latency_s']['median'] is not None))
json.dump({k: res[k] for k in ("slo", "headline", "requests_per_rate", "bound_violations")}, open(out, "w"), indent=1, default=str)
