"""`infercept simulate --sessions N --profile P --workload W`: how many concurrent agent sessions one
device sustains at the SLO, per policy, and so how many replicas N sessions need (`replicas_needed`).

Closed loop: each of N sessions runs agent requests back to back (a request's calls included; the next
request starts when the previous one's last token is out), drawing them from the benchmark's workload
generator (a pool of seeded requests, shared round robin; their arrival times are dropped). Sessions
start spread over one mean request lifetime so that they do not arrive in lockstep. After that ramp,
requests starting in the measurement window are measured as the benchmark measures them (normalized
latency: time outside calls per output token; unfinished ones at the cutoff count with their latency
so far). N passes when the median is within the SLO (5x the unloaded latency on the bound).

The search doubles N from a start until it fails (or reaches N), then narrows the bracket to
`precision` by secant steps on the median latency (bisection when a secant lands near an end). A probe
costs about (ramp + window) / step time simulated steps whatever N is (an overloaded engine steps at
full batch), so a policy takes roughly ten probes.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infercept.benchmarks.metrics import BOUND
from infercept.benchmarks.metrics import pct as _pct
from infercept.benchmarks.runner import context_tokens
from infercept.benchmarks.sim.engine import SimEngine
from infercept.benchmarks.sim.request import SimRequest, from_workload
from infercept.benchmarks.sim.run import unloaded_latency
from infercept.benchmarks.sim.setup import SimBench, variant
from infercept.benchmarks.workload import Request, generate


@dataclass
class Probe:
    sessions: int
    median_s: float | None
    p90_s: float | None
    measured: int
    unfinished: int
    passed: bool
    steps: int
    wall_s: float
    throughput_rps: float


@dataclass
class CapacityResult:
    policy: str
    sessions_at_slo: int
    censored: bool  # passed at the largest N tried
    probes: list[Probe] = field(default_factory=list)
    wall_s: float = 0.0


def request_pool(workload: str, seed: int, size: int) -> list[Request]:
    """`size` seeded requests from the benchmark's generator (Poisson arrivals at 1/s; only their
    shapes are used)."""
    reqs = generate(workload, 1.0, float(size) * 1.3, seed)
    while len(reqs) < size:  # a short draw: extend with the next seed's
        seed += 1000
        reqs += generate(workload, 1.0, float(size), seed)
    return reqs[:size]


def mean_lifetime_s(pool: Sequence[Request], time_scale: float, step_s: float) -> float:
    """A request's expected lifetime at light load: its calls plus one step per token it generates."""
    return statistics.fmean(sum(c.duration_s for c in r.calls) * time_scale + r.output_tokens * step_s for r in pool)


class ClosedLoop:
    def __init__(self, bench: SimBench, label: str, pool: Sequence[Request], sessions: int, seed: int,
                 ramp_s: float, window_s: float, drain_s: float) -> None:
        self.bench, self.label, self.pool = bench, label, pool
        self.v = variant(label)
        # The bound's KV holds every session's largest context at once (the runner's rule, for a
        # closed loop: one request per session at a time).
        self.eng: SimEngine = bench.engine(label, unlimited_kv_tokens=sessions * max(context_tokens(r) for r in pool))
        self.eng.on_finish = self._next
        self.ramp_s, self.window_s, self.drain_s = ramp_s, window_s, drain_s
        self.measured: list[SimRequest] = []
        self._session_of: dict[str, int] = {}
        self._count = 0
        rng = random.Random(f"sessions:{seed}:{sessions}")
        for s in range(sessions):
            self._submit(s, rng.uniform(0.0, ramp_s))

    def _submit(self, session: int, at: float) -> None:
        if at >= self.ramp_s + self.window_s + self.drain_s:
            return
        req = self.pool[self._count % len(self.pool)]
        self._count += 1
        r = from_workload(dataclasses.replace(req, arrival_s=at), self.bench.setting.time_scale,
                          zero_calls=self.v.zero_calls, rid_prefix=f"s{session}-{self._count}-")
        self._session_of[r.rid] = session
        if self.ramp_s <= at < self.ramp_s + self.window_s:
            self.measured.append(r)
        self.eng.submit(r)

    def _next(self, r: SimRequest) -> None:
        self._submit(self._session_of.pop(r.rid), self.eng.now)

    def run(self) -> Probe:
        t0 = time.time()
        # The sessions keep the load on while the measured requests finish (up to the drain).
        end = self.ramp_s + self.window_s
        limit = end + self.drain_s
        self.eng.run(until=end)
        while self.eng.now < limit and any(r.end_s is None for r in self.measured):
            end = min(limit, self.eng.now + self.ramp_s / 4)
            self.eng.run(until=end)
        end = self.eng.now
        lat = []
        for r in self.measured:
            done = r.end_s if r.end_s is not None else end
            lat.append((done - r.arrival_s - r.call_s) / max(1, r.output_tokens))
        finished = [r for r in self.measured if r.end_s is not None]
        return Probe(sessions=0, median_s=_pct(lat, 0.5), p90_s=_pct(lat, 0.9), measured=len(self.measured),
                     unfinished=len(self.measured) - len(finished), passed=False, steps=self.eng.steps,
                     wall_s=time.time() - t0, throughput_rps=len(finished) / self.window_s)


def sessions_at_slo(bench: SimBench, label: str, pool: Sequence[Request], slo_s: float, *, max_sessions: int,
                    start: int = 32, precision: float = 0.05, seed: int = 0, ramp_s: float, window_s: float,
                    drain_s: float, verbose: bool = False) -> CapacityResult:
    t0 = time.time()
    out = CapacityResult(policy=label, sessions_at_slo=0, censored=False)

    def probe(n: int) -> bool:
        p = ClosedLoop(bench, label, pool, n, seed, ramp_s, window_s, drain_s).run()
        p.sessions, p.passed = n, p.median_s is not None and p.median_s <= slo_s and p.measured > 0
        out.probes.append(p)
        if verbose:
            med = "-" if p.median_s is None else f"{p.median_s * 1000:.1f} ms"
            print(f"    {label:18s} N={n:6d}: median {med}, {p.measured} measured, {p.unfinished} unfinished, "
                  f"{'pass' if p.passed else 'FAIL'} ({p.wall_s:.1f} s)", flush=True)
        return p.passed

    lo, hi = 0, None
    n = min(start, max_sessions)
    while True:
        if probe(n):
            lo = n
            if n >= max_sessions:
                out.censored = True
                break
            n = min(max_sessions, n * 2)
        else:
            hi = n
            break
    # Between the last pass and the first failure: a secant step on the log of the median latency (it
    # grows about exponentially towards overload), bisection when the secant lands near an end.
    lat = {p.sessions: p.median_s for p in out.probes}
    while hi is not None and hi - lo > max(1, int(precision * max(lo, 1))):
        mid = (lo + hi) // 2
        l_lo, l_hi = lat.get(lo), lat.get(hi)
        if lo > 0 and l_lo and l_hi and l_hi > l_lo:
            frac = (math.log(slo_s) - math.log(l_lo)) / (math.log(l_hi) - math.log(l_lo))
            guess = int(lo + frac * (hi - lo))
            margin = max(1, (hi - lo) // 8)
            if lo + margin <= guess <= hi - margin:
                mid = guess
        if probe(mid):
            lo = mid
        else:
            hi = mid
        lat[mid] = out.probes[-1].median_s
    out.sessions_at_slo, out.wall_s = lo, time.time() - t0
    return out


def replicas_needed(sessions: int, r: CapacityResult) -> int | None:
    """Replicas `sessions` active sessions need at the SLO when each session stays on one replica (its KV
    lives there: the balancer's affinity), every replica a device like the simulated one with its own KV
    and intercept core: they share no state, so each serves what one device sustains. None: one device
    sustains no session at the SLO."""
    if r.censored or r.sessions_at_slo >= sessions:
        return 1
    if r.sessions_at_slo <= 0:
        return None
    return math.ceil(sessions / r.sessions_at_slo)


def capacity(bench: SimBench, labels: Sequence[str], *, workload: str, max_sessions: int, seed: int = 0,
             window_s: float | None = None, pool_size: int = 2000, slo_factor: float = 5.0,
             verbose: bool = True) -> dict[str, Any]:
    t0 = time.time()
    pool = request_pool(workload, seed, pool_size)
    cal = unloaded_latency(bench.engine(BOUND, token_budget=bench.budget(None)), bench, BOUND, pool)
    slo = slo_factor * cal["median_s"]
    ramp = mean_lifetime_s(pool, bench.setting.time_scale, cal["median_s"])
    window = window_s if window_s is not None else max(60.0, ramp)
    drain = 2 * ramp
    results = {}
    for lab in labels:
        r = sessions_at_slo(bench, lab, pool, slo, max_sessions=max_sessions, seed=seed, ramp_s=ramp, window_s=window,
                            drain_s=drain, verbose=verbose)
        results[lab] = r
    return {
        "workload": workload, "max_sessions": max_sessions, "seed": seed, "pool_size": pool_size,
        "slo": {"slo_factor": slo_factor, "unloaded_normalized_latency_s": cal["median_s"], "slo_normalized_latency_s": slo},
        "ramp_s": ramp, "window_s": window, "drain_s": drain,
        "policies": {lab: {"sessions_at_slo": r.sessions_at_slo, "censored": r.censored,
                           "replicas_for_max_sessions": replicas_needed(max_sessions, r), "wall_s": r.wall_s,
                           "probes": [dataclasses.asdict(p) for p in r.probes]} for lab, r in results.items()},
        "wall_s": time.time() - t0,
    }
