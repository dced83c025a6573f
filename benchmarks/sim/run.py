"""One policy over the request rates, as `infercept.benchmarks.runner` runs it on the real engine (`EngineRun`):
one engine per policy and seed for all rates in turn (its estimator and profile refinement carry
over), each rate's requests replayed until they finish or the cutoff (last arrival + drain), then
summarized by the benchmark's own `summarize` (normalized latency, JCT, waste by kind over the real KV
capacity, recompute share, ...), plus what only a simulator knows (the true swap stall)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from infercept.benchmarks.metrics import Outcome, Turn, summarize
from infercept.benchmarks.metrics import pct as _pct
from infercept.benchmarks.sim.engine import SimEngine
from infercept.benchmarks.sim.request import SimRequest, from_workload
from infercept.benchmarks.sim.setup import SimBench, variant
from infercept.benchmarks.workload import Request


def sim_requests(reqs: Sequence[Request], bench: SimBench, label: str, prefix: str) -> list[SimRequest]:
    v = variant(label)
    s = bench.setting
    return [from_workload(r, s.time_scale, zero_calls=v.zero_calls, rid_prefix=prefix) for r in reqs]


def outcome(r: SimRequest, index: int, t0: float, returned_s: float | None = None) -> Outcome:
    """The benchmark's record of one simulated request. `returned_s`: when its call returned to the
    replay where the engine has not heard of it yet (the front end's delay): the turn is under way."""
    o = Outcome(index, r.aug_type, t0 + r.arrival_s)
    o.end_s, o.first_token_s = r.end_s, r.first_token_s
    o.call_s, o.output_tokens = r.call_s, r.output_tokens
    o.turns = [Turn(index, r.aug_type, k, n_in, n_out, sent - t0, first - sent, end - sent)
               for k, n_in, n_out, sent, first, end in r.turn_log]
    if returned_s is not None:
        o.open_turn = (r.turn + 1, t0 + returned_s, None)
    elif r.end_s is None and (not r.turn_log or r.turn_log[-1][0] != r.turn):  # sent, not ended (not in a call)
        o.open_turn = (r.turn, t0 + r.turn_sent_s, None if r.turn_first_s is None else t0 + r.turn_first_s)
    return o


def run_rate(eng: SimEngine, reqs: list[SimRequest], drain_s: float, capacity_tokens: int) -> dict[str, Any]:
    """One rate's requests on a running engine. `capacity_tokens`: the waste shares' denominator, the
    real KV capacity (the bound's larger pool included: the benchmark's rule)."""
    stats0 = eng.stats()
    stall0 = (eng.true_stall_s, eng.true_stall_token_s)
    t0 = eng.now
    for r in reqs:
        r.arrival_s += t0
        r.arrival_time = r.arrival_s
        eng.submit(r)
    last = max((r.arrival_s for r in reqs), default=t0)
    steps0, preempt0, idle0 = eng.steps, eng.sched.preemptions, eng.idle_steps
    eng.run(until=last + drain_s)
    cutoff = eng.now
    returned = eng.returned_by(cutoff)
    left = eng.abort_all()
    stats1 = eng.stats()
    outs = [outcome(r, i, 0.0, returned.get(r.rid)) for i, r in enumerate(reqs)]
    wall = cutoff - t0
    pool = stats1["blocks"]["total"] * stats1["block_size"]
    out = summarize(outs, stats0, stats1, wall, cutoff, capacity_tokens)
    if capacity_tokens != pool:
        out["pool_tokens"] = pool
    # The core's meter estimates a step's copy stall as copy - (step - copy), which counts a stall
    # where copies overlapped a longer forward pass; the simulator knows the forward time apart.
    true_s, true_ts = eng.true_stall_s - stall0[0], eng.true_stall_token_s - stall0[1]
    cap_ts = out["capacity_tokens"] * wall
    out["swap_stall_true_s"] = true_s
    out["waste_share_true_stall"] = ((out["waste_total_token_s"] - out["waste"]["swap_stall"]["token_s"] + true_ts) / cap_ts
                                     if cap_ts else None)
    out.update({"timed_out": len(left), "unfinished": len(left), "steps": eng.steps - steps0,
                "preemptions": eng.sched.preemptions - preempt0, "sim_idle_steps": eng.idle_steps - idle0})
    return out


def run_policy(bench: SimBench, label: str, workloads: dict[float, list[Request]], drain_s: float,
               check_every: int = 0, speeds: Mapping[float, float] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(results per rate, engine info) for one policy label and one seed's workloads, as the runner's
    `run_sweep` runs one `EngineRun`."""
    eng = bench.engine(label, check_every=check_every)
    results: dict[str, Any] = {}
    for rate, reqs in workloads.items():
        sims = sim_requests(reqs, bench, label, prefix=f"{rate:g}-")
        eng.speed = bench.speed * (speeds or {}).get(rate, 1.0)  # the machine's speed at this rate's run (`SimEngine.speed`)
        results[f"{rate:g}"] = run_rate(eng, sims, drain_s, bench.setting.kv_tokens) | {"rate": rate}
    info = {"policy": variant(label).policy, "token_budget": bench.budget(label), "kv_blocks": eng.sched.pool.num_blocks,
            "block_size": eng.bs, "saturation_tokens": eng.core.profile.saturation_tokens,
            "max_num_seqs": eng.sched.max_num_seqs, "swap_space_gib": bench.setting.swap_space_gib}
    return results, info


CALIBRATION_REQUESTS = 16  # the runner's `Plan.calibration_requests`


def unloaded_latency(eng: SimEngine, bench: SimBench, label: str, reqs: Sequence[Request],
                     n: int = CALIBRATION_REQUESTS) -> dict[str, Any]:
    """The SLO's reference, as the runner measures it: the first requests one at a time with
    zero-time calls (the bound's replay), on an otherwise idle engine."""
    lat, ttft = [], []
    for i, r in enumerate(reqs[:n]):
        sim = from_workload(dataclasses.replace(r, arrival_s=0.0), bench.setting.time_scale,
                            zero_calls=True,
                            rid_prefix=f"cal{i}-")
        sim.arrival_s = sim.arrival_time = eng.now
        eng.submit(sim)
        eng.run()
        o = outcome(sim, i, 0.0)
        if o.normalized_latency is not None:
            lat.append(o.normalized_latency)
        if o.first_token_s is not None:
            ttft.append(o.first_token_s - o.arrival_s)
    return {"requests": len(lat), "median_s": _pct(lat, 0.5), "p90_s": _pct(lat, 0.9), "ttft_p90_s": _pct(ttft, 0.9)}
