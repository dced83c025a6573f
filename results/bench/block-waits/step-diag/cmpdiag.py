"""Compare per-step diag logs (diagstep.py) of the engine and the simulator: python cmpdiag.py A.jsonl B.jsonl"""
import json
import statistics
import sys

LOAD = ("LOAD_ARMED", "LOADING", "LOADED")


def summary(path):
    L = [json.loads(x) for x in open(path)]
    t0 = L[0]["t"]
    n = len(L)
    dur = [max(0.0, L[i + 1]["t"] - L[i]["t"]) for i in range(n - 1)] + [0.0]
    span = sum(dur)

    def share(f):  # time-weighted mean of f over steps
        return sum(f(x) * d for x, d in zip(L, dur)) / span if span else 0.0

    total = [x["free"] + x["run_blocks"] + sum(x["bl"].values()) for x in L]
    waits = [x for x in L if x["wn"]]
    blk = [x for x in L if x["why"] in ("blocks", "behind_resumed")]
    med = lambda xs: statistics.median(xs) if xs else None
    return {
        "steps": n, "span_s": round(span, 2), "mean_step_ms": round(1e3 * span / max(1, n - 1), 2),
        "pool_blocks_seen (free+running+core-held)": (min(total), max(total)),
        "time-weighted mean blocks: free": round(share(lambda x: x["free"]), 1),
        "running": round(share(lambda x: x["run_blocks"]), 1),
        "swap-ins (armed/loading/loaded)": round(share(lambda x: sum(x["bl"].get(k, 0) for k in LOAD)), 1),
        "preserved": round(share(lambda x: x["bl"].get("PRESERVED", 0)), 1),
        "swapping out": round(share(lambda x: x["bl"].get("SWAPPING_OUT", 0)), 1),
        "running requests (mean)": round(share(lambda x: x["run"]), 2),
        "tokens per step (mean)": round(share(lambda x: x["tok"]), 1),
        "steps leaving new requests waiting": len(waits),
        "by reason": {k: sum(1 for x in waits if x["why"] == k) for k in ("slots", "budget", "blocks", "behind_resumed")},
        "in those waits (blocks/behind): median free": med([x["free"] for x in blk]),
        "median running blocks": med([x["run_blocks"] for x in blk]),
        "median swap-in blocks": med([sum(x["bl"].get(k, 0) for k in LOAD) for x in blk]),
        "steps with a swap-in holding blocks": sum(1 for x in blk if any(x["bl"].get(k, 0) for k in LOAD)),
        "median queued swap-ins": med([x["st"].get("LOAD_QUEUED", 0) for x in blk]),
    }


for p in sys.argv[1:]:
    print(p)
    for k, v in summary(p).items():
        print(f"  {k}: {v}")
