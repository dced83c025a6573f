"""`infercept bench --quick` end to end (real engines, the tiny model): the output must be complete
and well-formed. No timing assertions: these machines are noisy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_bench_writes_complete_results(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "infercept"
    proc = subprocess.run([str(exe), "bench", "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max rate@SLO" in proc.stdout
    d = json.loads((tmp_path / "bench.json").read_text())
    policies = ["discard", "vllm-apc", "infercept", "unlimited-kv"]
    assert d["policies"] == policies and d["workload"] == "mixed" and d["seeds"] == [1]
    for key in ("command", "commit", "machine", "setting", "slo", "headline", "results", "requests_per_rate", "engines",
                "token_budget", "baselines_tuned", "bound_violations"):
        assert key in d, key
    assert d["command"].startswith("infercept bench --quick")
    assert d["setting"]["model"] == "tiny" and d["setting"]["kv_tokens"] > 0
    # One token budget for all (the profile's S), and the bound's KV holds every context at once.
    budget = d["setting"]["profile_data"]["saturation_tokens"]
    assert d["token_budget"] == {p: budget for p in policies} and d["baselines_tuned"] is False
    assert d["engines"]["unlimited-kv"]["kv_blocks"] * 32 >= d["setting"]["unlimited_kv_tokens"] > d["setting"]["kv_tokens"]
    assert d["slo"]["reference"].startswith("unlimited-kv engine")
    # Measured before the first policy and after the last; the SLO rests on the faster of the two.
    refs = d["slo"]["reference_runs"]
    assert [r["when"] for r in refs] == ["before", "after"] and all(r["requests"] > 0 for r in refs)
    assert d["slo"]["unloaded_normalized_latency_s"] == min(r["median_s"] for r in refs)
    assert d["slo"]["slo_normalized_latency_s"] == d["slo"]["slo_factor"] * d["slo"]["unloaded_normalized_latency_s"]
    for p in policies:
        h = d["headline"][p]
        assert set(h) >= {"max_rate_at_slo", "max_rate_min", "max_rate_max", "ratio_vs_discard", "ratio_vs_vllm-apc",
                          "ratio_vs_ttl", "ratio_vs_bound", "waste_share_at_slo_rate", "jct_mean_s"}
        (run,) = d["results"][p]["1"].values()
        # Every request is accounted for exactly once: finished, failed, or still running at the cutoff.
        assert run["requests"] > 0 and run["completed"] + run["timed_out"] + run["failed"] == run["requests"]
        assert run["failed"] == 0, run["errors"]
        assert run["kv_integrity_after"]["free"] == run["kv_integrity_after"]["total"]  # nothing leaked
        for k in ("normalized_latency_s", "jct_s", "ttft_s", "throughput_rps", "waste", "waste_share_of_capacity_time",
                  "recompute_share_of_forward", "swap_stall_s"):
            assert k in run
        assert run["capacity_tokens"] == d["setting"]["kv_tokens"]  # one denominator for every policy
        assert set(run["waste"]) == {"preserved_idle", "recompute", "swap_stall"}
        # Every turn a request ran is timed: at least one per request that got its first token.
        tt = run["turn_timing"]
        assert tt["turns"] >= run["completed"] > 0 and tt["decode_per_token_s"]["median"] > 0
        assert tt["new_first_token_s"]["median"] > 0 and tt["resume_first_token_s"]["median"] is not None
    for png in d["plots"]:
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert d["plots"] == ["fig2_latency_vs_rate.png"]  # the ablation figure needs --ablation
