"""Where an engine step's time goes, per run of a timed diagstep log (engine-timed.patch): python steptimes.py
engine-timed.jsonl.gz. The log's runs (the bench's SLO reference before, its policies in their order, the
reference after) are split at gaps over 5 s. Per run: the interval between schedules split into our
`before_schedule`, vLLM's `schedule()`, the forward (schedule's end to the output's arrival: the worker's
input preparation, model, sampling) and `update_from_output`; then the forward fitted as a + b requests +
c context + d prefilled requests + e prefilled tokens, and decode-only steps against steps with a prefill."""
import gzip
import json
import statistics
import sys

import numpy as np

path = sys.argv[1]
L = [json.loads(x) for x in (gzip.open(path, "rt") if path.endswith(".gz") else open(path))]
runs = [[L[0]]]
for a, b in zip(L, L[1:]):
    if b["t"] - a["t"] > 5:
        runs.append([])
    runs[-1].append(b)
for k, R in enumerate(runs):
    st = []  # fw and uo on a line belong to the step scheduled on the line before
    for a, b in zip(R, R[1:]):
        if a["tok"] > 0 and b.get("fw") is not None and b["t"] - a["t"] < 0.05:
            st.append(dict(tok=a["tok"], run=a["run"], ctx=a["run_blocks"] * 32, chunks=a.get("chunks", 0), bs=a["bs"], vs=a["vs"],
                           fw=b["fw"], uo=b["uo"], iv=b["t"] - a["t"]))
    if not st:
        continue
    m = lambda key: statistics.mean(s[key] for s in st) * 1e3  # noqa: E731
    print(f"run {k}: {len(st)} steps, interval {m('iv'):.2f} ms = before_schedule {m('bs'):.3f} + vLLM schedule {m('vs'):.3f} "
          f"+ forward {m('fw'):.2f} + update_from_output {m('uo'):.3f} (+ the log line); mean tokens "
          f"{statistics.mean(s['tok'] for s in st):.1f}, running {statistics.mean(s['run'] for s in st):.1f}, "
          f"context {statistics.mean(s['ctx'] for s in st):.0f}, prefilled requests {statistics.mean(s['chunks'] for s in st):.2f}")
    y = np.array([s["fw"] for s in st])
    X = np.array([[1, s["run"], s["ctx"], s["chunks"], s["tok"] - s["run"]] for s in st], float)
    c, *_ = np.linalg.lstsq(X, y, rcond=None)
    print(f"   forward = {c[0] * 1e3:.2f} ms + {c[1] * 1e3:.3f} ms/request + {c[2] * 1e6:.3f} ms/1k context + "
          f"{c[3] * 1e3:.2f} ms/prefilled request + {c[4] * 1e3:.4f} ms/prefilled token (residual sd {(y - X @ c).std() * 1e3:.2f} ms)")
    for lo, hi in [(1, 2), (2, 5), (5, 9), (9, 17), (17, 65)]:
        d = [s["fw"] for s in st if s["chunks"] == 0 and lo <= s["run"] < hi]
        d2 = [s["fw"] for s in st if s["chunks"] > 0 and lo <= s["run"] < hi]
        if d:
            print(f"   {lo}-{hi - 1} running: decode only {len(d)} steps, median {statistics.median(d) * 1e3:.2f} ms; with a prefill "
                  f"{len(d2)} steps, median {statistics.median(d2) * 1e3 if d2 else float('nan'):.2f} ms")
