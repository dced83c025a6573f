"""`infercept bench --quick` end to end (real engines, the tiny model): the output must be complete
and well-formed. No timing assertions: these machines are noisy. The same per-run and headline checks run
on the simulator in seconds (tests/sim/test_modes.py); this is the one real quick bench."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.bench.shape import check_headline, check_run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_bench_writes_complete_results(tmp_path: Path, uses_engine: None) -> None:
    exe = Path(sys.executable).parent / "infercept"
    # --host-gib: the host tier's size, a knob of the run like the KV's (half the default here)
    proc = subprocess.run([str(exe), "bench", "--quick", "--host-gib", "0.5", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max rate@SLO" in proc.stdout
    d = json.loads((tmp_path / "bench.json").read_text())
    policies = ["discard", "vllm-apc", "infercept", "unlimited-kv"]
    assert d["policies"] == policies and d["workload"] == "mixed" and d["seeds"] == [1]
    for key in ("command", "commit", "machine", "setting", "slo", "headline", "results", "requests_per_rate", "engines",
                "token_budget", "baselines_tuned", "bound_violations", "order", "priors", "steady_state", "refine"):
        assert key in d, key
    assert d["command"].startswith("infercept bench --quick")
    # Read from the points (a resumed run measured some of them in an earlier process, maybe on another host).
    assert len(d["machines"]) == 1 and d["machines"][0]["host"] and d["points_finished"]["first"] <= d["points_finished"]["last"]
    assert all(r["engine"]["policy"] and r["machine"] == d["machines"][0]
               for by_seed in d["results"].values() for by_rate in by_seed.values() for r in by_rate.values())
    assert d["setting"]["model"] == "tiny" and d["setting"]["kv_tokens"] > 0
    assert d["setting"]["swap_space_gib"] == 0.5 and d["engines"]["infercept"]["swap_space_gib"] == 0.5
    # One token budget for all (the profile's S), and the bound's KV holds every context at once.
    budget = d["setting"]["profile_data"]["saturation_tokens"]
    assert d["token_budget"] == {p: budget for p in policies} and d["baselines_tuned"] is False
    assert d["engines"]["unlimited-kv"]["kv_blocks"] * 32 >= d["setting"]["unlimited_kv_tokens"] > d["setting"]["kv_tokens"]
    # ... and a running slot for every session of the busiest workload (the others keep the setting's).
    assert d["setting"]["unlimited_kv_slots"] == max(d["requests_per_rate"].values())
    assert d["engines"]["unlimited-kv"]["max_num_seqs"] == max(d["setting"]["max_num_seqs"], d["setting"]["unlimited_kv_slots"])
    assert d["engines"]["discard"]["max_num_seqs"] == d["setting"]["max_num_seqs"]
    assert d["slo"]["reference"].startswith("unlimited-kv engine")
    # Measured before the first policy and after the last; the SLO rests on the faster of the two.
    refs = d["slo"]["reference_runs"]
    assert [r["when"] for r in refs] == ["before", "after"] and all(r["requests"] > 0 for r in refs)
    assert d["slo"]["unloaded_normalized_latency_s"] == min(r["median_s"] for r in refs)
    assert d["slo"]["slo_normalized_latency_s"] == d["slo"]["slo_factor"] * d["slo"]["unloaded_normalized_latency_s"]
    # The other rules: new requests' p99 time to first token within 10x its unloaded p90, and resumed
    # turns' p99 wait for their next token within the same bound.
    best = min(refs, key=lambda r: r["median_s"])
    assert d["slo"]["ttft_p99_bound_s"] == pytest.approx(10 * best["ttft_p90_s"]) and best["ttft_p90_s"] > 0
    assert d["slo"]["resume_p99_bound_s"] == d["slo"]["ttft_p99_bound_s"]
    # No oracle: every estimator starts from the generic priors, written where the engines read them.
    assert d["priors"]["run"] == "generic" and d["setting"]["priors"] == "generic"
    generic = yaml.safe_load((tmp_path / "priors-generic.yaml").read_text())["types"]
    assert {tuple(t["duration_s"]) for t in generic.values()} == {(0.02, 0.02)}  # 1 s for every type, x time scale 0.02
    # One round (no refinement in --quick), its policies in a shuffled order that is recorded.
    (rnd,) = d["order"]["1"]
    assert sorted(rnd) == sorted(policies)
    for p in policies:
        check_headline(d["headline"][p], ["discard", "vllm-apc", "ttl", "bound"])
        (run,) = d["results"][p]["1"].values()
        check_run(run, d["setting"]["kv_tokens"])
        assert run["kv_integrity_after"]["free"] == run["kv_integrity_after"]["total"]  # nothing leaked
        # The machine check: one request alone on the idle engine before and after the point.
        assert all(0 < run["machine_check"][k] < 1 for k in ("before_s_per_token", "after_s_per_token")), run["machine_check"]
        # The steps' time outside the forward pass, by part: each a time the engine spent (the simulator has none).
        assert set(run["step_parts_s"]) == {"ours", "vllm_schedule", "vllm_update", "between", "empty"}
        assert all(v >= 0 for v in run["step_parts_s"].values()) and run["step_parts_s"]["vllm_schedule"] > 0
    assert all(0 < r["probe_s_per_token"] < 1 for r in refs)
    assert d["machine_check"]["points"] == len(policies) and d["machine_check"]["median_s_per_token"] > 0
    for png in d["plots"]:
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert d["plots"] == ["fig2_latency_vs_rate.png"]  # the ablation figure needs --ablation
    # Every point was saved as it finished: the same command again measures nothing and says so.
    again = subprocess.run([str(exe), "bench", "--quick", "--host-gib", "0.5", "--out", str(tmp_path)], capture_output=True,
                           text=True, timeout=300, cwd=REPO, env={**os.environ})
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming {tmp_path}: 6 points already measured" in again.stderr  # 2 references + 4 policies
    d2 = json.loads((tmp_path / "bench.json").read_text())
    assert d2["headline"] == d["headline"] and d2["resumed_points"] == 6
    # A different plan in the same folder is refused, naming what differs.
    other = subprocess.run([str(exe), "bench", "--quick", "--rates", "5", "--out", str(tmp_path)], capture_output=True,
                           text=True, timeout=300, cwd=REPO, env={**os.environ})
    assert other.returncode == 2 and "another plan (differs in rates" in other.stderr
