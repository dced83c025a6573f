"""Knees of policy variants and queue orders in the simulator, at a bench's setting and SLO.
Usage: knee.py BENCH_JSON SEEDS RATES 'label|variant|order' ...
order: fcfs, resumed (resumed turns first), srpt (ORACLE: least remaining decode tokens of the whole job
first), srpt_aged:W (srpt minus W tokens per second waited), small_mem (smallest context first),
new_aged:T (resumed first, but a new request that waited past T s goes ahead).
A rate passes when the median normalized latency and new requests' p99 time to first token meet the
bench's SLO; a seed's knee is the highest passing rate."""
import json
import sys

from common import run, setup

bench = sys.argv[1]
bj = json.load(open(bench))
SLO, TTFT = bj["slo"]["slo_normalized_latency_s"], bj["slo"]["ttft_p99_bound_s"]
S = setup(bench)
seeds = [int(x) for x in sys.argv[2].split(",")]
rates = [float(x) for x in sys.argv[3].split(",")]


def remaining(r):
    return r.turn_left + sum(t.decode_tokens for t in r.turns[r.turn + 1:])


def keyfn(order, eng):
    if order == "resumed":
        return lambda r: (0 if r.turn > 0 else 1, r.arrival_time)
    if order == "srpt":
        return lambda r: (remaining(r), r.arrival_time)
    if order.startswith("srpt_aged"):
        w = float(order.split(":")[1])
        return lambda r: (remaining(r) - w * (eng.now - r.arrival_time), r.arrival_time)
    if order.startswith("new_aged"):
        t = float(order.split(":")[1])
        return lambda r: (0 if (r.turn == 0 and eng.now - r.arrival_time > t) else (1 if r.turn > 0 else 2), r.arrival_time)
    if order == "small_mem":
        return lambda r: (r.num_tokens, r.arrival_time)
    raise ValueError(order)


def ordered(order):
    if order == "fcfs":
        return None

    def hook(eng):
        from infercept.benchmarks.sim.request import Status
        sched, key = eng.sched, keyfn(order, eng)

        def ahead(_order):  # every step, before the core plans: preempted requests first, as vLLM puts them
            pre = [r for r in sched.waiting if r.status is Status.PREEMPTED]
            sched.waiting[:] = pre + sorted((r for r in sched.waiting if r.status is not Status.PREEMPTED), key=key)
            return 0

        sched.waiting_ahead = ahead
        import dataclasses
        eng.core.spec = dataclasses.replace(eng.core.spec, new_first=True)  # (only so that the engine calls it)
    return hook


rows = {}
for spec in sys.argv[4:]:
    label, variant, order = spec.split("|")
    knees, line = [], []
    for seed in seeds:
        best = 0.0
        for rate in rates:
            _, _, out = run(S, label, variant, seed, rate, ordered(order))
            nl, tt, rs = out["normalized_latency_s"]["median"], out["ttft_s"]["p99"], out["resume_s"]["p99"]
            ok = nl is not None and nl <= SLO and tt is not None and tt <= TTFT
            rows[f"{spec}/{seed}/{rate:g}"] = {"nl_median_s": nl, "ttft_p99_s": tt, "resume_p99_s": rs, "pass": ok}
            line.append(f"s{seed}/{rate:g}:{nl * 1e3:.1f}/{tt:.2f}/{rs:.2f}{'+' if ok else '-'}")
            best = rate if ok else best
        knees.append(best)
    print(f"{spec:60s} knees {knees}  " + " ".join(line), flush=True)
