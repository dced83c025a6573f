"""One line per simulated run: a policy (and variant: see common.run) at one seed and rate, at a bench's
setting: median and p90 normalized latency, resumed turns' p50/p99 wait for their next token, new
requests' p99 time to first token, recomputed tokens.
Usage: variants.py BENCH_JSON 'label|variant' SEED RATE [SEED RATE ...]"""
import sys

from common import run, setup

S = setup(sys.argv[1])
label, variant = sys.argv[2].split("|")
args = sys.argv[3:]
for seed, rate in zip(args[::2], args[1::2]):
    eng, _, out = run(S, label, variant, int(seed), float(rate))
    nl = out["normalized_latency_s"]
    print(f"{label}/{variant} s{seed} r{float(rate)}: nl median {nl['median'] * 1e3:.1f} ms p90 {nl['p90'] * 1e3:.1f}; "
          f"resume p50 {out['resume_s']['median']:.3f} p99 {out['resume_s']['p99']:.3f}; ttft p99 {out['ttft_s']['p99']:.3f}; "
          f"blocks {eng.sched.pool.num_blocks}; recomputed {out.get('recomputed_tokens')}", flush=True)
