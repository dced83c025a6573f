import json, sys, statistics as st
for tag in sys.argv[1:]:
    d = json.load(open(f"results/bench/bound_check/turns_{tag}.json"))
    T = d["turns"]
    first = [t["first"] for t in T]
    dec = [(t["total"] - t["first"]) / max(1, t["out"] - 1) for t in T if t["out"] > 1]
    res = [t["first"] for t in T if t["i"] > 0]
    new = [t["first"] for t in T if t["i"] == 0]
    tot = sum(t["total"] for t in T); out = sum(t["out"] for t in T)
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] * 1000 if xs else float('nan')
    print(f"{tag:12s} nl_med {d['summary']['median']*1000:.1f}ms turns {len(T)} out {out} sum(turn time)/out {tot/out*1000:.2f}ms"
          f" | new-ttft med {q(new,.5):.1f} p90 {q(new,.9):.1f} | resume-ttft med {q(res,.5):.1f} p90 {q(res,.9):.1f}"
          f" | per-token decode med {q(dec,.5):.2f} p90 {q(dec,.9):.2f} ms | sum ttft {sum(first):.1f}s sum decode {tot-sum(first):.1f}s")
