"""The simulator with diagstep's per-step line: python simdiag.py BENCH_JSON LABEL SEED RATE (IC_DIAG=file)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diagstep  # noqa: E402
from infercept.benchmarks.sim.validate import read_bench, fit_cost, sim_bench
from infercept.benchmarks.sim.sweep import sweep
from infercept.benchmarks.workload import ShareGPT

from infercept.benchmarks.sim.scheduler import SimScheduler
_meter = SimScheduler.meter_admission
ON = [False]


def meter_admission(self, meter, now, out):
    wn, why, admitted = _meter(self, meter, now, out)
    if ON[0]:
        diagstep.line(self.core, now, sum(len(r.blocks) for r in self.running), len(self.running), wn, why,
                      out.load.tokens, self.pool.num_free(), 0)
    return wn, why, admitted


SimScheduler.meter_admission = meter_admission

from infercept.benchmarks.sim import sweep as sweepmod
_rp = sweepmod.run_policy


def run_policy(bench, label, *a, **k):
    ON[0] = label == sys.argv[2]
    try:
        return _rp(bench, label, *a, **k)
    finally:
        ON[0] = False


sweepmod.run_policy = run_policy
bench, label, seed, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
bj = read_bench(bench)
fitted = fit_cost(bj)
sb = sim_bench(bj, host_per_request_s=fitted.host_per_request_s, **fitted.kw)
sharegpt = sb.setting.model if bj["workload"] in ("mixed", "chatbot") and ShareGPT.available() else None
res = sweep(sb, [label], [rate], float(bj["duration_s"]), [seed], workload=bj["workload"], slo_factor=float(bj["slo"]["slo_factor"]),
            slo_s=float(bj["slo"]["slo_normalized_latency_s"]), ttft_slo_s=bj["slo"].get("ttft_p99_bound_s"), sharegpt_model=sharegpt,
            verbose=False)
p = res["results"][label][seed][f"{rate:g}"]
print(p["ttft_s"], p["new_request_wait"])
