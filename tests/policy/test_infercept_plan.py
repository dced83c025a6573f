"""The min-waste per-iteration plan on constructed cases, with waste numbers from the real equations."""

from __future__ import annotations

import dataclasses

import pytest

from engine_adapter.intercept.swap import SlotPool
from engine_adapter.policy.decide import (
    DecisionInput,
    PausedCost,
    PausedView,
    StepDecision,
    SwapQueue,
    infercept_plan,
    min_waste,
    min_waste_deferred,
    paused_costs,
    renting,
)
from engine_adapter.policy.estimator import DurationEstimator
from engine_adapter.policy.profile import Profile
from engine_adapter.policy.waste import (
    waste_chunked_discard_byte_s,
    waste_preserve_byte_s,
)

P = Profile(
    model="m", device="d", fwd_tokens=(64, 256, 512, 1024, 2048), fwd_seconds=(0.02, 0.03, 0.05, 0.1, 0.2),
    saturation_tokens=384, kv_bytes_per_token=1000, swap_out_bytes_per_s=1e9, swap_in_bytes_per_s=1e9,
)
BLOCK = 16


def cost(rid: str, remaining_s: float, ctx: int, other: int = 4000) -> PausedCost:
    round_trip = P.t_swap_out_s(ctx) + P.t_swap_in_s(ctx)
    return PausedCost(
        request_id=rid,
        context_blocks=-(-ctx // BLOCK),
        waste_preserve=waste_preserve_byte_s(remaining_s, ctx, P.kv_bytes_per_token),
        waste_discard=waste_chunked_discard_byte_s(P, ctx, other, chunk_tokens=300),
        swap_worthwhile=remaining_s > round_trip + P.t_fwd_s(512),
    )


def test_short_call_on_short_context_preserves() -> None:
    plan = infercept_plan([cost("calc", remaining_s=0.0002, ctx=200)], swap_out_budget_blocks=1000, host_free_blocks=1000)
    assert not plan.swap_out and not plan.discard  # preserved


def test_long_call_on_long_context_swaps_within_budget_else_discards() -> None:
    long = cost("tts", remaining_s=17.0, ctx=1800)
    assert infercept_plan([long], 1000, 1000).swap_out == ["tts"]
    # No swap budget at all this iteration: the cheaper of preserve/discard, which is discard.
    plan = infercept_plan([long], 0, 1000)
    assert plan.discard == ["tts"] and not plan.swap_out


def test_full_swap_space_falls_back_to_min_waste() -> None:
    plan = infercept_plan([cost("img", 20.0, 1200)], swap_out_budget_blocks=1000, host_free_blocks=10)
    assert plan.swap_out == [] and plan.discard == ["img"]


def test_worst_waste_swaps_first_and_budget_is_respected() -> None:
    costs = [cost("a", 5.0, 400), cost("b", 30.0, 1600), cost("c", 1.0, 800), cost("d", 0.0001, 100)]
    budget = (1600 + 400) // BLOCK  # room for b and a, not c
    plan = infercept_plan(costs, budget, host_free_blocks=10_000)
    assert plan.swap_out == ["b", "a"]
    assert sum(c.context_blocks for c in costs if c.request_id in plan.swap_out) <= budget
    # The calculator call is back before a copy could finish: neither swapped nor discarded (preserved).
    assert "d" not in plan.swap_out + plan.discard
    assert set(plan.swap_out + plan.discard) == {"a", "b", "c"}


def test_a_context_bigger_than_one_budget_still_starts() -> None:
    # Its copy continues over the next iterations; without this it would never be swapped.
    plan = infercept_plan([cost("big", 30.0, 3200)], swap_out_budget_blocks=50, host_free_blocks=10_000)
    assert plan.swap_out == ["big"]
    # ... but only when it is the first to use this iteration's budget.
    first = PausedCost("first", context_blocks=10, waste_preserve=9e9, waste_discard=8e9)
    big = PausedCost("big", context_blocks=200, waste_preserve=5e9, waste_discard=4e9)
    plan = infercept_plan([big, first], swap_out_budget_blocks=50, host_free_blocks=10_000)
    assert plan.swap_out == ["first"] and plan.discard == ["big"]


def test_slot_pool() -> None:
    pool = SlotPool(4)
    a = pool.take(3)
    assert a == [0, 1, 2] and pool.num_free == 1
    assert pool.take(2) is None
    pool.give(a)
    assert pool.num_free == 4
    with pytest.raises(AssertionError):
        pool.give([0])


# ---------------------------------------------------------------- waiting for a later swap budget (`infercept`)
def queue(tokens_ahead: int, limit_tokens: int = 1600, step_s: float = 0.01) -> SwapQueue:
    return SwapQueue(tokens_ahead=tokens_ahead, limit_tokens=limit_tokens, step_s=step_s, block_size=BLOCK)


def cost_with_times(rid: str, remaining_s: float, ctx: int, other: int = 4000, held_s: float = 0.0) -> PausedCost:
    return dataclasses.replace(cost(rid, remaining_s, ctx, other), remaining_s=remaining_s, held_s=held_s,
                               round_trip_s=P.t_swap_out_s(ctx) + P.t_swap_in_s(ctx), context_bytes=ctx * P.kv_bytes_per_token)


def test_queue_wait_counts_the_copies_ahead_in_whole_iterations() -> None:
    assert queue(2400).wait_s(0) == pytest.approx(0.02)  # 1.5 iterations' worth ahead: it starts in the second
    assert queue(1600).wait_s(0) == pytest.approx(0.01)  # exactly one: this iteration moves it, it starts next
    assert queue(2400).wait_s(50) == pytest.approx(0.02)  # 50 blocks (800 tokens) more: 3200 = two iterations
    assert queue(2400).wait_s(51) == pytest.approx(0.03)
    assert queue(0).wait_s(0) == pytest.approx(0.01)  # nothing ahead: the next iteration


def test_a_long_call_that_missed_the_budget_waits_for_it_instead_of_being_recomputed() -> None:
    long = cost_with_times("tts", remaining_s=17.0, ctx=1800)
    # The paper's rule: no budget this iteration, so the cheaper of preserving for all 17 s or discarding.
    assert infercept_plan([long], 0, 1000).discard == ["tts"]
    # Waiting: holding it 2 iterations until the copies ahead have moved wastes far less than a recompute.
    plan = infercept_plan([long], 0, 1000, queue(tokens_ahead=2000))
    assert plan.discard == [] and plan.swap_out == []  # preserved, decided again next iteration
    assert 0.02 * 1800 * P.kv_bytes_per_token < long.waste_discard
    # A cost without the times (context_bytes 0) never waits: the paper's rule.
    assert infercept_plan([cost("tts", 17.0, 1800)], 0, 1000, queue(2000)).discard == ["tts"]


def test_the_hold_since_the_pause_bounds_the_waiting() -> None:
    # Overtaken again and again, a request is held no longer than its recompute would cost: then discarded.
    limit_s = cost("x", 17.0, 1800).waste_discard / (1800 * P.kv_bytes_per_token)  # hold that equals a recompute
    assert infercept_plan([cost_with_times("tts", 17.0, 1800, held_s=0.5 * limit_s)], 0, 1000, queue(0)).discard == []
    assert infercept_plan([cost_with_times("tts", 17.0, 1800, held_s=limit_s)], 0, 1000, queue(0)).discard == ["tts"]


def test_waiting_falls_back_to_the_paper_when_the_wait_is_too_long_or_the_host_too_small() -> None:
    long = cost_with_times("tts", remaining_s=17.0, ctx=1800)
    # A queue so long that holding it until its copy starts costs more than recomputing it: discarded.
    assert infercept_plan([long], 0, 1000, queue(tokens_ahead=10_000_000, limit_tokens=16, step_s=0.05)).discard == ["tts"]
    # The call would be back before its copy could finish after the wait (0.4 s left, a 0.5 s round trip):
    # the paper's choice, although holding it for the wait would be cheap.
    c = PausedCost("img", context_blocks=10, waste_preserve=10.0, waste_discard=5.0, remaining_s=1.0,
                   round_trip_s=0.5, context_bytes=1)
    assert infercept_plan([c], 0, 1000, queue(tokens_ahead=60 * 1600, step_s=0.01)).discard == ["img"]
    assert infercept_plan([c], 0, 1000, queue(tokens_ahead=40 * 1600, step_s=0.01)).discard == []
    # No room in the host buffer for it: never held for a copy that cannot happen.
    assert infercept_plan([long], 0, 10, queue(0)).discard == ["tts"]


def test_waiting_requests_queue_behind_each_other() -> None:
    costs = [cost_with_times(f"r{i}", remaining_s=17.0, ctx=1600) for i in range(3)]  # 100 blocks each
    # One iteration (0.3 s) moves one of them: the first two wait one iteration, the third two, which
    # costs more than its recompute.
    assert 0.3 * 1600 * P.kv_bytes_per_token < costs[2].waste_discard < 0.6 * 1600 * P.kv_bytes_per_token
    plan = infercept_plan(costs, 0, 10_000, queue(tokens_ahead=0, limit_tokens=1600, step_s=0.3))
    assert len(plan.discard) == 1 and plan.swap_out == []
    # Host room for two copies: the third is decided by the paper's rule even with a short wait.
    assert len(infercept_plan(costs, 0, 200, queue(0)).discard) == 1
    # With a budget for one, one starts now and the others wait behind it.
    plan = infercept_plan(costs, 100, 10_000, queue(tokens_ahead=0))
    assert len(plan.swap_out) == 1 and plan.discard == []


def test_a_waiting_request_does_not_take_host_room_from_a_swap_that_starts_now() -> None:
    x = PausedCost("x", context_blocks=30, waste_preserve=9e9, waste_discard=8e9, swap_worthwhile=True)
    a = dataclasses.replace(x, request_id="a", context_blocks=100, waste_preserve=7e9, waste_discard=6e9,
                            remaining_s=20.0, context_bytes=1)
    b = dataclasses.replace(x, request_id="b", context_blocks=40, waste_preserve=5e9, waste_discard=4e9)
    # x starts (budget 70 -> 40), a (100 blocks) misses the budget and waits, b (40 blocks) fits it and starts:
    # the host (160 slots) holds x and b now, a's slots are only needed once it starts.
    plan = infercept_plan([x, a, b], 70, 160, queue(0))
    assert plan.swap_out == ["x", "b"] and plan.discard == []


def test_min_waste_deferred_is_infercepts_decision_and_the_paper_keeps_its_rule() -> None:
    from engine_adapter.policy.table import policy_spec

    assert policy_spec("infercept").decide is min_waste_deferred
    assert policy_spec("infercept-paper").decide is min_waste


# ---------------------------------------------------------------- the ski-rental hold (`infercept`)
def decision_input(paused_at_s: float, *, ctx: int = 2000, budget_tokens: int = 100_000) -> DecisionInput:
    # A short-call type whose mean residual at the pause (0.09 s) outlasts the copy's round trip (2 MB each way
    # at 1 GB/s: 4 ms) plus a forward (20 ms), so a swap looks worthwhile from the estimate alone.
    est = DurationEstimator(priors={"ve": (0.09, 0.2)})
    view = PausedView("r", "ve", context_tokens=ctx, paused_at_s=paused_at_s, expected_duration_s=None)
    return DecisionInput(now_s=1.0, paused=[view], profile=P, estimator=est, block_size=BLOCK, running_tokens=4000,
                         running_requests=8, last_batch_tokens=64, swap_out_budget_tokens=budget_tokens,
                         host_free_blocks=10_000, swap_queue_tokens=0, swap_limit_tokens=1600)


def test_a_call_is_held_one_round_trip_before_it_may_be_swapped_or_discarded() -> None:
    round_trip = P.t_swap_out_s(2000) + P.t_swap_in_s(2000)
    at_pause = decision_input(paused_at_s=1.0)
    (c,) = paused_costs(at_pause)
    assert c.swap_worthwhile and c.round_trip_s == pytest.approx(round_trip) and renting(c, 10_000)
    # The paper's rule with this estimate swaps it at once; infercept keeps it (neither swapped nor discarded).
    assert min_waste(at_pause).swap_out == ["r"]
    assert min_waste_deferred(at_pause) == StepDecision()
    # A long call with no swap budget at all: the paper's rule discards it (a recompute wastes less than
    # preserving for the whole expected call); infercept holds it first.
    no_budget = dataclasses.replace(decision_input(paused_at_s=1.0, budget_tokens=0),
                                    estimator=DurationEstimator(priors={"ve": (30.0, 30.0)}))
    assert min_waste(no_budget).discard == ["r"]
    assert min_waste_deferred(no_budget) == StepDecision()
    # No room in the host buffer: there is no swap to hold out for, so the min-waste choice applies at once.
    no_host = dataclasses.replace(no_budget, host_free_blocks=10)
    (c,) = paused_costs(no_host)
    assert not renting(c, 10) and min_waste_deferred(no_host) == min_waste(no_host)
    # Held one round trip: the min-waste choice applies again (the call outlasted the round trip, so its
    # expected remaining time is still worth a swap).
    later = decision_input(paused_at_s=1.0 - round_trip)
    (c,) = paused_costs(later)
    assert not renting(c, 10_000) and min_waste_deferred(later).swap_out == ["r"]


def test_a_call_not_worth_a_swap_is_decided_at_the_pause_as_before() -> None:
    # A 40-token context of a 1 ms call: its swap never pays, so there is no hold; the plan is the same with or
    # without the filter (preserved: its waste is tiny).
    inp = dataclasses.replace(decision_input(paused_at_s=1.0), estimator=DurationEstimator(priors={"ve": (0.001, 0.0)}))
    (c,) = paused_costs(inp)
    assert not c.swap_worthwhile and not renting(c, 10_000)
    assert min_waste_deferred(inp) == StepDecision()


def test_a_held_request_leaves_the_budget_to_the_others() -> None:
    # Two paused requests of the same type and context: one paused now (held), one a round trip ago. The
    # budget fits one copy: it goes to the one whose hold is over, and the held one is not deferred or discarded.
    round_trip = P.t_swap_out_s(2000) + P.t_swap_in_s(2000)
    inp = decision_input(paused_at_s=1.0, budget_tokens=2000)
    old = PausedView("old", "ve", context_tokens=2000, paused_at_s=1.0 - round_trip, expected_duration_s=None)
    inp = dataclasses.replace(inp, paused=[*inp.paused, old])
    assert min_waste_deferred(inp) == StepDecision(swap_out=["old"])


# ---------------------------------------------------------------- slack memory (`infercept-slack`)
def test_slack_memory_keeps_a_paused_context_in_place_until_memory_is_short() -> None:
    from engine_adapter.policy.decide import min_waste_slack, slack_kept
    from engine_adapter.policy.table import policy_spec

    assert policy_spec("infercept-slack").decide is min_waste_slack
    # A long call held past its round trip: infercept swaps it out (its swap pays off).
    round_trip = P.t_swap_out_s(2000) + P.t_swap_in_s(2000)
    long_call = dataclasses.replace(decision_input(paused_at_s=1.0 - 2 * round_trip),
                                    estimator=DurationEstimator(priors={"ve": (30.0, 30.0)}))
    assert min_waste_deferred(long_call).swap_out == ["r"]
    # Free blocks unknown (an input that does not say): decided as infercept decides.
    assert min_waste_slack(long_call) == min_waste_deferred(long_call)
    # Plenty of free blocks and nothing waiting for them: kept in place, neither swapped nor discarded.
    # Its copy-out (2000 tokens: 2 ms at 1 GB/s, 2 steps of N_i = 1600 at 20 ms) lets 8 requests grow
    # 8 x 0.04 s / 20 ms = 16 tokens: 1 block.
    slack = dataclasses.replace(long_call, free_blocks=1)
    assert slack_kept(paused_costs(slack), slack) == {"r"}
    assert min_waste_slack(slack) == StepDecision()
    # No block to spare, or a waiting head that does not fit: memory is short, infercept's choice applies.
    for short in (dataclasses.replace(long_call, free_blocks=0),
                  dataclasses.replace(long_call, free_blocks=500, head_waits=True)):
        assert slack_kept(paused_costs(short), short) == set()
        assert min_waste_slack(short) == min_waste_deferred(long_call)


def test_slack_is_spent_on_the_least_memory_time_first() -> None:
    from engine_adapter.policy.decide import min_waste_slack, slack_kept

    est = DurationEstimator(priors={"ve": (30.0, 30.0), "math": (0.5, 0.1)})
    views = [PausedView("long", "ve", context_tokens=2000, paused_at_s=0.0, expected_duration_s=None),
             PausedView("short", "math", context_tokens=2000, paused_at_s=0.0, expected_duration_s=None)]
    inp = dataclasses.replace(decision_input(paused_at_s=0.0), paused=views, estimator=est, now_s=1.0)
    # Each kept context adds its copy-out to the time the batch grows before memory could be freed: 2 steps
    # (40 ms) each, 16 tokens of growth per 40 ms. One block covers one of them, two blocks both.
    one = dataclasses.replace(inp, free_blocks=1)
    assert slack_kept(paused_costs(one), one) == {"short"}  # back sooner: less memory-time if it runs short
    assert "short" not in min_waste_slack(one).swap_out + min_waste_slack(one).discard
    both = dataclasses.replace(inp, free_blocks=2)
    assert slack_kept(paused_costs(both), both) == {"short", "long"} and min_waste_slack(both) == StepDecision()
