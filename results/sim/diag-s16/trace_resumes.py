"""Where the slowest resumed turns' time goes: per resumed turn, the paused request's state when its call
returned and when each later state began (seconds after the return), slowest first.
Usage: trace_resumes.py BENCH_JSON 'label|variant' SEED RATE"""
import collections
import sys

from common import run, setup

S = setup(sys.argv[1])
label, variant = sys.argv[2].split("|")
log = collections.defaultdict(list)


def hook(eng):
    eng.core.observers.append(lambda e, t: log[e.request_id].append((eng.now, e.state.name, e.context_tokens)))


_, reqs, out = run(S, label, variant, int(sys.argv[3]), float(sys.argv[4]), hook)
rows = []
for r in reqs:
    ev = log.get(r.rid, [])
    for k, n_in, n_out, sent, first, end in r.turn_log:
        if k == 0:
            continue
        es = [x for x in ev if sent - 30 < x[0] <= first + 1e-9]
        before = [x for x in es if x[0] < sent - 1e-9]
        marks = {}
        for t, st, _ in (x for x in es if x[0] >= sent - 1e-9):
            marks.setdefault(st, round(t - sent, 3))
        rows.append((first - sent, f"{r.aug_type}:{r.rid}", before[-1][1] if before else "?", n_in,
                     before[-1][2] if before else 0, sent, marks))
rows.sort(key=lambda x: -x[0])
n = len(rows)
print(f"{label}/{variant} seed {sys.argv[3]} rate {sys.argv[4]}: {n} resumed turns; p50 {rows[n // 2][0]:.3f} "
      f"p99 {rows[n // 100][0]:.3f}; median nl {out['normalized_latency_s']['median'] * 1e3:.1f} ms")
print("state at the return:", dict(collections.Counter(x[2] for x in rows)))
print("slowest 3%:", dict(collections.Counter(x[2] for x in rows[:max(1, n * 3 // 100)])))
for x in rows[:15]:
    print(f"  {x[0]:6.3f} s  {x[1]:16s} was {x[2]:14s} in {x[3]:5d} ctx {x[4]:5d} at {x[5]:7.2f}  {x[6]}")
