"""Shared by this folder's scripts: the simulator set up as `infercept simulate --like BENCH` sets it up
(costs fitted on the bench, about 5 minutes), cached in /tmp per bench file so that later runs take
seconds, and one simulated run of one policy at one rate and seed, with hooks."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import tempfile
from pathlib import Path

from infercept.benchmarks.sim.run import run_rate, sim_requests
from infercept.benchmarks.sim.validate import fit_cost, read_bench, sim_bench
from infercept.benchmarks.sim.workloads import bench_workloads
from infercept.benchmarks.workload import ShareGPT
from engine_adapter.policy.table import Action  # noqa: F401  (variants name it: at_pause=Action.PRESERVE)


def setup(bench: str):
    key = hashlib.sha1(Path(bench).read_bytes()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"infercept-diag-s16-{key}.pkl"
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    bj = read_bench(bench)
    fitted = fit_cost(bj)
    sb = sim_bench(bj, host_per_request_s=fitted.host_per_request_s, **fitted.kw)
    out = (sb, bj["workload"], float(bj["duration_s"]))
    cache.write_bytes(pickle.dumps(out))
    return out


def run(setup_, label: str, variant: str, seed: int, rate: float, hook=None):
    """One simulated run. `variant`: 'base', or '+'-joined parts: PolicySpec replacements (`new_first=False`),
    `armall` (every queued swap-in armed at once), `dead_first`/`dead_dropped`/`pause_mru` (the host tier's
    eviction), `host_gib=X` (its size), `budget=N` (the token budget). `hook(eng)` is called before the
    requests are submitted."""
    sb, workload, duration = setup_
    sharegpt = sb.setting.model if workload in ("mixed", "chatbot") and ShareGPT.available() else None
    w, _ = bench_workloads(workload, [rate], duration, seed, context_scale=sb.setting.context_scale,
                           max_context=sb.setting.max_context, sharegpt_model=sharegpt)
    parts = [p for p in variant.split("+") if p and p != "base"]
    bench_gib = sb.setting.swap_space_gib
    budget = None
    for part in [p for p in parts if p.startswith(("host_gib=", "budget="))]:
        if part.startswith("budget="):  # a token budget (default: the policy's in the bench, else its default)
            budget = int(part.split("=")[1])
        else:  # another host buffer than the bench's
            sb.setting.swap_space_gib = float(part.split("=")[1])
    eng = sb.engine(label, token_budget=budget)
    sb.setting.swap_space_gib = bench_gib  # (the engine has read it; the cached setting stays the bench's)
    core = eng.core
    for part in [p for p in parts if not p.startswith(("host_gib=", "budget="))]:
        if part == "armall":
            core.swap.how_many_to_arm = lambda queued, loading, first_at_head=False: len(queued)
            continue
        if part in ("dead_first", "dead_dropped"):
            dead_sessions(eng.sched.host_tier, drop=part == "dead_dropped")
            continue
        if part == "pause_mru":
            pause_mru(eng)
            continue
        k, v = part.split("=")
        core.spec = dataclasses.replace(core.spec, **{k: eval(v)})
    if hook is not None:
        hook(eng)
    reqs = sim_requests(w[rate], sb, label, prefix=f"{rate:g}-")
    out = run_rate(eng, reqs, sb.setting.drain_s, sb.setting.kv_tokens)
    return eng, reqs, out


def dead_sessions(tier, drop: bool = False) -> None:
    """The host tier evicts a finished session's blocks first (or drops them) instead of making them the
    most recently used, as vLLM's LRU does when a request finishes (an agent session's one request
    finishes when the session ends: nothing will read its context again unless another shares it)."""
    lru_finished = tier.finished

    def finished(r):
        used = tier._used_upto.get(r.rid, 0)
        lru_finished(r)
        for idx in range(used):
            k = r.key + idx
            if k in tier._keys and tier._keys[k] <= tier.now and k not in tier._reading:
                if drop:
                    del tier._keys[k]
                else:
                    tier._keys.move_to_end(k, last=False)

    tier.finished = finished


def pause_mru(eng) -> None:
    """At each pause, the session's blocks on the host become the most recently used (its first block last
    of all): from then on the host copy is the one its next turn reads."""
    tier, core = eng.sched.host_tier, eng.core
    pause = core.pause

    def paused(info, now):
        rec = pause(info, now)
        r = eng.sched.requests.get(info.request_id)
        if r is not None:
            for idx in range(tier._used_upto.get(r.rid, 0) - 1, -1, -1):
                if r.key + idx in tier._keys:
                    tier._keys.move_to_end(r.key + idx)
        return rec

    core.pause = paused
