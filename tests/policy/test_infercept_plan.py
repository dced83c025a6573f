"""The min-waste per-iteration plan on constructed cases, with waste numbers from the real equations."""

from __future__ import annotations

import pytest

from engine_adapter.intercept.swap import SlotPool
from engine_adapter.policy.decide import PausedCost, infercept_plan
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
