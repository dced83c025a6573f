"""The simulator's modes end to end: deterministic for a seed, the validation report against a bench.json,
the closed-loop capacity search, and `infercept simulate --quick` (what CI runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.sim.capacity import ClosedLoop, request_pool, sessions_at_slo
from benchmarks.sim.paper import PaperRun
from benchmarks.sim.sweep import sweep
from benchmarks.sim.validate import validate
from tests.sim.helpers import toy_bench

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
        res = sweep(run.bench(tmp_path / sub), list(run.policies), [4.0], 25.0, [7], calibrate_label="ttl", verbose=False)
        return json.loads(json.dumps(_strip(res), default=str))

    a, b = once("a"), once("b")
    assert a == b
    assert a["results"]["swap"]["4"]["swapped_out_tokens"] > 0 and a["results"]["infercept"]["4"]["intercepts"] > 0
    assert a["headline"]["infercept"]["max_rate_at_slo"] > 0
    other = PaperRun(rates=(4.0,), duration_s=25.0, drain_s=40.0, policies=("ttl",))
    c = sweep(other.bench(tmp_path / "c"), ["ttl"], [4.0], 25.0, [8], calibrate_label="ttl", verbose=False)
    assert c["results"]["ttl"]["4"]["normalized_latency_s"] != a["results"]["ttl"]["4"]["normalized_latency_s"]


def fake_bench(path: Path) -> Path:
    """A bench.json in the committed runner's format, with made-up measurements."""
    runs = {p: {r: {"rate": float(r), "normalized_latency_s": {"median": m, "p90": 2 * m}, "completed": 5, "requests": 5}
                for r, m in zip(("2", "4"), ms)} for p, ms in (("discard", (0.01, 0.05)), ("infercept", (0.008, 0.02)))}
    bj = {
        "command": "infercept bench --quick", "commit": "x", "workload": "qa", "rates": [2.0, 4.0], "duration_s": 4.0, "seed": 3,
        "policies": ["discard", "infercept"],
        "setting": {"model": "tiny", "block_size": 32, "kv_tokens": 8192, "max_model_len": 4096, "max_num_seqs": 16,
                    "swap_space_gib": 0.1, "swap_link_gbps": 0.25, "time_scale": 0.1, "drain_s": 20.0, "sharegpt_prompts": 0,
                    "profile": {"t_fwd_ms": {"64": 2.0, "512": 4.0, "2048": 40.0}, "saturation_tokens": 512,
                                "kv_bytes_per_token": 1024, "decode": {"batch1_ctx512_s": 0.004, "batch8_ctx512_s": 0.006}}},
        "slo": {"slo_factor": 5.0, "slo_normalized_latency_s": 0.025, "unloaded_normalized_latency_s": 0.005},
        "headline": {"discard": {"max_rate_at_slo": 3.0}, "infercept": {"max_rate_at_slo": 4.0}},
        "results": runs,
    }
    path.write_text(json.dumps(bj))
    return path


def test_validation_replays_the_bench_setting_and_reports_relative_errors(tmp_path: Path) -> None:
    v = validate(fake_bench(tmp_path / "bench.json"), verbose=False)
    assert set(v["policies"]) == {"discard", "infercept"} and v["seeds"] == [3] and v["rates"] == [2.0, 4.0]
    for lab, p in v["policies"].items():
        assert p["rel_error"] == pytest.approx((p["simulated"] - p["measured"]) / p["measured"])
        assert set(v["per_rate"][lab]) == {"2", "4"}
        assert v["per_rate"][lab]["2"]["measured"]["median_normalized_latency_s"] in (0.01, 0.008)
    assert v["slo"]["calibrated_on"] == "discard"  # the first runner calibrated on its first policy
    assert v["replay"] == ["synthetic prompts (as the benchmark without ShareGPT)"]
    assert v["token_budget"] == {"discard": 2048, "infercept": 2048}
    # The host time per held request per step is fitted on discard alone, from a grid that includes 0.
    fit = v["cost_model"]["host_fit"]
    assert fit["fitted_on"] == "discard" and fit["trials"][0]["host_per_request_s"] == 0.0
    assert v["cost_model"]["host_per_request_s"] == fit["host_per_request_s"]
    assert abs(v["policies"]["discard"]["rel_error"]) == min(abs(t["rel_error"]) for t in fit["trials"])


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


def test_quick_runs_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.sim.cli import build_parser, main

    out = tmp_path / "quick.json"
    assert main(build_parser().parse_args(["--quick", "--out", str(out)])) == 0
    res = json.loads(out.read_text())
    assert set(res["headline"]) == {"discard", "vllm-apc", "infercept", "unlimited-kv"}
    assert res["headline"]["infercept"]["max_rate_at_slo"] >= res["headline"]["discard"]["max_rate_at_slo"]
    assert "max rate@SLO" in capsys.readouterr().out
