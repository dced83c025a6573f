"""The simulated engine on constructed cases, with exact expected numbers: one request alone takes the
profile's step times; chunked prefill; each policy's fate of a paused context (discard recomputes all of
it, preserve with room never recomputes, swap moves it within the per-step budgets); vLLM's own
preemption; and the intercept core's integrity check after every step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from infercept.benchmarks.replay import VARIANTS
from infercept.benchmarks.sim.engine import SimEngine
from infercept.benchmarks.sim.run import outcome, run_rate
from infercept.benchmarks.sim.setup import SIMULATED_LABELS
from engine_adapter.intercept.records import Fate
from tests.sim.helpers import STEP_S, request, toy_bench, toy_profile


def run_alone(tmp_path: Path, policy: str, **kw: object) -> tuple[SimEngine, list]:
    eng = toy_bench(tmp_path, **kw).engine(policy, check_every=1)  # type: ignore[arg-type]
    r = request("a", 100, [(3, 1.0, 10), (2, None, 0)])
    eng.submit(r)
    eng.run()
    return eng, [r]


@pytest.mark.parametrize("policy", ["preserve", "discard", "vllm-apc", "ttl", "infercept"])
def test_a_single_request_takes_exactly_the_profile_step_times(tmp_path: Path, policy: str) -> None:
    eng, (r,) = run_alone(tmp_path, policy)
    # Turn 1: the prompt in one step (it samples the first token), two decode steps: paused at 30 ms.
    # The call lasts 1 s; the resume (KEEP: the returned tokens and the last sampled one; or the whole
    # context again when it was discarded, within the budget) is one step, then one decode step.
    assert r.output_tokens == 5 and r.call_s == 1.0
    assert r.first_token_s == pytest.approx(STEP_S)
    assert r.end_s == pytest.approx(5 * STEP_S + 1.0)
    assert (r.end_s - r.arrival_s - r.call_s) / r.output_tokens == pytest.approx(STEP_S)  # normalized latency
    assert eng.steps == 5
    rec = eng.core.ledger.records[0]
    assert rec.context_tokens == 102 and rec.call_duration_s == pytest.approx(1.0)
    # The turns as the benchmark's replay times them: the prompt's, sent at arrival; the resume's, sent
    # when the call ends (30 ms + 1 s), its first token one step later: the resume latency.
    turns = outcome(r, 0, 0.0).turns
    assert [(t.index, t.in_tokens, t.out_tokens) for t in turns] == [(0, 100, 3), (1, 10, 2)]
    assert turns[0].sent_s == 0.0 and turns[0].first_s == pytest.approx(STEP_S) and turns[0].total_s == pytest.approx(3 * STEP_S)
    assert turns[1].sent_s == pytest.approx(3 * STEP_S + 1.0)
    assert turns[1].first_s == pytest.approx(STEP_S) and turns[1].total_s == pytest.approx(2 * STEP_S)


def test_chunked_prefill_within_the_token_budget(tmp_path: Path) -> None:
    eng = toy_bench(tmp_path, budget=128).engine("preserve")
    r = request("a", 300, [(2, None, 0)])
    eng.submit(r)
    eng.run()
    assert eng.steps == 3 + 1  # 128 + 128 + 44 prompt tokens (the last chunk samples), then one decode
    assert r.end_s == pytest.approx(4 * STEP_S)


def test_infercept_caps_every_step_at_the_saturation_point(tmp_path: Path) -> None:
    eng = toy_bench(tmp_path, profile=toy_profile(saturation=64)).engine("infercept")
    r = request("a", 100, [(2, None, 0)])
    eng.submit(r)
    eng.run()
    assert eng.steps == 2 + 1 and r.first_token_s == pytest.approx(2 * STEP_S)  # 64 + 36 prompt tokens, one decode


def test_discard_recomputes_every_paused_context_and_preserve_with_room_never_does(tmp_path: Path) -> None:
    reqs = lambda: [request(f"r{i}", 200 + 10 * i, [(5, 0.5, 20), (5, 0.3, 20), (4, None, 0)], arrival=0.01 * i) for i in range(6)]
    totals = {}
    for policy in ("discard", "preserve"):
        eng = toy_bench(tmp_path / policy).engine(policy, check_every=1)
        for r in reqs():
            eng.submit(r)
        eng.run()
        t = eng.core.ledger.totals
        contexts = sum(rec.context_tokens for rec in eng.core.ledger.records)
        totals[policy] = (t.intercepts, t.recomputed_tokens, contexts, eng.sched.preemptions, len(eng.finished))
    intercepts, recomputed, contexts, _, done = totals["discard"]
    assert intercepts == 12 and done == 6
    # Prefix caching is off for discard: every token of every paused context is computed again.
    assert recomputed == contexts
    intercepts, recomputed, _, preemptions, done = totals["preserve"]
    assert (intercepts, recomputed, preemptions, done) == (12, 0, 0, 6)
    assert eng.core.meter.recompute_forward_s == 0.0


def test_vllm_apc_resumes_from_the_prefix_cache_while_the_blocks_survive(tmp_path: Path) -> None:
    eng = toy_bench(tmp_path).engine("vllm-apc", check_every=1)
    r = request("a", 100, [(3, 1.0, 10), (2, None, 0)])
    eng.submit(r)
    eng.run()
    rec = eng.core.ledger.records[0]
    # Context 102 tokens = 6 full blocks of 16 cached; the hit stops short of the last token anyway.
    assert (rec.tokens_prefix_hit, rec.tokens_recomputed) == (96, 6)


def test_swap_moves_each_paused_context_out_and_back_within_the_step_budgets(tmp_path: Path) -> None:
    # 100 B/token over 16 kB/s... budget N_i = T_fwd * bw / M = 10 ms * 320 kB/s / 100 B = 32 tokens.
    bench = toy_bench(tmp_path, profile=toy_profile(swap_bytes_per_s=320_000.0))
    eng = bench.engine("swap", check_every=1)
    for i in range(3):
        eng.submit(request(f"r{i}", 300, [(4, 2.0, 8), (3, None, 0)], arrival=0.001 * i))
    # The engine steps only while it has work that is not paused (vLLM's engine core sleeps otherwise),
    # and copies ride on steps: a long request keeps it stepping through the calls.
    eng.submit(request("bg", 50, [(400, None, 0)]))
    eng.run()
    core, bs = eng.core, eng.bs
    # Every block travels, each context's partly filled last one too: nothing is recomputed.
    assert any(rec.context_tokens % bs for rec in core.ledger.records)
    assert len(eng.finished) == 4 and core.ledger.totals.recomputed_tokens == 0
    assert core.ledger.totals.swapped_out == 3
    assert core.swap.stats.tokens_out == core.swap.stats.tokens_in == sum(rec.context_tokens for rec in core.ledger.records)
    assert core.swap.stats.blocks_out == core.swap.stats.blocks_in == sum(-(-rec.context_tokens // bs) for rec in core.ledger.records)
    for st in core.swap.history:
        assert st.out_moved + st.in_moved <= max(st.limit, 0) + 2 * bs
        assert st.out_moved <= max(st.out_budget // bs, 1) * bs
        assert st.in_moved <= max(st.in_budget // bs, 1) * bs
    assert eng.sched.pool.num_free() == eng.sched.pool.num_blocks
    # Copies within the budget N_i hide behind the step: they add nothing, and the core meters the stall
    # the workers measured (its own estimate, which takes a step's compute as its time less the copies',
    # would count some all the same).
    assert eng.true_stall_s == 0.0 and core.meter.swap_stall_s == 0.0


def test_the_swap_budget_learns_the_share_of_a_step_copies_hide_behind(tmp_path: Path) -> None:
    """The engine's workers report each step's forward window; the core scales N_i by its share of the
    step (`SwapPlanner.overlap`). The simulator reports `window_share` of the step as that window."""
    bench = toy_bench(tmp_path, profile=toy_profile(swap_bytes_per_s=320_000.0))
    bench.window_share = 0.25
    eng = bench.engine("swap", check_every=1)
    for i in range(3):
        eng.submit(request(f"r{i}", 300, [(4, 2.0, 8), (3, None, 0)], arrival=0.001 * i))
    eng.submit(request("bg", 50, [(400, None, 0)]))
    eng.run()
    core = eng.core
    assert core.ledger.totals.swapped_out == 3 and core.ledger.totals.recomputed_tokens == 0
    assert core.swap.overlap == pytest.approx(0.25, abs=0.02)
    # Once learned, each step's limit is a quarter of N_i (32 tokens at the whole step: test above).
    assert core.swap.history[-1].limit == int(32 * core.swap.overlap)
    # Copies beyond the window stall the step, and the core meters what the workers measured.
    assert eng.true_stall_s > 0 and core.meter.swap_stall_s == pytest.approx(eng.true_stall_s)


def test_vllm_preempts_the_newest_running_request_when_decode_runs_out_of_blocks(tmp_path: Path) -> None:
    # 8 blocks of 16 tokens: two requests of 60 tokens fit (4 blocks each), then decode needs a 5th.
    eng = toy_bench(tmp_path, kv_tokens=128, max_num_seqs=4).engine("preserve", check_every=1)
    a, b = request("a", 60, [(10, None, 0)]), request("b", 60, [(10, None, 0)], arrival=0.001)
    eng.submit(a)
    eng.submit(b)
    eng.run()
    assert eng.sched.preemptions >= 1
    assert a.end_s is not None and b.end_s is not None and a.end_s < b.end_s  # the older one is never the victim
    assert eng.sched.pool.num_free() == eng.sched.pool.num_blocks


@pytest.mark.parametrize("policy", list(SIMULATED_LABELS))
def test_every_policy_keeps_the_core_consistent_under_memory_pressure(tmp_path: Path, policy: str) -> None:
    # 40 blocks for 12 requests of ~300 tokens: paused contexts compete for memory and slots.
    bench = toy_bench(tmp_path, kv_tokens=640, max_num_seqs=6, profile=toy_profile(swap_bytes_per_s=2e6),
                      ttl_s={"default": 0.2})
    eng = bench.engine(policy, check_every=1)
    for i in range(12):
        calls = [(5 + i % 3, [0.05, 0.5, 2.0][i % 3], 16), (4, [1.0, 0.01, 0.3][i % 3], 8), (3, None, 0)]
        eng.submit(request(f"r{i}", 250 + 7 * i, calls, arrival=0.05 * i, aug_type=["math", "qa", "tts"][i % 3]))
    eng.run()
    assert len(eng.finished) == 12
    assert eng.sched.pool.num_free() == eng.sched.pool.num_blocks and eng.sched.paused_slots == 0
    assert not eng.core.entries
    assert sum(r.output_tokens for r in eng.finished) == sum(12 + i % 3 for i in range(12))


def test_the_turn_under_way_at_the_cutoff_is_reported(tmp_path: Path) -> None:
    # What the benchmark counts at the cutoff (`metrics.summarize`): the turn sent and not ended, with its
    # first token where it had one: the first turn from its arrival, a resumed one from its call's return.
    eng = toy_bench(tmp_path).engine("discard")
    r = request("a", 100, [(3, 1.0, 10), (2, None, 0)])
    eng.submit(r)
    eng.run(until=0.0)  # arrived, no step yet (a step once begun runs to its end)
    assert outcome(r, 0, 0.0).open_turn == (0, 0.0, None)
    eng.run(until=1.5 * STEP_S)  # one step: its first token
    assert outcome(r, 0, 0.0).open_turn == (0, 0.0, pytest.approx(STEP_S))
    eng.run(until=0.5)  # in the call: no turn under way
    assert outcome(r, 0, 0.0).open_turn is None
    returned = eng._events[0][0]
    assert eng.returned_by(returned - 1e-6) == {} and eng.returned_by(returned) == {"a": returned}
    # the call's output sent by the replay, not yet heard by the engine: the resumed turn is under way
    assert outcome(r, 0, 0.0, returned_s=returned).open_turn == (1, returned, None)
    eng.run(until=returned)  # its output delivered, no step begun
    assert outcome(r, 0, 0.0).open_turn == (1, pytest.approx(3 * STEP_S + 1.0), None)
    eng.run()
    assert outcome(r, 0, 0.0).open_turn is None and r.end_s is not None


def test_the_cutoff_aborts_everything_in_flight(tmp_path: Path) -> None:
    eng = toy_bench(tmp_path).engine("swap")
    for i in range(4):
        eng.submit(request(f"r{i}", 200, [(3, 5.0, 10), (3, None, 0)], arrival=0.01 * i))
    eng.run(until=1.0)
    left = eng.abort_all()
    assert len(left) == 4 and not eng.core.entries
    assert eng.sched.pool.num_free() == eng.sched.pool.num_blocks and eng.sched.unfinished() == 0
    assert math.isclose(eng.now, 1.0)


def test_chunked_discard_recomputes_a_paused_context_in_chunks_of_s(tmp_path: Path) -> None:
    # S = 64 within a budget of 4096: improved-discard recomputes the 312-token context in one step,
    # chunked-discard in ceil(312 / 64) = 5 (its prompt too: 300 tokens in 5 steps).
    ends = {}
    for policy in ("improved-discard", "chunked-discard"):
        eng = toy_bench(tmp_path / policy, profile=toy_profile(saturation=64)).engine(policy, check_every=1)
        sizes: list[int] = []
        orig = eng.sched.schedule

        def schedule(orig=orig, sizes=sizes):  # type: ignore[no-untyped-def]
            out = orig()
            sizes.append(out.load.tokens)
            return out

        eng.sched.schedule = schedule  # type: ignore[method-assign]
        r = request("a", 300, [(2, 1.0, 10), (2, None, 0)])
        eng.submit(r)
        eng.run()
        rec = eng.core.ledger.records[0]
        assert rec.tokens_recomputed == rec.context_tokens == 301  # all of it: nothing survives a discard
        ends[policy] = (eng.steps, r.end_s, max(sizes))
    assert ends["improved-discard"][0] == 1 + 1 + 1 + 1 and ends["improved-discard"][2] == 312
    assert ends["chunked-discard"][0] == 5 + 1 + 5 + 1 and ends["chunked-discard"][2] == 64
    assert ends["chunked-discard"][1] == pytest.approx(12 * STEP_S + 1.0)


def test_the_bound_never_runs_out_of_kv_and_its_waste_is_over_the_real_capacity(tmp_path: Path) -> None:
    # 40 blocks for 12 requests of ~300 tokens: preserve runs out (demotes or preempts); the bound,
    # with KV for every context at once (the runner's rule), never does.
    def reqs() -> list:
        return [request(f"r{i}", 250 + 7 * i, [(5, 0.5 + 0.1 * i, 16), (4, None, 0)], arrival=0.05 * i) for i in range(12)]

    seen = {}
    for policy in ("preserve", "unlimited-kv"):
        bench = toy_bench(tmp_path / policy, kv_tokens=640, max_num_seqs=16)
        bench.setting.unlimited_kv_tokens = sum(r.prompt_tokens + 5 + 16 + 4 for r in reqs())
        eng = bench.engine(policy, check_every=1)
        out = run_rate(eng, reqs(), drain_s=600.0, capacity_tokens=bench.setting.kv_tokens)
        seen[policy] = out
        assert out["completed"] == 12
    assert seen["preserve"]["demoted"] + seen["preserve"]["preemptions"] > 0
    bound = seen["unlimited-kv"]
    assert (bound["demoted"], bound["preemptions"], bound["recomputed_tokens"], bound["discarded"]) == (0, 0, 0, 0)
    # Waste shares of both over the same denominator: the real 640 tokens, not the bound's larger pool.
    assert bound["capacity_tokens"] == seen["preserve"]["capacity_tokens"] == 640 and bound["pool_tokens"] > 640


def test_swap_heuristic_keeps_short_calls_and_swaps_long_ones(tmp_path: Path) -> None:
    # A 304-token context over 320 kB/s at 100 B/token: ~0.1 s out and ~0.1 s in. With the paper's
    # elapsed-time estimate a call is swapped once it has run about as long as the copies take.
    bench = toy_bench(tmp_path, profile=toy_profile(swap_bytes_per_s=320_000.0, saturation=4096))
    eng = bench.engine("swap-heuristic", check_every=1)
    eng.submit(request("short", 300, [(4, 0.03, 8), (3, None, 0)]))
    eng.submit(request("long", 300, [(4, 3.0, 8), (3, None, 0)], arrival=0.001))
    eng.submit(request("bg", 50, [(600, None, 0)]))  # keeps the engine stepping through the calls
    eng.run()
    recs = {rec.request_id: rec for rec in eng.core.ledger.records}
    assert len(eng.finished) == 3
    assert recs["short"].kv_fate is Fate.PRESERVE and recs["short"].tokens_recomputed == 0
    assert recs["long"].kv_fate is Fate.SWAP and recs["long"].tokens_swapped_in == recs["long"].context_tokens


def test_a_request_that_can_never_run_is_reported_with_the_state_that_explains_it(tmp_path: Path) -> None:
    """The simulator raises `Stuck` (a bug to find, not a hang) and says what the queues, the free blocks
    and the paused entries were."""
    from infercept.benchmarks.sim.engine import Stuck

    eng = toy_bench(tmp_path, kv_tokens=256).engine("infercept")
    eng.submit(request("huge", 1000, [(2, None, 0)]))  # more blocks than the pool holds
    with pytest.raises(Stuck, match=r"waiting 1, .* free blocks 16/16, entries \{\}, head huge \(0/1000 tokens, 0 blocks\)"):
        eng.run()


@pytest.mark.parametrize("policy", ["preserve", "swap"])
def test_sessions_resumed_in_place_that_fill_the_cache_do_not_deadlock(tmp_path: Path, policy: str) -> None:
    """Three sessions pause together holding 18 of 20 blocks and come back together (in place: their KV
    is still there); each needs 3 more blocks for what the tool returned, 2 are free, and nothing runs.
    vLLM would admit nothing and preempt nothing; the core evicts the newest holder, which is
    recomputed, and every session finishes."""
    eng = toy_bench(tmp_path, kv_tokens=20 * 16).engine(policy, check_every=1)
    reqs = [request(rid, 90, [(2, 1.0, 40), (2, None, 0)], expected=0.0) for rid in ("a", "b", "c")]
    for r in reqs:
        eng.submit(r)
    eng.run()
    assert [r.output_tokens for r in reqs] == [4, 4, 4]
    assert eng.core.ledger.totals.waiting_evictions >= 1
    assert eng.sched.pool.num_free() == 20


def test_the_admission_meter_charges_a_new_requests_wait_for_blocks_as_the_engine_does(tmp_path: Path) -> None:
    # 8 blocks of 16 tokens. `a` takes 7 (a 100-token prompt, 10 tokens decoded); `b` (a 60-token prompt,
    # 4 blocks) arrives 1 ms later and waits for blocks until `a` finishes: the reason vLLM's scan gives.
    eng = toy_bench(tmp_path, kv_tokens=128, max_num_seqs=4).engine("preserve", check_every=1)
    a, b = request("a", 100, [(10, None, 0)]), request("b", 60, [(2, None, 0)], arrival=0.001)
    eng.submit(a)
    eng.submit(b)
    eng.run()
    report = eng.stats()["admission"]
    assert report["admitted"] == 2
    assert set(report["wait_s"]) == {"slots", "budget", "blocks", "behind_resumed"}
    # Charged from the first schedule that found `b` waiting (the second step, at 10 ms) to the one that
    # admitted it, the step after `a`'s last; `b`'s first token comes at the end of that step.
    assert report["wait_s"]["blocks"] == pytest.approx(b.first_token_s - STEP_S - STEP_S)
    assert report["wait_s"]["blocks"] == pytest.approx(a.end_s - STEP_S)
    assert sum(report["wait_s"].values()) == report["wait_s"]["blocks"]
