"""`infercept simulate --validate BENCH_JSON`: replay a benchmark run's setting in the simulator and
compare each policy's max rate at the SLO with what the engine measured.

Read from the bench.json (defensively: the fair benchmark of issue 12 adds fields): the workload, its
rates, duration and seeds, the engine setting (KV size, block size, slots, link, time scale, ...), the
profile it ran with, each policy's token budget (absent: vLLM's default; the chunking policies cap
their own steps at S), the SLO factor and which engine calibrated the SLO (the first policy's in the
first runner, `unlimited-kv` in the fair one)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.metrics import max_rate_at_slo
from benchmarks.replay import REPO
from benchmarks.sim.report import points
from benchmarks.sim.setup import SimBench, make_setting, profile_from_bench, variant
from benchmarks.sim.sweep import sweep
from engine_adapter.policy.profile import Profile

DEFAULT_PROFILE = REPO / "configs" / "profiles" / "tiny-cpu-bench.json"
_NOT_SETTING = ("profile", "priors_path", "kv_capacity_tokens", "kv_capacity_contexts_at_mean", "sharegpt_prompts")


def bench_profile(setting: Mapping[str, Any]) -> Profile:
    """The profile the bench recorded; the committed file with the same grid when there is one (it
    also has the measured copy bandwidths, which the summary leaves out)."""
    rebuilt = profile_from_bench(setting, fallback=DEFAULT_PROFILE)
    for path in sorted((REPO / "configs" / "profiles").glob("*.json")):
        p = Profile.load(path)
        if p.fwd_tokens == rebuilt.fwd_tokens and all(abs(a - b) < 1e-5 for a, b in zip(p.fwd_seconds, rebuilt.fwd_seconds)) \
                and p.kv_bytes_per_token == rebuilt.kv_bytes_per_token:
            return p
    return rebuilt


def measured_runs(bj: Mapping[str, Any], label: str, seed: int) -> dict[str, Any]:
    """A policy's per-rate results for one seed, whether results are keyed by rate (one seed) or by
    seed and then rate."""
    runs = (bj.get("results") or {}).get(label) or {}
    if str(seed) in runs and isinstance(runs[str(seed)], Mapping) and "normalized_latency_s" not in runs[str(seed)]:
        return dict(runs[str(seed)])
    if "seeds" in runs and isinstance(runs["seeds"], Mapping):
        return dict(runs["seeds"].get(str(seed)) or {})
    return {k: v for k, v in runs.items() if isinstance(v, Mapping) and "normalized_latency_s" in v}


def _slo(bj: Mapping[str, Any], i: int) -> float:
    v = (bj.get("slo") or {}).get("slo_normalized_latency_s")
    return float(v[i] if isinstance(v, list) else v)


HOST_GRID_S = tuple(i * 10e-6 for i in range(13))  # 0 to 120 us per held request per step


def validate(bench_path: str | Path, *, policies: list[str] | None = None, context_share: float | None = None,
             frontend_s: tuple[float, float] | None = None, host_per_request_s: float | None = None,
             fit_on: str | None = "discard", verbose: bool = True) -> dict[str, Any]:
    """Replay and compare. The host time per held request per step (see `SimEngine`) is the one
    constant the profile cannot give (it is the bench machine's, under the bench's load): unless
    given, it is fitted on `fit_on` alone (the grid value whose max rate at the SLO is closest to the
    measured one), and every other policy is then a prediction. The report also gives the errors
    without it."""
    fit = None
    if host_per_request_s is None:
        if fit_on is None:
            host_per_request_s = 0.0
        else:
            fit = _fit_host(bench_path, fit_on, context_share, frontend_s)
            host_per_request_s = fit["host_per_request_s"]
    v = _validate(bench_path, policies, context_share, frontend_s, host_per_request_s, verbose)
    v["cost_model"]["host_fit"] = fit
    if host_per_request_s:
        without = _validate(bench_path, policies, context_share, frontend_s, 0.0, False)
        v["without_host_overhead"] = {lab: {k: p[k] for k in ("simulated", "rel_error")} for lab, p in without["policies"].items()}
    return v


def _fit_host(bench_path: str | Path, label: str, context_share: float | None,
              frontend_s: tuple[float, float] | None) -> dict[str, Any]:
    trials = []
    for c in HOST_GRID_S:
        p = _validate(bench_path, [label], context_share, frontend_s, c, False)["policies"][label]
        trials.append({"host_per_request_s": c, "simulated": p["simulated"], "rel_error": p["rel_error"]})
    best = min(trials, key=lambda t: (abs(t["rel_error"]) if t["rel_error"] is not None else 1e9, t["host_per_request_s"]))
    return {"fitted_on": label, "host_per_request_s": best["host_per_request_s"], "trials": trials}


def _validate(bench_path: str | Path, policies: list[str] | None, context_share: float | None,
              frontend_s: tuple[float, float] | None, host_per_request_s: float, verbose: bool) -> dict[str, Any]:
    bj = json.loads(Path(bench_path).read_text())
    st = dict(bj["setting"])
    setting = make_setting(**{k: v for k, v in st.items() if k not in _NOT_SETTING})
    labels = [lab for lab in (policies or bj["policies"])]
    for lab in labels:
        variant(lab)  # unknown labels fail here, before any work
    seeds = [int(x) for x in (bj.get("seeds") or [bj.get("seed", 0)])]
    fair = "seeds" in bj or "unlimited-kv" in bj.get("policies", [])
    calibrate = "unlimited-kv" if fair else bj["policies"][0]
    bound = "unlimited-kv" if "unlimited-kv" in labels else "no-intercept-limit"
    sharegpt_model = setting.model if (st.get("sharegpt_prompts") or 0) > 0 else None
    sb = SimBench(setting, bench_profile(st), token_budget=dict(bj.get("token_budget") or {}), context_share=context_share,
                  frontend_s=frontend_s, host_per_request_s=host_per_request_s)
    res = sweep(sb, labels, [float(r) for r in bj["rates"]], float(bj["duration_s"]), seeds, workload=bj["workload"],
                slo_factor=float(bj["slo"]["slo_factor"]), calibrate_label=calibrate, sharegpt_model=sharegpt_model,
                bound=bound, verbose=verbose)
    per_seed = [res["results"]] if len(seeds) == 1 else [res["results"][str(s)] for s in seeds]
    out_pol: dict[str, Any] = {}
    per_rate: dict[str, Any] = {}
    for lab in labels:
        measured = (bj.get("headline") or {}).get(lab, {}).get("max_rate_at_slo")
        sim = res["headline"][lab]["max_rate_at_slo"]
        # The simulator's curve against the SLO the engine measured (separates the latency model
        # from the SLO calibration).
        at_measured = statistics.median(max_rate_at_slo(points(per_seed[i][lab]), _slo(bj, i))[0] for i in range(len(seeds)))
        out_pol[lab] = {
            "measured": measured, "simulated": sim,
            "rel_error": (sim - measured) / measured if measured else None,
            "simulated_at_measured_slo": at_measured,
            "rel_error_at_measured_slo": (at_measured - measured) / measured if measured else None,
        }
        per_rate[lab] = {}
        for i, seed in enumerate(seeds):
            meas = measured_runs(bj, lab, seed)
            for rate, x in per_seed[i][lab].items():
                m = meas.get(rate) or {}
                key = rate if len(seeds) == 1 else f"{seed}/{rate}"
                per_rate[lab][key] = {
                    "measured": _brief(m), "simulated": _brief(x),
                }
    errs = [abs(p["rel_error"]) for p in out_pol.values() if p["rel_error"] is not None]
    return {
        "bench": str(bench_path), "bench_commit": bj.get("commit"), "command": bj.get("command"),
        "replay": res["replay"], "profile": sb.profile.source,
        "cost_model": {"decode_context_share": getattr(sb.engine(labels[0]).cost, "context_share", None),
                       "frontend_in_out_s": list(sb.frontend()), "host_per_request_s": sb.host_per_request_s},
        "seeds": seeds, "rates": res["rates"], "token_budget": res["token_budget"],
        "slo": {"measured_s": (bj.get("slo") or {}).get("slo_normalized_latency_s"),
                "measured_unloaded_s": (bj.get("slo") or {}).get("unloaded_normalized_latency_s"),
                "simulated_s": res["slo"]["slo_normalized_latency_s"],
                "simulated_unloaded_s": res["slo"]["unloaded_normalized_latency_s"], "calibrated_on": calibrate},
        "policies": out_pol,
        "summary": {"max_abs_rel_error": max(errs) if errs else None,
                    "median_abs_rel_error": statistics.median(errs) if errs else None,
                    "within_15pct": sorted(lab for lab, p in out_pol.items() if p["rel_error"] is not None and abs(p["rel_error"]) <= 0.15),
                    "outside_15pct": sorted(lab for lab, p in out_pol.items() if p["rel_error"] is not None and abs(p["rel_error"]) > 0.15)},
        "per_rate": per_rate,
        "simulated_headline": res["headline"],
        "sim_wall_s": res["sim_wall_s"],
    }


def _brief(x: Mapping[str, Any]) -> dict[str, Any]:
    nl = x.get("normalized_latency_s") or {}
    return {"median_normalized_latency_s": nl.get("median"), "p90_normalized_latency_s": nl.get("p90"),
            "completed": x.get("completed"), "requests": x.get("requests"), "forward_s": x.get("forward_s"),
            "wall_s": x.get("wall_s"), "recompute_share_of_forward": x.get("recompute_share_of_forward"),
            "waste_share_of_capacity_time": x.get("waste_share_of_capacity_time"), "swap_stall_s": x.get("swap_stall_s")}


def print_validation(v: Mapping[str, Any]) -> None:
    print(f"\nreplay: {'; '.join(v['replay'])}")
    cm = v["cost_model"]
    fit = cm.get("host_fit")
    how = f"fitted on {fit['fitted_on']}" if fit else "given"
    print(f"cost model: decode context share {cm['decode_context_share']}, front end in/out "
          f"{', '.join(f'{x * 1000:.1f} ms' for x in cm['frontend_in_out_s'])}, host time per held request per step "
          f"{cm['host_per_request_s'] * 1e6:.0f} us ({how})")
    slo = v["slo"]
    ms = slo["measured_s"]
    print(f"SLO: measured {_ms(ms)} (unloaded {_ms(slo['measured_unloaded_s'])}), simulated "
          f"{', '.join(_ms(x) for x in slo['simulated_s'])} (unloaded {', '.join(_ms(x) for x in slo['simulated_unloaded_s'])})")
    print(f"{'policy':20s} {'measured':>9s} {'simulated':>9s} {'rel err':>8s}   {'sim @ measured SLO':>18s} {'rel err':>8s}")
    without = v.get("without_host_overhead") or {}
    if without:
        print(f"{'':62s}{'without host overhead':>22s}")
    for lab, p in v["policies"].items():
        e, e2 = p["rel_error"], p["rel_error_at_measured_slo"]
        line = (f"{lab:20s} {p['measured'] or 0:9.2f} {p['simulated']:9.2f} {'-' if e is None else f'{e * 100:+.1f}%':>8s}   "
                f"{p['simulated_at_measured_slo']:18.2f} {'-' if e2 is None else f'{e2 * 100:+.1f}%':>8s}")
        if lab in without:
            w = without[lab]
            we = "-" if w["rel_error"] is None else f"{w['rel_error'] * 100:+.1f}%"
            line += f"   {w['simulated']:9.2f} {we:>8s}"
        print(line)


def _ms(x: Any) -> str:
    if isinstance(x, list):
        return ", ".join(_ms(y) for y in x)
    return "-" if x is None else f"{float(x) * 1000:.2f} ms"
