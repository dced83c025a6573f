"""Step time by scheduled tokens, engine against simulator, from two diagstep logs (gzip or plain):
python stepcost.py engine.jsonl.gz sim.jsonl.gz. A step's time is the interval to the next schedule;
intervals over 50 ms (idle gaps) are left out."""
import gzip
import json
import statistics
import sys


def load(p):
    with (gzip.open if p.endswith(".gz") else open)(p, "rt") as f:
        return [json.loads(x) for x in f]


BUCKETS = [(1, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 256), (256, 513)]
cols = []
for p in sys.argv[1:]:
    L = load(p)
    rows = [(b["t"] - a["t"], a) for a, b in zip(L, L[1:]) if a["tok"] > 0 and b["t"] - a["t"] < 0.05]
    col = {}
    for lo, hi in BUCKETS:
        d = [x for x, a in rows if lo <= a["tok"] < hi]
        col[(lo, hi)] = (len(d), statistics.median(d) * 1e3 if d else None)
    act = [x for x in L if x["tok"] > 0]
    col["running"] = statistics.mean(x["run"] for x in act)
    col["run_blocks"] = statistics.mean(x["run_blocks"] for x in act)
    col["free"] = statistics.mean(x["free"] for x in act)
    cols.append(col)
print("| tokens in the step | " + " | ".join(f"{p.split('/')[-1]}: steps, median ms" for p in sys.argv[1:]) + " |")
print("|---|" + "---|" * len(cols))
for b in BUCKETS:
    print(f"| {b[0]}-{b[1] - 1} | " + " | ".join(f"{c[b][0]}, {c[b][1]:.2f}" if c[b][1] else "-" for c in cols) + " |")
for k in ("running", "run_blocks", "free"):
    print(f"| mean {k} (steps with tokens) | " + " | ".join(f"{c[k]:.1f}" for c in cols) + " |")
