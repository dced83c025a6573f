"""`infercept simulate --validate BENCH_JSON`: replay a benchmark run's setting in the simulator and
compare each policy's max rate at the SLO (median over seeds) with the bench's headline.

Everything comes from the bench.json `infercept bench` writes: the workload, its rates, duration and
seeds (the same generator, with ShareGPT prompts and the model's tokenizer where the runner used them,
so the same requests; the report checks the request counts and mixes against the bench's), the engine
setting (KV size, the bound's KV, block size, slots, swap space and link, time scale, drain), the
profile it ran with (`setting.profile_data`), each policy's own token budget (`token_budget`, after
the pilot when baselines were tuned), and the SLO (`slo.slo_normalized_latency_s`): the simulated
headline is judged at the bench's SLO; the simulator's own calibration of it is reported beside.

Three constants are not in the profile (`fit_cost`): the host time per step beyond it, or a factor on every
step's time where the profile is slower than the machine was at the reference (either calibrated on the
bench's unloaded reference), the share of a step swap copies hide behind (what the bench's engines
learned, `swap_overlap`), and the host time per step per request the engine holds (see `SimEngine`).
The last is fitted once, on one policy (`fit_on`, default the bound, which never recomputes), and every other policy is
then a prediction."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercept.benchmarks.metrics import max_rate_at_slo, measured_runs, point_probe_s, resume_bound, slo_misses
from infercept.benchmarks.sim.cost import (
    KVSpill,
    attention_pair_s,
    context_shares,
    pristine,
    read_decode_grid,
)
from infercept.benchmarks.sim.report import headline
from infercept.benchmarks.sim.setup import SimBench, make_setting, profile_from_bench, simulable, variant
from infercept.benchmarks.sim.speedcheck import format_speed_check, reference_probe_s, speed_check
from infercept.benchmarks.sim.sweep import sweep
from infercept.benchmarks.workload import ShareGPT
from engine_adapter.paths import configs_dir

DEFAULT_PROFILE = configs_dir() / "profiles" / "tiny-cpu-bench.json"
_NOT_SETTING = ("profile", "profile_data", "priors_dir")
# 0 to 400 us per held request per step in 20 us steps (where every bench but `qa`'s has fitted), 50 us steps to
# 1 ms (`qa-val-amd` fits above 400 us, and its knees move with every 100 us), then 1.5 and 2 ms, so that a fit at the top
# says the simulator lacks a cost rather than that the grid was short.
HOST_GRID_S = (tuple(i * 20e-6 for i in range(21)) + tuple(i * 50e-6 for i in range(9, 21))
               + tuple(x * 1e-6 for x in (1500, 2000)))
# The bound never recomputes or swaps, and every bench runs it: its latency measures the host time alone.
DEFAULT_FIT_ON = "unlimited-kv"
PAIR_SCALE_GRID = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)  # x the profile grid's cost per attention pair


def read_bench(bench_path: str | Path) -> dict[str, Any]:
    bj = json.loads(Path(bench_path).read_text())
    missing = [k for k in ("seeds", "rates", "policies", "setting", "slo", "headline", "results") if k not in bj]
    if missing:
        raise ValueError(f"{bench_path}: not a bench.json of the current runner (no {', '.join(missing)}); "
                         "rerun `infercept bench`")
    return bj


def bench_budgets(bj: Mapping[str, Any]) -> dict[str, int | None]:
    """Each policy's token budget as its engine reported it (a null budget in `token_budget` is vLLM's
    default, which only the engine knows); the bench's default where neither says."""
    default = bj.get("token_budget_default")
    engines = bj.get("engines") or {}
    return {lab: next((x for x in ((engines.get(lab) or {}).get("token_budget"), b) if x is not None), default)
            for lab, b in (bj.get("token_budget") or {}).items()}


def sim_bench(bj: Mapping[str, Any], *, token_budget: int | None = None, context_share: float | Mapping[int, float] | None = None,
              frontend_s: tuple[float, float] | None = None, host_per_request_s: float = 0.0,
              step_overhead_s: float = 0.0, spill: KVSpill | None = None, pair_scale: float = 1.0,
              window_share: float = 1.0, chunk_step_s: float | None = None, speed: float = 1.0) -> SimBench:
    st = dict(bj["setting"])
    setting = make_setting(**{k: v for k, v in st.items() if k not in _NOT_SETTING})
    budgets = bench_budgets(bj) if token_budget is None else {lab: token_budget for lab in bj["policies"]}
    default = token_budget or bj.get("token_budget_default")
    profile = profile_from_bench(st, fallback=DEFAULT_PROFILE)
    # The attention cost per (query, earlier key) pair: the profile grid's own (None) or a multiple of it.
    pair_s = None if pair_scale == 1.0 else pair_scale * attention_pair_s(pristine(profile))
    return SimBench(setting, profile, token_budget=budgets, default_budget=default,
                    context_share=context_share, frontend_s=frontend_s, host_per_request_s=host_per_request_s,
                    step_overhead_s=step_overhead_s, spill=spill, pair_s=pair_s, window_share=window_share,
                    chunk_step_s=chunk_step_s, speed=speed)


def measured_window_share(bj: Mapping[str, Any]) -> float | None:
    """The swap budget's share of a step as the bench's engines learned it (`swap_overlap`, recorded per
    run since the simulator needed it): the median over every run that swapped (a run that never did
    reports the initial 1.0); None where the bench did not record it."""
    xs = [r["swap_overlap"] for runs in (bj.get("results") or {}).values() for by_rate in runs.values()
          for r in by_rate.values() if isinstance(r, Mapping) and r.get("swap_overlap") is not None
          and r.get("swapped_out_tokens")]
    return statistics.median(xs) if xs else None


@dataclass(frozen=True)
class SpeedReplay:
    """How a validation replays each point's machine speed from its probes: (probe / anchor) ** exponent.

    `PROBED` (`--at-machine-speed`): the probe over the SLO reference's, whole. `damped` (`--at-machine-speed
    damped`): the probe over the run's median probe, to the power the forward time followed the probes with in a
    replay at one speed (`speedcheck.probe_slope`): the typical point stays where the unloaded calibration put
    every point, and a point whose probe moved is moved by as much of it as the loaded engine moved with probes.
    Session 28 measured why the whole probe overshoots: the kept reference's probe is a fast draw (0.63-0.89x the
    run's median on five runs), and a probe moves 2-5x more than the loaded forward time."""

    exponent: float = 1.0
    anchor: str = "reference"  # or "median": the run's median point probe

    def describe(self) -> str:
        over = "the SLO reference's probe" if self.anchor == "reference" else "the run's median probe"
        return (f"each point at its machine check's speed over {over}" +
                ("" if self.exponent == 1.0 else f", to the power {self.exponent:.3f} (damped)") + " (machine_speeds)")


PROBED = SpeedReplay()


def machine_speeds(bj: Mapping[str, Any], labels: Sequence[str], rates: Sequence[float] = (),
                   how: SpeedReplay = PROBED) -> dict[str, dict[int, dict[float, float]]]:
    """Each measured point's machine speed relative to the SLO reference's (`SimEngine.speed`): the mean of
    the point's machine-check probes (one request alone on the idle engine before and after it) over the
    probe of the reference the bench kept (the faster one), by label, seed and rate; `how` may anchor it on the
    run's median probe instead and damp it (`SpeedReplay`). The reference is where
    the simulator's costs are calibrated (`_fit_step_overhead`), so it is speed 1. `rates`: every rate the
    replay runs; one the bench did not measure for a policy and seed (another policy's bisection probe) gets the
    median of that policy's measured speeds, not the reference's (a fast moment). A policy the bench did not
    run at all (one explored in the simulator beside the measured ones) gets, at each seed and rate, the median
    speed of the policies measured there: the machine as every policy met it at that point of the run. A bench
    without the probes (made before the machine check) cannot be replayed so: an error naming what is missing."""
    ref = reference_probe_s(bj)
    if ref is None:
        raise ValueError("this bench recorded no machine check for its SLO reference (slo.reference_runs[].probe_s_per_token): "
                         "it cannot be replayed at its measured machine speed")
    results = bj.get("results") or {}
    probes: dict[str, dict[int, dict[float, float]]] = {}
    for lab, by_seed in results.items():
        for seed, runs in by_seed.items():
            for r in runs.values():
                probe = point_probe_s(r)
                if probe is None:
                    raise ValueError(f"{lab}, seed {seed}, {r.get('rate')} req/s: no machine check in the bench's point")
                probes.setdefault(lab, {}).setdefault(int(seed), {})[float(r["rate"])] = probe
    if not probes:
        raise ValueError("the bench has no measured point: no machine speed to replay at")
    if how.anchor == "median":
        ref = statistics.median(x for m in probes.values() for by_rate in m.values() for x in by_rate.values())
    elif how.anchor != "reference":
        raise ValueError(f"unknown machine-speed anchor {how.anchor!r}: 'reference' or 'median'")
    measured = {lab: {seed: {rate: (x / ref) ** how.exponent for rate, x in by_rate.items()} for seed, by_rate in m.items()}
                for lab, m in probes.items()}
    every = statistics.median(x for m in measured.values() for by_rate in m.values() for x in by_rate.values())
    out: dict[str, dict[int, dict[float, float]]] = {}
    for lab in labels:
        if lab in measured:
            by_seed = out[lab] = {seed: dict(by_rate) for seed, by_rate in measured[lab].items()}
            typical = statistics.median(x for by_rate in by_seed.values() for x in by_rate.values())
            for by_rate in by_seed.values():
                for rate in rates:
                    by_rate.setdefault(float(rate), typical)
            continue
        for seed in (int(x) for x in bj.get("seeds") or ()):
            at = {float(r) for r in rates} | {r for m in measured.values() for r in m.get(seed, {})}
            for rate in sorted(at):
                there = [m[seed][rate] for m in measured.values() if rate in m.get(seed, {})]
                out.setdefault(lab, {}).setdefault(seed, {})[rate] = statistics.median(there) if there else every
    return out


def _speed_replay(mode: str | None) -> SpeedReplay | None:
    """The replay `validate` starts from: None (one speed, also the first pass of "damped"), or `PROBED`."""
    if mode in (None, "one", "damped"):
        return None
    if mode == "probed":
        return PROBED
    raise ValueError(f"unknown machine-speed replay {mode!r}: 'probed' or 'damped' (or none: one speed)")


def validate(bench_path: str | Path, *, policies: list[str] | None = None, token_budget: int | None = None,
             context_share: float | Mapping[int, float] | None = None, frontend_s: tuple[float, float] | None = None,
             host_per_request_s: float | None = None, step_overhead_s: float | None = None, fit_on: str | None = DEFAULT_FIT_ON,
             decode_grid: str | Path | None = None, cache_cliff: bool = False, fit_recompute_on: str | None = None,
             window_share: float | None = None, chunk_step_s: float | None = None, verbose: bool = True,
             machine_speed: str | None = None) -> dict[str, Any]:
    """Replay and compare. Unless given, the host time per held request per step is fitted on
    `fit_on` alone (the grid value whose median latencies are closest to the measured ones, `_fit_grid`);
    the report also gives every policy's error without it. `decode_grid`: decode steps measured over
    batch x context on the bench's machine; unless `context_share` is given, the share of each profile
    decode step that grows with context is taken from them (`context_shares`, on the steps short of a
    cache cliff if they show one). `cache_cliff`: also charge the cliff (`KVSpill`) fitted on them.
    `fit_recompute_on`: after the host time, fit on that policy alone a multiple of the profile's
    attention cost per (query, earlier key) pair, the cost a chunk of a recompute (or of a chunked
    prompt) pays over the context before it and a lone prompt of the grid never does; fitting the host
    time then on a policy that never recomputes (the bound) keeps the two apart. `machine_speed`: None replays
    every point at one speed; "probed" at the machine speed its machine check measured (`machine_speeds`), the
    fits included; "damped" first replays at one speed, takes the slope with which the forward time followed the
    probes there (`speedcheck.probe_slope`, clipped to [0, 1]) and replays at the probes over their median to that
    power (`SpeedReplay`), the fits made again; the one-speed replay's speed check is kept beside."""
    bj = read_bench(bench_path)
    how = _speed_replay(machine_speed)
    # Unnamed: every policy of the bench the simulator models (the others are listed in the report).
    skipped = [] if policies else [lab for lab in bj["policies"] if not simulable(lab)]
    policies = list(policies or [lab for lab in bj["policies"] if simulable(lab)])
    for lab in policies:
        variant(lab)  # unknown or unsimulated labels fail here, before the fits
    cost_args = {"token_budget": token_budget, "context_share": context_share, "frontend_s": frontend_s,
                 "host_per_request_s": host_per_request_s, "step_overhead_s": step_overhead_s, "fit_on": fit_on,
                 "decode_grid": decode_grid, "cache_cliff": cache_cliff, "fit_recompute_on": fit_recompute_on,
                 "window_share": window_share, "chunk_step_s": chunk_step_s}
    first: dict[str, Any] | None = None
    if machine_speed == "damped":
        first, _ = _fitted_replay(bj, policies, None, verbose=False, **cost_args)
        fitted = first["speed_check"]["probe_slope"]
        if fitted is None:
            raise ValueError("a damped machine-speed replay needs at least four measured points with probes and forward times")
        how = SpeedReplay(exponent=min(1.0, max(0.0, fitted["slope"])), anchor="median")
    v, cost = _fitted_replay(bj, policies, how, verbose=verbose, **cost_args)
    kw, host_per_request_s, spill = cost.kw, cost.host_per_request_s, cost.spill
    v["bench"] = str(bench_path)
    v["bench_sha256"] = hashlib.sha256(Path(bench_path).read_bytes()).hexdigest()
    v["cost_model"].update(cost.fits())
    v["not_simulated"] = skipped
    if first is not None:  # what the damping was fitted on, and how the one-speed replay did
        v["one_speed_replay"] = {"speed_check": first["speed_check"], "summary": first["summary"],
                                 "host_per_request_s": first["cost_model"]["host_per_request_s"],
                                 "knees": {lab: {k: p[k] for k in ("simulated", "rel_error", "simulated_by_seed")}
                                           for lab, p in first["policies"].items()}}
    if spill is not None:
        without = _validate(bj, policies, host_per_request_s=host_per_request_s, verbose=False, machine_speed=how,
                            **{**kw, "spill": None})
        v["without_decode_spill"] = {lab: {k: p[k] for k in ("simulated", "rel_error")} for lab, p in without["policies"].items()}
    if host_per_request_s:
        without = _validate(bj, policies, host_per_request_s=0.0, verbose=False, machine_speed=how, **kw)
        v["without_host_overhead"] = {lab: {k: p[k] for k in ("simulated", "rel_error")} for lab, p in without["policies"].items()}
    return v


def _fitted_replay(bj: Mapping[str, Any], policies: list[str], how: SpeedReplay | None, *, verbose: bool,
                   **cost_args: Any) -> tuple[dict[str, Any], FittedCost]:
    """The costs fitted (`fit_cost`) and every policy replayed with them at the machine speeds `how` gives (None:
    one speed), with the replay's speed check (once, on this replay: the fits' trials need none)."""
    cost = fit_cost(bj, machine_speed=how, **cost_args)
    v = _validate(bj, policies, host_per_request_s=cost.host_per_request_s, verbose=verbose, machine_speed=how, **cost.kw)
    v["speed_check"] = speed_check(bj, v["per_rate"])
    return v, cost


@dataclass
class FittedCost:
    """The simulator's cost constants for one bench run: `kw` for `sim_bench` / `_validate` (the host time
    per held request apart), and how each was found."""

    kw: dict[str, Any]
    host_per_request_s: float
    spill: KVSpill | None
    host_fit: dict[str, Any] | None
    recompute_fit: dict[str, Any] | None
    step_overhead_fit: dict[str, Any] | None
    decode_grid: str | None
    window_share_source: str = "given"

    def fits(self) -> dict[str, Any]:
        return {"window_share": self.kw["window_share"], "window_share_source": self.window_share_source,
                "host_fit": self.host_fit, "recompute_fit": self.recompute_fit,
                "pair_scale": self.kw.get("pair_scale", 1.0), "step_overhead_fit": self.step_overhead_fit,
                "speed_at_reference": self.kw["speed"],
                "decode_grid": self.decode_grid, "decode_spill": self.spill.to_dict() if self.spill else None}


def fit_cost(bj: Mapping[str, Any], *, token_budget: int | None = None,
             context_share: float | Mapping[int, float] | None = None, frontend_s: tuple[float, float] | None = None,
             host_per_request_s: float | None = None, step_overhead_s: float | None = None,
             fit_on: str | None = DEFAULT_FIT_ON, decode_grid: str | Path | None = None, cache_cliff: bool = False,
             fit_recompute_on: str | None = None, window_share: float | None = None,
             chunk_step_s: float | None = None, machine_speed: SpeedReplay | None = None) -> FittedCost:
    """The cost constants the bench's machine had (see `validate`), each given or fitted on the bench.
    `window_share`: given, or the bench's measured one (`measured_window_share`); 1.0 (copies hide
    behind the whole step) where the bench did not record it, said so in `window_share_source`."""
    for label in (fit_on if host_per_request_s is None else None, fit_recompute_on):
        if label is not None and label not in bj["policies"]:
            raise ValueError(f"cannot fit on {label!r}: the bench ran {', '.join(bj['policies'])} "
                             "(name one of them, or give the value)")
    if window_share is not None and not 0.0 < window_share <= 1.0:
        raise ValueError(f"window share {window_share}: the share of a step copies hide behind is in (0, 1]")
    source = "given"
    if window_share is None:
        window_share = measured_window_share(bj)
        source = "measured by the bench's engines (median swap_overlap)"
        if window_share is None:
            window_share, source = 1.0, "not recorded by this bench: 1.0 assumed"
    spill = None
    if decode_grid is not None:
        rows = read_decode_grid(decode_grid)
        cliff = KVSpill.fit(rows, int(bj["setting"].get("kv_bytes_per_token") or 1024),
                            source=f"fitted on {decode_grid} ({len(rows)} decode steps)")
        if context_share is None:
            prof = profile_from_bench(bj["setting"], fallback=DEFAULT_PROFILE)
            context_share = context_shares(rows, prof, cliff.threshold_bytes if cliff else None) or None
        spill = cliff if cache_cliff else None
    elif cache_cliff:
        raise ValueError("the cache cliff is fitted on a decode grid: give --decode-grid")
    step = None
    if step_overhead_s is None:
        step = _fit_step_overhead(bj, token_budget=token_budget, context_share=context_share, frontend_s=frontend_s,
                                  spill=spill, window_share=window_share, chunk_step_s=chunk_step_s)
        step_overhead_s = step["step_overhead_s"]
    kw: dict[str, Any] = {"token_budget": token_budget, "context_share": context_share, "frontend_s": frontend_s,
                          "step_overhead_s": step_overhead_s, "spill": spill, "window_share": window_share,
                          "chunk_step_s": chunk_step_s, "speed": step["speed"] if step else 1.0}
    fit = None
    if host_per_request_s is None:
        if fit_on is None:
            host_per_request_s = 0.0
        else:
            fit = _fit_host(bj, fit_on, machine_speed=machine_speed, **kw)
            host_per_request_s = fit["host_per_request_s"]
    pair_fit = None
    if fit_recompute_on is not None:
        pair_fit = _fit_grid(bj, fit_recompute_on, "pair_scale", PAIR_SCALE_GRID, host_per_request_s=host_per_request_s,
                             machine_speed=machine_speed, **kw)
        kw["pair_scale"] = pair_fit["pair_scale"]
    return FittedCost(kw, host_per_request_s, spill, fit, pair_fit, step,
                      str(decode_grid) if decode_grid is not None else None, source)


def _fit_step_overhead(bj: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    """The simulator's speed calibrated on the bench's own SLO reference: the simulated unloaded normalized
    latency (the same requests one at a time with zero-time calls on the bound) made equal to the measured
    one, by bisection. No policy is involved. Where the profile's steps are too fast for the reference, the
    host time per step beyond the profile's (`step_overhead_s`: what a step costs this machine, during this
    bench, beyond what `infercept profile` measured on it); where they are too slow (the profile was measured
    at a slower moment than the reference: the `chatbot` run's, 1.4x), a factor on every step's time
    (`speed`, below 1; an overhead cannot be negative), so that the reference is speed 1 for the replay at
    machine speed as `machine_speeds` assumes."""
    target = float(bj["slo"]["unloaded_normalized_latency_s"])
    seeds = [int(x) for x in bj["seeds"]]
    sharegpt = bj["setting"].get("model") if bj["workload"] in ("mixed", "chatbot") and ShareGPT.available() else None

    def unloaded(step_s: float, speed: float = 1.0) -> float:
        sb = sim_bench(bj, step_overhead_s=step_s, **{**kw, "speed": speed})
        res = sweep(sb, [], [min(float(r) for r in bj["rates"])], float(bj["duration_s"]), seeds[:1], workload=bj["workload"],
                    sharegpt_model=sharegpt, verbose=False)
        return float(res["slo"]["unloaded_normalized_latency_s"])

    def bisect(f: Callable[[float], float], lo: float, hi: float) -> tuple[float, float, list[tuple[float, float]]]:
        """The x in [lo, hi] whose f(x) (increasing in x) is nearest the target, and the trials."""
        trials = []
        for _ in range(14):
            mid = (lo + hi) / 2
            u = f(mid)
            trials.append((mid, u))
            lo, hi = (mid, hi) if u < target else (lo, mid)
        x, u = min(trials, key=lambda t: abs(t[1] - target))
        return x, u, trials

    at_profile = unloaded(0.0)
    fit = {"step_overhead_s": 0.0, "speed": 1.0, "target_unloaded_s": target, "simulated_unloaded_s": at_profile,
           "trials": [(0.0, at_profile)]}
    if at_profile < target:
        step, u, trials = bisect(unloaded, 0.0, 0.02)
        return fit | {"step_overhead_s": step, "simulated_unloaded_s": u, "trials": fit["trials"] + trials}
    if at_profile > target:
        speed, u, trials = bisect(lambda x: unloaded(0.0, x), 0.2, 1.0)
        return fit | {"speed": speed, "simulated_unloaded_s": u, "speed_trials": trials}
    return fit


def _fit_host(bj: Mapping[str, Any], label: str, **kw: Any) -> dict[str, Any]:
    """The host time per held request per step: `_fit_grid` over `HOST_GRID_S`."""
    return _fit_grid(bj, label, "host_per_request_s", HOST_GRID_S, **kw)


def _fit_grid(bj: Mapping[str, Any], label: str, name: str, grid: Sequence[float], **kw: Any) -> dict[str, Any]:
    """The grid value of the cost parameter `name` whose simulated median normalized latencies of `label`
    are closest to the measured ones over every (seed, rate) run (mean absolute log ratio): every run
    of one policy, not only its headline, which one noisy seed can move. Ties go to the smallest."""
    trials = []
    for c in grid:
        v = _validate(bj, [label], verbose=False, **{**kw, name: c})  # kw: the cost constants and machine_speed
        p = v["policies"][label]
        errs = [abs(math.log(x["simulated"]["median_normalized_latency_s"] / x["measured"]["median_normalized_latency_s"]))
                for x in v["per_rate"][label].values()
                if x["simulated"]["median_normalized_latency_s"] and x["measured"]["median_normalized_latency_s"]]
        trials.append({name: c, "simulated": p["simulated"], "rel_error": p["rel_error"],
                       "latency_log_error": statistics.fmean(errs) if errs else None})
    best = min(trials, key=lambda t: (t["latency_log_error"] if t["latency_log_error"] is not None else 1e9, t[name]))
    return {"fitted_on": label, "criterion": "mean |log(simulated / measured)| of the median normalized latency over "
            "every (seed, rate) run", name: best[name], "at_grid_edge": len(grid) > 1 and best[name] == grid[-1],
            "trials": trials}


def _validate(bj: Mapping[str, Any], policies: list[str] | None, *, host_per_request_s: float, verbose: bool,
              token_budget: int | None = None, context_share: float | Mapping[int, float] | None = None,
              frontend_s: tuple[float, float] | None = None, step_overhead_s: float = 0.0,
              spill: KVSpill | None = None, pair_scale: float = 1.0, window_share: float = 1.0,
              chunk_step_s: float | None = None, machine_speed: SpeedReplay | None = None, speed: float = 1.0) -> dict[str, Any]:
    labels = list(policies or bj["policies"])
    for lab in labels:
        variant(lab)  # unknown labels fail here, before any work
    seeds = [int(x) for x in bj["seeds"]]
    sb = sim_bench(bj, token_budget=token_budget, context_share=context_share, frontend_s=frontend_s,
                   host_per_request_s=host_per_request_s, step_overhead_s=step_overhead_s, spill=spill,
                   pair_scale=pair_scale, window_share=window_share, chunk_step_s=chunk_step_s, speed=speed)
    # The runner draws ShareGPT prompts (tokenized by the model's tokenizer) for these workloads when
    # the package is installed.
    sharegpt = sb.setting.model if bj["workload"] in ("mixed", "chatbot") and ShareGPT.available() else None
    slo = float(bj["slo"]["slo_normalized_latency_s"])
    ttft_slo = bj["slo"].get("ttft_p99_bound_s")
    resume_slo = bj["slo"].get("resume_p99_bound_s")  # None for a run made before resumed turns were bounded
    # Every rate the bench tried (its bisection probes each policy and seed at rates of its own): the
    # simulator runs them all, so that both knees are found on the same points.
    tried = sorted({float(r["rate"]) for lab in labels for runs in (bj["results"].get(lab) or {}).values() for r in runs.values()}
                   | {float(r) for r in bj["rates"]})
    speeds = machine_speeds(bj, labels, tried, machine_speed) if machine_speed else None
    res = sweep(sb, labels, tried, float(bj["duration_s"]), seeds, workload=bj["workload"],
                slo_factor=float(bj["slo"]["slo_factor"]), slo_s=slo, ttft_slo_s=ttft_slo, resume_slo_s=resume_slo,
                sharegpt_model=sharegpt, verbose=verbose, speeds=speeds)
    # The simulator's own SLO, by the rules the bench was judged by (no resume bound for a run before it).
    own = headline(res["results"], res["slo"]["slo_normalized_latency_s"], res["slo"]["ttft_p99_bound_s"],
                   res["slo"]["resume_p99_bound_s"] if resume_slo is not None else None)
    out_pol: dict[str, Any] = {}
    per_rate: dict[str, Any] = {}
    for lab in labels:
        mh = (bj.get("headline") or {}).get(lab) or {}
        measured, sim = mh.get("max_rate_at_slo"), res["headline"][lab]["max_rate_at_slo"]
        at_own = own[lab]["max_rate_at_slo"]
        out_pol[lab] = {
            "measured": measured, "simulated": sim, "rel_error": (sim - measured) / measured if measured else None,
            "measured_min_max": [mh.get("max_rate_min"), mh.get("max_rate_max")],
            "simulated_min_max": [res["headline"][lab]["max_rate_min"], res["headline"][lab]["max_rate_max"]],
            # Per seed: where the median is 0 (discard here) the relative error is undefined; these say how far off.
            "measured_by_seed": mh.get("max_rate_by_seed"),
            "simulated_by_seed": res["headline"][lab].get("max_rate_by_seed"),
            "censored": {"measured": mh.get("censored"), "simulated": res["headline"][lab]["censored"]},
            "token_budget": sb.budget(lab),
            # The simulator's curve against its own calibration of the SLO (separates the latency
            # model from the SLO's reference).
            "simulated_at_simulated_slo": at_own,
            "rel_error_at_simulated_slo": (at_own - measured) / measured if measured else None,
            "waste_share_at_slo_rate": {"measured": mh.get("waste_share_at_slo_rate"),
                                        "simulated": res["headline"][lab]["waste_share_at_slo_rate"]},
        }
        per_rate[lab] = {}
        for seed in seeds:
            meas = measured_runs(bj, lab, seed)
            for rate, x in res["results"][lab][seed].items():
                m = meas.get(rate)
                row = {"measured": _brief(m or {}), "simulated": _brief(x)}
                if m:  # which of the bench's rules each side fails (a knee moves where they differ)
                    row["misses"] = {"measured": slo_misses(m, slo, ttft_slo, resume_slo),
                                     "simulated": slo_misses(x, slo, ttft_slo, resume_slo)}
                per_rate[lab][f"{seed}/{rate}"] = row
        out_pol[lab]["verdicts"] = verdicts(per_rate[lab].values())
        out_pol[lab].update(same_rates_knee(bj, res["results"][lab], lab, seeds, measured, slo, ttft_slo, resume_slo))
    errs = [abs(p["rel_error"]) for p in out_pol.values() if p["rel_error"] is not None]
    counts = {k: (n, (bj.get("requests_per_rate") or {}).get(k)) for k, n in res["requests_per_rate"].items()}
    mixes_differ = sorted(k for k, m in res["request_mix"].items() if (bj.get("request_mix") or {}).get(k, m) != m)
    return {
        "bench_commit": bj.get("commit"), "bench_command": bj.get("command"), "bench_started": bj.get("started"),
        "replay": res["replay"],
        "workload_check": {"same_requests_per_rate": all(b is None or a == b for a, b in counts.values()),
                           "same_request_mix": not mixes_differ, "differing": sorted(k for k, (a, b) in counts.items() if b is not None and a != b) + mixes_differ},
        "profile": sb.profile.source,
        "cost_model": {"decode_context_share": getattr(sb.engine(labels[0]).cost, "context_share", None),
                       "attention_pair_s": getattr(sb.engine(labels[0]).cost, "pair_s", None),
                       "frontend_in_out_s": list(sb.frontend()), "host_per_request_s": sb.host_per_request_s,
                       "step_overhead_s": sb.step_overhead_s, "speed_at_reference": sb.speed, "chunk_step_s": sb.chunk_s(),
                       "chunk_step_source": "given" if chunk_step_s is not None else
                       ("the profile's extra.chunk_step_s" if "chunk_step_s" in sb.profile.extra else "not in the profile: 0"),
                       "machine_speed": machine_speed.describe() if machine_speed else "not applied: every point at the profile's speed",
                       "machine_speed_replay": dataclasses.asdict(machine_speed) if machine_speed else None},
        "machine_speeds": speeds,
        "seeds": seeds, "rates": res["rates"], "token_budget": res["token_budget"],
        "setting": {k: res["setting"][k] for k in ("kv_tokens", "unlimited_kv_tokens", "block_size", "max_num_seqs",
                                                    "swap_space_gib", "swap_link_gbps", "time_scale", "drain_s")},
        "slo": {"measured_s": bj["slo"].get("slo_normalized_latency_s"),
                "measured_unloaded_s": bj["slo"].get("unloaded_normalized_latency_s"),
                "simulated_s": res["slo"]["slo_normalized_latency_s"],
                "simulated_unloaded_s": res["slo"]["unloaded_normalized_latency_s"],
                "judged_at": "measured (the bench's SLO)"},
        "policies": out_pol,
        "summary": {"max_abs_rel_error": max(errs) if errs else None,
                    "median_abs_rel_error": statistics.median(errs) if errs else None,
                    "within_15pct": sorted(lab for lab, p in out_pol.items() if p["rel_error"] is not None and abs(p["rel_error"]) <= 0.15),
                    "outside_15pct": sorted(lab for lab, p in out_pol.items() if p["rel_error"] is not None and abs(p["rel_error"]) > 0.15),
                    # A measured max rate of 0 (the lowest rate missed the SLO): no relative error; see the
                    # per-seed range and per_rate for how far off the simulation is.
                    "no_relative_error": sorted(lab for lab, p in out_pol.items() if p["rel_error"] is None),
                    # The same judged on the engine's own rates only (`same_rates_knee`).
                    "within_15pct_same_rates": sorted(lab for lab, p in out_pol.items() if p["rel_error_same_rates"] is not None
                                                      and abs(p["rel_error_same_rates"]) <= 0.15)},
        "per_rate": per_rate,
        "simulated_headline": res["headline"],
        "simulated_bound_violations": res["bound_violations"],
        "sim_wall_s": res["sim_wall_s"],
    }


def same_rates_knee(bj: Mapping[str, Any], simulated: Mapping[int, Mapping[str, Any]], label: str, seeds: Sequence[int],
                    measured: float | None, slo_s: float, ttft_slo_s: float | None,
                    resume_slo_s: float | None) -> dict[str, Any]:
    """The simulated knee over only the rates the engine ran for this policy and seed. The replay runs every
    rate any policy tried (so both sides can find their knee), and a knee is the highest passing rate below
    the lowest failing one: a failure at a rate the engine never tried for this seed (a low one, most of
    all) lowers the simulated knee with nothing measured to compare. This knee is judged on the same points."""
    by_seed: dict[str, float] = {}
    for seed in seeds:
        meas = measured_runs(bj, label, seed)
        runs = {rate: x for rate, x in simulated[seed].items() if rate in meas}
        if runs:
            by_seed[str(seed)] = max_rate_at_slo(runs, slo_s, ttft_slo_s, resume_slo_s)[0]
    if not by_seed:
        return {"simulated_same_rates": None, "simulated_same_rates_by_seed": {}, "rel_error_same_rates": None}
    med = statistics.median(by_seed.values())
    return {"simulated_same_rates": med, "simulated_same_rates_by_seed": by_seed,
            "rel_error_same_rates": (med - measured) / measured if measured else None}


def verdicts(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Over a policy's measured runs: how often the simulator's SLO verdict is the engine's, and where they
    differ, the rules the failing side failed ("simulated_only": the simulator fails a run the engine
    passed, counted per rule), with the median log(simulated / measured) of the two first-token tails the
    rules judge (new requests' and resumed turns' p99), over the runs where both sides measured one."""
    runs = [r for r in rows if "misses" in r]
    agree = sum(1 for r in runs if bool(r["misses"]["measured"]) == bool(r["misses"]["simulated"]))
    only: dict[str, dict[str, int]] = {"simulated_only": {}, "measured_only": {}}
    for r in runs:
        sim, meas = r["misses"]["simulated"], r["misses"]["measured"]
        if sim and not meas:
            side, rules = "simulated_only", sim
        elif meas and not sim:
            side, rules = "measured_only", meas
        else:
            continue
        for rule in rules:
            only[side][rule] = only[side].get(rule, 0) + 1

    def log_ratio(key: str) -> float | None:
        xs = [math.log(r["simulated"][key] / r["measured"][key]) for r in runs
              if (r["simulated"].get(key) or 0) > 0 and (r["measured"].get(key) or 0) > 0]
        return statistics.median(xs) if xs else None

    return {"runs": len(runs), "agree": agree, **only,
            "median_log_ttft_p99": log_ratio("ttft_p99_s"), "median_log_resume_p99": log_ratio("resume_p99_s")}


def _brief(x: Mapping[str, Any]) -> dict[str, Any]:
    nl = x.get("normalized_latency_s") or {}
    return {"median_normalized_latency_s": nl.get("median"), "p90_normalized_latency_s": nl.get("p90"),
            "ttft_p99_s": (x.get("ttft_s") or {}).get("p99"), "resume_p99_s": (x.get("resume_s") or {}).get("p99"),
            "completed": x.get("completed"), "requests": x.get("requests"), "forward_s": x.get("forward_s"),
            "wall_s": x.get("wall_s"), "recompute_share_of_forward": x.get("recompute_share_of_forward"),
            "waste_share_of_capacity_time": x.get("waste_share_of_capacity_time"), "swap_stall_s": x.get("swap_stall_s"),
            "intercepts": x.get("intercepts"), "recomputed_tokens": x.get("recomputed_tokens"),
            "swapped_out_tokens": x.get("swapped_out_tokens"), "demoted": x.get("demoted"),
            "host_tier": x.get("host_tier"),
            # Steps with work and the tokens they scheduled: the same forward seconds cut into fewer, longer
            # steps (as the engine did on `qa`) make a slower token than the simulator's.
            "iterations": x.get("iterations"), "scheduled_tokens": x.get("scheduled_tokens")}


def print_validation(v: Mapping[str, Any]) -> None:
    print(f"\nreplay: {'; '.join(v['replay'])}; workload check: {v['workload_check']}")
    if v.get("not_simulated"):
        print(f"not simulated (the simulator does not model them): {', '.join(v['not_simulated'])}")
    cm = v["cost_model"]
    fit = cm.get("host_fit")
    how = f"fitted on {fit['fitted_on']}" if fit else "given"
    if fit and fit.get("at_grid_edge"):
        how += ", AT THE TOP OF ITS GRID: a cost the simulator lacks, not a fit"
    print(f"cost model: decode context share {cm['decode_context_share']}, front end in/out "
          f"{', '.join(f'{x * 1000:.1f} ms' for x in cm['frontend_in_out_s'])}, host time per held request per step "
          f"{cm['host_per_request_s'] * 1e6:.0f} us ({how}), step overhead {cm['step_overhead_s'] * 1e3:.2f} ms and step time "
          f"x {cm.get('speed_at_reference', 1.0):.3f} (calibrated on the bench's unloaded reference), attention {cm['attention_pair_s'] or 0:.3g} s/pair, "
          f"copies hide behind {cm.get('window_share', 1.0):.2f} of a step ({cm.get('window_share_source', 'given')}), "
          f"{cm.get('chunk_step_s', 0.0) * 1e3:.2f} ms per prefilled request ({cm.get('chunk_step_source', 'not in the profile: 0')})")
    if "machine_speed" in cm:  # validations made before the option lack it
        print(f"machine speed: {cm['machine_speed']}")
    if v.get("speed_check"):  # validations made before the check lack it
        print(format_speed_check(v["speed_check"]))
    first = v.get("one_speed_replay")
    if first:  # a damped replay: the one-speed replay its power was fitted on
        within, knees = first["summary"]["within_15pct"], first["knees"]
        print(f"the one-speed replay the damping was fitted on: {len(within)} of {len(knees)} knees within 15% "
              f"(host time {first['host_per_request_s'] * 1e6:.0f} us); " + format_speed_check(first["speed_check"]))
    sp = cm.get("decode_spill")
    if sp:
        print(f"cache cliff: a step reading more than {sp['threshold_bytes'] / 2**20:.1f} MiB of KV costs "
              f"{sp['jump_s'] * 1000:.1f} ms more ({sp['source']})")
    slo = v["slo"]
    print(f"SLO: measured {_ms(slo['measured_s'])} (unloaded {_ms(slo['measured_unloaded_s'])}), simulated "
          f"{_ms(slo['simulated_s'])} (unloaded {_ms(slo['simulated_unloaded_s'])}); judged at the measured one")
    print(f"{'policy':18s} {'budget':>6s} {'measured':>9s} {'simulated':>9s} {'rel err':>8s}   {'sim @ sim SLO':>13s} {'rel err':>8s}"
          f"   {'without host time':>18s}" + (f"   {'without cache cliff':>19s}" if v.get("without_decode_spill") else ""))
    without = v.get("without_host_overhead") or {}
    no_spill = v.get("without_decode_spill") or {}
    for lab, p in v["policies"].items():
        e, e2 = p["rel_error"], p["rel_error_at_simulated_slo"]
        line = (f"{lab:18s} {p['token_budget']:6d} {p['measured'] or 0:9.2f} {p['simulated']:9.2f} {_pc(e):>8s}   "
                f"{p['simulated_at_simulated_slo']:13.2f} {_pc(e2):>8s}")
        for alt in (without, no_spill) if no_spill else (without,):
            if lab in alt:
                line += f"   {alt[lab]['simulated']:9.2f} {_pc(alt[lab]['rel_error']):>9s}"
            else:
                line += " " * 22
        print(line.rstrip())
    same = [(lab, p) for lab, p in v["policies"].items() if p.get("simulated_same_rates") is not None]
    if same:
        print("simulated knee on the engine's own rates only (a failure at a rate the engine did not try for that seed "
              "cannot lower it): " + ", ".join(f"{lab} {p['simulated_same_rates']:.2f} ({_pc(p['rel_error_same_rates'])})"
                                               for lab, p in same))
    print("SLO verdicts per measured run (simulated vs measured), the rules the failing side failed where they differ, "
          "and the median log(simulated / measured) of new requests' and resumed turns' p99 wait:")
    for lab, p in v["policies"].items():
        vd = p.get("verdicts")
        if not vd or not vd["runs"]:
            continue
        differ = "; ".join(f"{who} fails {', '.join(f'{k} {n}' for k, n in sorted(vd[side].items()))}"
                           for side, who in (("simulated_only", "only the simulator"), ("measured_only", "only the engine"))
                           if vd[side])
        tails = ", ".join(f"{name} {x:+.2f}" for name, x in (("ttft", vd["median_log_ttft_p99"]), ("resume", vd["median_log_resume_p99"]))
                          if x is not None)
        print(f"  {lab:18s} {vd['agree']}/{vd['runs']} agree" + (f" ({differ})" if differ else "") + (f"; tails {tails}" if tails else ""))


def _pc(e: float | None) -> str:
    return "-" if e is None else f"{e * 100:+.1f}%"


def _ms(x: Any) -> str:
    if isinstance(x, list):
        return ", ".join(_ms(y) for y in x)
    return "-" if x is None else f"{float(x) * 1000:.2f} ms"


def like_bench(bench_path: str | Path, labels: Sequence[str], rates: Sequence[float], seeds: Sequence[int],
               duration_s: float | None = None, verbose: bool = True, link_gbps: float | None = None,
               **cost: Any) -> dict[str, Any]:
    """A sweep in a benchmark run's setting (its engine setting, profile, workload and duration) judged by
    its measured SLO (median normalized latency and new requests' p99 time to first token), at rates and
    seeds of one's choosing: where a policy is explored before the engine confirms it. The cost constants
    are fitted on the bench as `validate` fits them (`cost`: `fit_cost`'s options), and recorded.
    `link_gbps`: the host link the swaps and the host tier go over, in place of the bench's (a what-if:
    the costs stay fitted on the bench as it ran)."""
    bj = read_bench(bench_path)
    for lab in labels:
        variant(lab)
    if link_gbps is not None and not (link_gbps > 0 and math.isfinite(link_gbps)):
        raise ValueError(f"link {link_gbps} GB/s: a link is a positive, finite rate")  # before the fits' minutes
    fitted = fit_cost(bj, **cost)
    sb = sim_bench(bj, host_per_request_s=fitted.host_per_request_s, **fitted.kw)
    if link_gbps is not None:
        sb.setting = dataclasses.replace(sb.setting, swap_link_gbps=link_gbps)
    sharegpt = sb.setting.model if bj["workload"] in ("mixed", "chatbot") and ShareGPT.available() else None
    slo = float(bj["slo"]["slo_normalized_latency_s"])
    ttft_slo = bj["slo"].get("ttft_p99_bound_s")
    resume_slo = resume_bound(bj["slo"])  # by today's rules, as `infercept bench --report --rejudge` judges
    res = sweep(sb, list(labels), list(rates), float(duration_s or bj["duration_s"]), list(seeds), workload=bj["workload"],
                slo_factor=float(bj["slo"]["slo_factor"]), slo_s=slo, ttft_slo_s=ttft_slo, resume_slo_s=resume_slo, sharegpt_model=sharegpt,
                verbose=verbose)
    per_rate = {lab: {str(seed): {f"{float(r['rate']):g}": {
        "median_normalized_latency_s": r["normalized_latency_s"]["median"],
        "ttft_p99_s": (r.get("ttft_s") or {}).get("p99"),
        "resume_p99_s": (r.get("resume_s") or {}).get("p99"),
        "waste_share_of_capacity_time": r.get("waste_share_of_capacity_time")} for r in runs.values()}
        for seed, runs in res["results"][lab].items()} for lab in labels}
    return {"bench": str(bench_path), "bench_sha256": hashlib.sha256(Path(bench_path).read_bytes()).hexdigest(),
            "setting": bj["setting"], "link_gbps": sb.setting.swap_link_gbps, "workload": bj["workload"], "slo": {"slo_normalized_latency_s": slo, "ttft_p99_bound_s": ttft_slo,
                                                                      "resume_p99_bound_s": resume_slo},
            "cost_model": {"host_per_request_s": fitted.host_per_request_s, "step_overhead_s": fitted.kw["step_overhead_s"],
                           **fitted.fits()},
            "rates": list(rates), "seeds": list(seeds), "duration_s": float(duration_s or bj["duration_s"]),
            "headline": res["headline"], "per_rate": per_rate}


def print_like(v: Mapping[str, Any]) -> None:
    slo = v["slo"]
    print(f"judged at the bench's SLO: median normalized latency <= {slo['slo_normalized_latency_s'] * 1000:.2f} ms, "
          f"new requests' p99 time to first token <= {slo['ttft_p99_bound_s']} s, "
          f"resumed turns' p99 wait for their next token <= {slo.get('resume_p99_bound_s')} s")
    for lab, h in v["headline"].items():
        by_seed = ", ".join(f"{x:g}" for x in h["max_rate_by_seed"].values())
        print(f"{lab:18s} max rate {h['max_rate_at_slo']:.2f}{'+' if h.get('censored') else ' '} (per seed {by_seed})")
        for seed, runs in v["per_rate"][lab].items():
            cells = "  ".join(f"{r}: {x['median_normalized_latency_s'] * 1000:.1f} ms/{x['ttft_p99_s']:.2f} s"
                              for r, x in runs.items() if x["median_normalized_latency_s"] is not None and x["ttft_p99_s"] is not None)
            print(f"    seed {seed}  {cells}")
