"""Side by side: the engine's point (infercept, mixed, seed 2, 4 req/s) and the simulator's, on the counters both report."""
import json, sys, glob
from infercept.benchmarks.sim.validate import read_bench, fit_cost, sim_bench
from infercept.benchmarks.sim.sweep import sweep
from infercept.benchmarks.sim.setup import variant
bench = sys.argv[1]; label = sys.argv[2]; seed = int(sys.argv[3]); rate = float(sys.argv[4]); engine_points = sys.argv[5:]
bj = read_bench(bench)
fitted = fit_cost(bj)
sb = sim_bench(bj, host_per_request_s=fitted.host_per_request_s, **fitted.kw)
from infercept.benchmarks.workload import ShareGPT
sharegpt = sb.setting.model if bj["workload"] in ("mixed", "chatbot") and ShareGPT.available() else None
res = sweep(sb, [label], [rate], float(bj["duration_s"]), [seed], workload=bj["workload"], slo_factor=float(bj["slo"]["slo_factor"]),
            slo_s=float(bj["slo"]["slo_normalized_latency_s"]), ttft_slo_s=bj["slo"].get("ttft_p99_bound_s"), sharegpt_model=sharegpt, verbose=False)
sim = res["results"][label][seed][f"{rate:g}"]
keys = ["requests", "completed", "intercepts", "pressure_swaps", "swapped_out_tokens", "swapped_in_tokens", "recomputed_tokens",
        "demoted", "discarded", "iterations", "scheduled_tokens", "forward_s", "span_s", "waste_share_of_capacity_time"]
rows = [("sim", sim)] + [(p, json.load(open(p))) for p in engine_points]
def waits(r):
    m = (r.get("new_request_wait") or {}).get("mean_s")
    return "/".join(f"{m[k] * 1e3:.1f}" for k in ("slots", "budget", "blocks", "behind_resumed")) if m else "-"
def f(x):
    return f"{x:.3g}" if isinstance(x, float) else str(x)
print("| run | " + " | ".join(keys + ["TTFT p50/p99 (s)", "norm. latency median (ms)", "mean wait per new request: slots/budget/blocks/behind a resumed head (ms)"]) + " |")
for name, r in rows:
    t = r["ttft_s"]
    print(f"| {name.split('/')[-3] if '/' in name else name} | " + " | ".join(f(r.get(k)) for k in keys) +
          f" | {t['median']:.3f} / {t['p99']:.2f} | {r['normalized_latency_s']['median']*1e3:.1f} | {waits(r)} |")
