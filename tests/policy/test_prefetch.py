"""Prefetch (`infercept-prefetch`): a swapped context is copied back ahead of its call's return with link
capacity and device blocks nobody uses, keeps its host copy until the resume, and is given up for free
when its call overruns or memory runs short. Driven through the same small KV pool as the core tests."""

from __future__ import annotations

import pytest

from engine_adapter.config import EngineConfig
from engine_adapter.intercept.core import CoreSettings, InterceptCore
from engine_adapter.intercept.records import RestoredBy
from engine_adapter.intercept.state import KvState, ResumeKind, StepView
from engine_adapter.intercept.swap import SwapPlanner
from engine_adapter.policy.estimator import DurationEstimator
from engine_adapter.policy.table import policy_spec
from tests.policy.test_core import BLOCK, PROFILE, Pool, pause, step

CTX = 6 * BLOCK  # a 6-block context: two steps of copies at 3 blocks per step
BUSY = StepView(0, None, running_requests=2, running_tokens=2000)


def make(pool: Pool, min_p: float = 0.5) -> InterceptCore:
    # "img" calls last 1 s, nearly always: the prefetch's timing is exact.
    est = DurationEstimator("prior", {"img": (1.0, 0.001)})
    return InterceptCore(policy_spec("infercept-prefetch"), pool, block_size=BLOCK, profile=PROFILE, estimator=est,
                         settings=CoreSettings(ttl_s={}, prefetch_min_p=min_p), swap=SwapPlanner(PROFILE, BLOCK, 32))


def swapped(pool: Pool, core: InterceptCore, rid: str = "a", at: float = 0.0) -> float:
    """Pause `rid` on a 1 s call and step until its context is on the host; returns the clock."""
    pause(core, pool, rid, CTX, now=at, aug="img", expected=None)
    t = at
    while core.entries[rid].state is not KvState.SWAPPED:
        t = round(t + 0.01, 3)
        step(core, pool, t, BUSY)
        assert t < at + 0.5, core.entries[rid].state
    return t


def fetched(pool: Pool, core: InterceptCore) -> None:
    """`swapped`, then the two steps that fetch it back ahead of its return at 1 s."""
    swapped(pool, core)
    for t in (0.975, 0.985):
        step(core, pool, t, BUSY)
    assert core.entries["a"].state is KvState.PREFETCHED


def test_a_swapped_context_is_fetched_back_before_its_call_returns() -> None:
    pool = Pool()
    core = make(pool)
    t = swapped(pool, core)
    e = core.entries["a"]
    step(core, pool, 0.9, BUSY)  # 0.1 s early: the call is not back within the two steps a fetch takes
    assert e.state is KvState.SWAPPED and "a" not in pool.held
    # 0.975 s: back within the fetch's horizon (2 steps of copies + the step that reports them).
    c = step(core, pool, 0.975, BUSY)
    assert e.state is KvState.PREFETCHING and len(pool.held["a"]) == 6
    assert [d for d, _ in c.swap_in] == pool.held["a"][:3] and c.loads_done == []
    c = step(core, pool, 0.985, BUSY)
    assert [d for d, _ in c.swap_in] == pool.held["a"][3:] and e.state is KvState.PREFETCHED
    assert c.loads_done == []  # the engine is not told: nothing waits for this copy
    assert e.host is not None and core.swap.slots.num_free == 32 - 6  # the host copy is kept
    r = core.resume("a", 1.0, 99.0)
    assert r.kind is ResumeKind.KEEP and "a" not in core.entries and core.swap.slots.num_free == 32
    rec = core.ledger.records[-1]
    assert (rec.restored_by, rec.tokens_swapped_in, rec.tokens_recomputed) == (RestoredBy.SWAP, CTX, 0)
    totals = core.ledger.totals
    assert (totals.prefetches, totals.prefetch_hits, totals.prefetch_late, totals.prefetch_dropped) == (1, 1, 0, 0)
    # Memory-time held idle: until the copy out finished, then again from the prefetch to the resume.
    assert totals.preserved_token_seconds == pytest.approx(CTX * (t + 0.025))


def test_a_resume_that_overtakes_the_prefetch_waits_for_the_rest_of_the_copy_in_place() -> None:
    pool = Pool()
    core = make(pool)
    swapped(pool, core)
    step(core, pool, 0.975, BUSY)
    e = core.entries["a"]
    blocks = list(pool.held["a"])
    r = core.resume("a", 0.98, 99.0)
    assert r.kind is ResumeKind.LOAD_IN_PLACE and e.state is KvState.LOADING
    pool.ready.append("a")  # the engine holds it back as an asynchronous load
    c = step(core, pool, 0.985, BUSY)
    assert [d for d, _ in c.swap_in] == blocks[3:] and c.loads_done == ["a"] and e.state is KvState.LOADED
    step(core, pool, 0.995, BUSY)  # host slots come back one step later
    core.scheduled([("a", CTX)], 8)
    rec = core.ledger.records[-1]
    assert (rec.restored_by, rec.tokens_swapped_in) == (RestoredBy.SWAP, CTX) and core.swap.slots.num_free == 32
    assert core.ledger.totals.prefetch_late == 1


def test_a_call_that_overruns_gives_its_blocks_back_and_keeps_its_host_copy() -> None:
    pool = Pool()
    core = make(pool)
    swapped(pool, core)
    for t in (0.975, 0.985, 0.995):
        step(core, pool, t, BUSY)
    e = core.entries["a"]
    assert e.state is KvState.PREFETCHED
    step(core, pool, 1.2, BUSY)  # past every duration seen: no longer expected back soon
    assert e.state is KvState.SWAPPED and "a" not in pool.held and e.host is not None and len(e.host.slots) == 6
    assert core.ledger.totals.prefetch_dropped == 1
    r = core.resume("a", 1.3, 99.0)  # back through the ordinary load
    assert r.kind is ResumeKind.LOAD


def test_memory_pressure_takes_fetched_back_blocks_before_any_preserved_context() -> None:
    pool = Pool(blocks=20)
    core = make(pool)
    fetched(pool, core)
    pause(core, pool, "b", 4 * BLOCK, now=0.99, aug="img", expected=None)  # preserved: held for its round trip
    free = pool.num_free_blocks()
    need = StepView(blocks_needed=free + 3, head_waiting=None, running_requests=2, running_tokens=2000)
    step(core, pool, 0.995, need)
    assert core.entries["a"].state is KvState.SWAPPED and core.entries["b"].state is KvState.PRESERVED
    assert pool.num_free_blocks() == free + 6


def test_no_prefetch_without_room_on_the_device() -> None:
    pool = Pool(blocks=14)
    core = make(pool)
    swapped(pool, core)
    pool.alloc("other", 10 * BLOCK)  # 4 blocks free: the 6-block context does not fit
    step(core, pool, 0.975, BUSY)
    assert core.entries["a"].state is KvState.SWAPPED and core.ledger.totals.prefetches == 0


def test_no_prefetch_while_copies_out_take_the_link() -> None:
    pool = Pool()
    core = make(pool)
    swapped(pool, core)
    pause(core, pool, "b", 12 * BLOCK, now=0.9, aug="img", expected=None)
    # b's hold ends 80 ms later; from then its copy out takes the whole 3-block budget of each step.
    step(core, pool, 0.99, BUSY)
    assert core.entries["b"].state is KvState.SWAPPING_OUT
    assert core.entries["a"].state is KvState.SWAPPED and core.ledger.totals.prefetches == 0


def test_the_estimator_answers_how_likely_a_call_is_back_within_a_horizon() -> None:
    est = DurationEstimator("prior", {"img": (1.0, 0.001)})
    assert est.back_within_p("img", 0.5, 0.1) == 0.0 and est.back_within_p("img", 0.95, 0.1) == 1.0
    est.observe("x", 1.0)
    assert 0.0 < est.back_within_p("x", 0.0, 1.0) < 1.0
    assert DurationEstimator("dynamic").back_within_p("img", 0.2, 0.3) == 1.0  # remaining = elapsed
    assert DurationEstimator("oracle").back_within_p("img", 0.2, 0.3, true_duration_s=0.6) == 0.0


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5])
def test_a_prefetch_probability_outside_zero_to_one_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match="prefetch_min_p"):
        EngineConfig(prefetch_min_p=p)


def test_a_prefetch_never_takes_the_last_running_slot_from_a_waiting_request() -> None:
    pool = Pool(slots=2)
    core = make(pool)
    swapped(pool, core)
    pool.alloc("x", BLOCK)  # a running request: one slot left
    waiting = StepView(0, "new", running_requests=1, running_tokens=100)
    step(core, pool, 0.975, waiting)
    assert core.entries["a"].state is KvState.SWAPPED and core.ledger.totals.prefetches == 0
    step(core, pool, 0.976, BUSY)  # nobody waits: the slot may go to the prefetch
    assert core.entries["a"].state is KvState.PREFETCHING


def test_fetched_back_blocks_given_back_for_a_waiting_request_are_not_taken_again_in_that_step() -> None:
    pool = Pool(slots=2)
    core = make(pool)
    fetched(pool, core)
    pool.alloc("x", BLOCK)  # now every slot is taken, and a new request waits for one
    step(core, pool, 0.99, StepView(0, "new", running_requests=1, running_tokens=100))
    assert core.entries["a"].state is KvState.SWAPPED and pool.free_slots() == 1
    assert (core.ledger.totals.prefetches, core.ledger.totals.prefetch_dropped) == (1, 1)
