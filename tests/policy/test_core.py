"""The intercept core's transitions, driven directly through a small KV pool (the `KvPort` vLLM's
scheduler implements in the engine): each policy's pause, the swap path step by step within budgets,
resumes, expiry, demotion, closes in every state, and the integrity of the host buffer throughout."""

from __future__ import annotations

import dataclasses
import math

import pytest

from engine_adapter.intercept.core import CoreSettings, InterceptCore, TransitionError
from engine_adapter.intercept.records import BlockCounts, Fate, RestoredBy
from engine_adapter.intercept.reports import check_integrity
from engine_adapter.intercept.state import KvState, PauseInfo, ResumeKind, StepView
from engine_adapter.intercept.swap import SwapPlanner
from engine_adapter.policy.estimator import DurationEstimator
from engine_adapter.policy.profile import Profile
from engine_adapter.policy.table import POLICY_NAMES, policy_spec

BLOCK = 16
# Forward 10 ms per step at any size; swaps at 1,600 B/s of a 100 B/token KV: N_i = 0.16 tokens... so
# budgets are set per test through the bandwidth.
PROFILE = Profile(model="m", device="cpu", fwd_tokens=(1, 4096), fwd_seconds=(0.01, 0.01), saturation_tokens=256,
                  kv_bytes_per_token=100, swap_out_bytes_per_s=100 * 3 * BLOCK / 0.01,
                  swap_in_bytes_per_s=100 * 3 * BLOCK / 0.01)  # 3 blocks per 10 ms step


class Pool:
    """A KV pool: blocks per request, running slots. Paused requests hold a slot until released."""

    def __init__(self, blocks: int = 64, slots: int = 8) -> None:
        self.total, self.max_slots = blocks, slots
        self.free_ids = list(range(blocks))
        self.held: dict[str, list[int]] = {}
        self.slots_used = 0
        self.released: list[str] = []
        self.ready: list[str] = []  # waiting requests holding blocks (resumed in place), in queue order
        self.evicted: list[str] = []

    def alloc(self, rid: str, tokens: int) -> None:
        n = math.ceil(tokens / BLOCK)
        self.held[rid] = [self.free_ids.pop(0) for _ in range(n)]
        self.slots_used += 1

    def reacquire(self, request_id: str, num_tokens: int) -> list[int] | None:
        if request_id in self.held or math.ceil(num_tokens / BLOCK) > len(self.free_ids) or self.slots_full():
            return None
        self.alloc(request_id, num_tokens)
        return list(self.held[request_id])

    def release(self, request_id: str) -> None:
        self.free_ids += self.held.pop(request_id)
        self.slots_used -= 1
        self.released.append(request_id)

    def block_ids(self, request_id: str) -> list[int]:
        return list(self.held[request_id])

    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def in_use(self, block_ids) -> set[int]:
        held = {b for ids in self.held.values() for b in ids}
        return {b for b in block_ids if b in held}

    def slots_full(self) -> bool:
        return self.slots_used >= self.max_slots

    def free_slots(self) -> int:
        return self.max_slots - self.slots_used

    def kv_holding_waiting(self) -> list[str]:
        return [rid for rid in self.ready if rid in self.held]

    def evict_waiting(self, request_id: str) -> None:
        self.free_ids += self.held.pop(request_id)
        self.ready.remove(request_id)
        self.evicted.append(request_id)

    def counts(self, paused: set[str]) -> BlockCounts:
        preserved = sum(len(b) for r, b in self.held.items() if r in paused)
        return BlockCounts(self.total, len(self.free_ids), self.total - len(self.free_ids) - preserved, preserved)


def make(policy: str, pool: Pool, host_slots: int = 32, ttl: dict[str, float] | None = None,
         estimator: str = "prior") -> InterceptCore:
    spec = policy_spec(policy)
    swap = SwapPlanner(PROFILE, BLOCK, host_slots) if spec.swap else None
    return InterceptCore(spec, pool, block_size=BLOCK, profile=PROFILE,
                         estimator=DurationEstimator(estimator, {"math": (0.0001, 0.0001), "tts": (20.0, 5.0)}),
                         settings=CoreSettings(ttl_s=ttl or {"default": 1.0}), swap=swap)


def pause(core: InterceptCore, pool: Pool, rid: str, ctx: int, now: float, aug: str = "tts",
          expected: float | None = 20.0) -> None:
    pool.alloc(rid, ctx)
    core.pause(PauseInfo(rid, "s-" + rid, aug, expected, "TTS", "react", ctx, arrival_time=float(len(rid))), now)


def idle_view(pool: Pool) -> StepView:
    return StepView(blocks_needed=0, head_waiting=None, running_requests=0, running_tokens=0)


def step(core: InterceptCore, pool: Pool, now: float, view: StepView | None = None) -> tuple:
    core.before_schedule(lambda: view or idle_view(pool), now)
    copies = core.step_copies() if core.swap is not None else None
    check_integrity(core, pool.counts(core.paused_ids(on_device=True)))
    return copies


def test_discard_frees_at_the_pause_and_recomputes_at_the_back() -> None:
    pool = Pool()
    core = make("discard", pool)
    pause(core, pool, "a", 40, now=1.0)
    assert pool.released == ["a"] and core.entries["a"].state is KvState.DISCARDED
    assert core.holds_device("a") is False
    rec = core.outbox.pop("a")[0]
    assert (rec.action, rec.kv_fate, rec.kv_released_at_s) == ("discard", Fate.DISCARD, 1.0)
    r = core.resume("a", now=3.0, new_arrival_time=99.0)
    assert r is not None and r.kind is ResumeKind.RECOMPUTE and r.arrival_time == 99.0  # back of the queue
    core.scheduled([("a", 0)], total_tokens=40)
    assert rec.restored_by is RestoredBy.RECOMPUTE and rec.tokens_recomputed == 40 and "a" not in core.entries
    assert core.outbox["a"] == [rec]  # the front end hears how it came back
    assert core.meter.recomputing == {"a": 40}


def test_improved_discard_keeps_the_queue_place_and_vllm_apc_counts_prefix_hits() -> None:
    pool = Pool()
    core = make("improved-discard", pool)
    pause(core, pool, "a", 40, now=1.0)
    assert core.resume("a", 2.0, new_arrival_time=99.0).arrival_time == 1.0  # its original arrival
    pool2 = Pool()
    apc = make("vllm-apc", pool2)
    pause(apc, pool2, "b", 40, now=1.0)
    apc.resume("b", 2.0, 99.0)
    apc.scheduled([("b", 32)], 8)
    rec = apc.ledger.records[-1]
    assert (rec.restored_by, rec.tokens_prefix_hit, rec.tokens_recomputed) == (RestoredBy.PARTIAL_PREFIX_CACHE, 32, 8)


def test_preserve_keeps_the_kv_and_resumes_in_place() -> None:
    pool = Pool()
    core = make("preserve", pool)
    pause(core, pool, "a", 40, now=1.0)
    assert core.holds_device("a") is True and pool.released == []
    check_integrity(core, pool.counts(core.paused_ids(on_device=True)))
    r = core.resume("a", 4.0, 99.0)
    assert r.kind is ResumeKind.KEEP and r.arrival_time == 1.0 and "a" not in core.entries
    rec = core.ledger.records[-1]
    assert rec.restored_by is RestoredBy.PRESERVE and rec.tokens_kept == 40 and rec.call_duration_s == 3.0
    assert core.estimator.mean_s("tts") != DurationEstimator("prior", {"tts": (20.0, 5.0)}).mean_s("tts")  # learned 3 s


def test_ttl_expires_at_the_ttl_not_when_noticed() -> None:
    pool = Pool()
    core = make("ttl", pool, ttl={"math": 0.5, "tts": 0.0, "default": 2.0})
    pause(core, pool, "zero", 40, now=0.0, aug="tts")  # zero TTL: freed at once
    pause(core, pool, "m", 40, now=0.0, aug="math")
    assert core.entries["zero"].state is KvState.DISCARDED and core.entries["m"].state is KvState.PRESERVED
    step(core, pool, now=0.4)
    assert core.entries["m"].state is KvState.PRESERVED
    step(core, pool, now=7.0)
    rec = core.entries["m"].record
    assert rec.kv_fate is Fate.TTL_EXPIRED and rec.kv_released_at_s == 0.5
    assert core.ledger.totals_at(7.0).ttl_expired == 1


def test_swap_path_step_by_step_within_budgets() -> None:
    pool = Pool()
    core = make("swap", pool, host_slots=32)
    pause(core, pool, "a", 5 * BLOCK + 3, now=0.0)  # 6 blocks travel: the 3-token tail's block too
    e = core.entries["a"]
    assert e.state is KvState.SWAPPING_OUT and e.host is not None and e.host.tokens == 5 * BLOCK + 3
    assert len(e.host.slots) == 6
    device = pool.block_ids("a")
    c1 = step(core, pool, 0.01)
    assert [d for d, _ in c1.swap_out] == device[:3]  # 3 blocks per step (the swap limit)
    assert e.state is KvState.SWAPPING_OUT and pool.released == []
    c2 = step(core, pool, 0.02)
    # The step that copies the last blocks gives the device copy back (to be used in that same step).
    assert [d for d, _ in c2.swap_out] == device[3:6] and c2.swap_out_first == []
    assert e.state is KvState.SWAPPED and pool.released == ["a"] and e.record.kv_fate is Fate.SWAP
    assert e.record.kv_released_at_s == 0.02
    assert check_integrity(core, pool.counts(core.paused_ids(on_device=True))).host_tokens == 5 * BLOCK + 3

    r = core.resume("a", 1.0, 99.0)
    assert r.kind is ResumeKind.LOAD and e.state is KvState.LOAD_QUEUED
    assert core.load_lookup("a", 0) == (None, False)  # held back until armed
    step(core, pool, 1.01)
    assert e.state is KvState.LOAD_ARMED and core.load_lookup("a", 0) == (5 * BLOCK + 3, True)
    core.load_allocated("a", [40, 41, 42, 43, 44, 45], 5 * BLOCK + 3)
    got = []
    for t in (1.02, 1.03):
        c = core.step_copies()
        got += c.swap_in
    assert [d for d, _ in got] == [40, 41, 42, 43, 44, 45] and e.state is KvState.LOADED
    assert c.loads_done == ["a"]
    core.before_schedule(lambda: idle_view(pool), 1.04)  # host slots come back one step later
    assert e.host is None and core.swap.slots.num_free == 32
    core.scheduled([("a", 5 * BLOCK + 3)], 8)  # vLLM resumes at the loaded length: nothing recomputed
    rec = core.ledger.records[-1]
    assert (rec.restored_by, rec.tokens_swapped_in, rec.tokens_recomputed) == (RestoredBy.SWAP, 5 * BLOCK + 3, 0)
    assert core.meter.recomputing == {}


def test_a_load_after_prefix_cache_hits_copies_only_the_blocks_the_device_lost() -> None:
    """With prefix caching (`infercept-apc`) vLLM's lookup finds the request's first blocks still cached
    before ours runs: the load fills the blocks after them, from the matching host slots."""
    pool = Pool()
    core = make("infercept-apc", pool, host_slots=32)
    pause(core, pool, "a", 5 * BLOCK + 3, now=0.0)
    e = core.entries["a"]
    t = 0.01
    while e.state is not KvState.SWAPPED:  # the policy holds, then swaps: step until the copy is done
        step(core, pool, t)
        t += 0.01
        assert t < 30.0
    slots = list(e.host.slots)
    core.resume("a", t, 99.0)
    step(core, pool, t + 0.01)
    assert e.state is KvState.LOAD_ARMED
    assert core.load_lookup("a", 2 * BLOCK) == (3 * BLOCK + 3, True)  # 2 blocks hit
    core.load_allocated("a", [7, 8, 40, 41, 42, 43], 3 * BLOCK + 3)  # the hits first, as vLLM lists them
    got = core.step_copies().swap_in
    while e.state is KvState.LOADING:
        got += core.step_copies().swap_in
    assert got == list(zip([40, 41, 42, 43], slots[2:]))
    assert core.swap.stats.tokens_in == 3 * BLOCK + 3  # what was copied, not the hits
    core.before_schedule(lambda: idle_view(pool), t + 1.0)
    core.scheduled([("a", 5 * BLOCK + 3)], 8)
    rec = core.ledger.records[-1]
    assert (rec.restored_by, rec.tokens_prefix_hit, rec.tokens_swapped_in, rec.tokens_recomputed) == (
        RestoredBy.SWAP, 2 * BLOCK, 3 * BLOCK + 3, 0)


def test_a_swapped_context_the_prefix_cache_still_holds_whole_is_not_loaded() -> None:
    pool = Pool()
    core = make("infercept-apc", pool, host_slots=32)
    pause(core, pool, "a", 6 * BLOCK, now=0.0)
    e = core.entries["a"]
    t = 0.01
    while e.state is not KvState.SWAPPED:
        step(core, pool, t)
        t += 0.01
        assert t < 30.0
    core.resume("a", t, 99.0)
    step(core, pool, t + 0.01)
    assert core.load_lookup("a", 6 * BLOCK) == (0, False)  # every block hit: nothing to copy
    core.scheduled([("a", 6 * BLOCK)], 8)
    rec = core.ledger.records[-1]
    assert (rec.restored_by, rec.tokens_prefix_hit, rec.tokens_swapped_in) == (RestoredBy.PREFIX_CACHE, 6 * BLOCK, 0)
    assert e.host is None and core.swap.slots.num_free == 32


def test_blocks_released_and_reused_in_the_copying_step_are_copied_first() -> None:
    """A swap-out releases its device blocks in the step that copies its last ones; those the engine
    hands out again in that step are copied before the forward pass writes them, the rest after."""
    pool = Pool(blocks=6)
    core = make("swap", pool, host_slots=32)
    pause(core, pool, "a", 5 * BLOCK + 3, now=0.0)
    device = pool.block_ids("a")
    assert [d for d, _ in step(core, pool, 0.01).swap_out] == device[:3]
    core.before_schedule(lambda: idle_view(pool), 0.02)  # plans the last 3 blocks and releases all 6
    assert pool.released == ["a"] and pool.num_free_blocks() == 6
    pool.alloc("b", 4 * BLOCK)  # vLLM's step takes the 4 oldest free blocks: device[0..3]
    c = core.step_copies()
    assert [d for d, _ in c.swap_out_first] == [device[3]]  # copied this step and reused: first
    assert [d for d, _ in c.swap_out] == device[4:6]
    assert core.swap.history[-1].out_moved == 3 * BLOCK  # both lists count as this step's copy
    assert core.step_copies().swap_out_first == []  # the next step knows nothing of it


def test_an_engine_that_zeroes_new_blocks_keeps_them_until_the_copy_has_run() -> None:
    pool = Pool()
    core = make("swap", pool, host_slots=32)
    core.settings = CoreSettings(ttl_s={"default": 1.0}, release_when_copied=False)
    pause(core, pool, "a", 2 * BLOCK, now=0.0)
    assert len(step(core, pool, 0.01).swap_out) == 2 and pool.released == []
    step(core, pool, 0.02)  # the step that copied them has run
    assert pool.released == ["a"] and core.entries["a"].state is KvState.SWAPPED


def test_full_host_buffer_falls_back_to_discard() -> None:
    pool = Pool()
    core = make("swap", pool, host_slots=3)
    pause(core, pool, "a", 2 * BLOCK, now=0.0)
    pause(core, pool, "b", 2 * BLOCK, now=0.0)  # one slot left: does not fit
    pause(core, pool, "c", BLOCK - 1, now=0.0)  # under one block: travels in the last slot
    assert core.entries["b"].state is KvState.DISCARDED and core.entries["c"].state is KvState.SWAPPING_OUT
    assert core.ledger.totals.swap_fallbacks == 1 and core.swap.slots.num_free == 0


def test_resume_during_copy_out_keeps_the_device_copy() -> None:
    pool = Pool()
    core = make("swap", pool)
    pause(core, pool, "a", 5 * BLOCK, now=0.0)
    step(core, pool, 0.01)
    assert core.resume("a", 0.02, 9.0).kind is ResumeKind.KEEP
    assert core.swap.slots.num_free == core.swap.slots.num_slots and pool.released == []
    assert core.ledger.records[-1].restored_by is RestoredBy.PRESERVE


def test_infercept_swaps_long_calls_and_keeps_short_ones() -> None:
    pool = Pool()
    core = make("infercept", pool)
    pause(core, pool, "calc", 4 * BLOCK, now=0.0, aug="math", expected=0.0001)
    pause(core, pool, "tts", 4 * BLOCK, now=0.0, aug="tts", expected=20.0)
    assert core.entries["tts"].state is KvState.PRESERVED  # decided per iteration, not at the pause
    view = StepView(0, None, running_requests=2, running_tokens=200)
    budget = core.before_schedule(lambda: view, 0.001)
    assert budget == PROFILE.saturation_tokens  # iterations capped at S: chunked recompute
    # Held one copy round trip first (4 blocks out and back at 3 blocks per 10 ms: 27 ms), then swapped.
    assert core.entries["tts"].state is KvState.PRESERVED
    core.before_schedule(lambda: view, 0.027)
    assert core.entries["tts"].state is KvState.SWAPPING_OUT and core.entries["calc"].state is KvState.PRESERVED


def test_the_paper_recomputes_a_long_call_pausing_while_a_copy_takes_the_budget() -> None:
    """The paper compares a discard against preserving for the whole call, so a long call that pauses while
    copies take the swap budget is recomputed (`infercept` holds it until the budget reaches it: below)."""
    pool = Pool()
    core = make("infercept-paper", pool)
    busy = StepView(0, None, running_requests=2, running_tokens=2000)
    pause(core, pool, "a", 6 * BLOCK, now=0.0)
    step(core, pool, 0.001, busy)  # a's copy starts: 3 of its 6 blocks
    assert core.entries["a"].state is KvState.SWAPPING_OUT
    pause(core, pool, "b", 4 * BLOCK, now=0.002)
    seen = []
    decide = core.spec.decide
    assert decide is not None
    core.spec = dataclasses.replace(core.spec, decide=lambda inp: seen.append(inp) or decide(inp))
    step(core, pool, 0.003, busy)  # a's last 3 blocks take this step's whole budget
    # What the decision was told: a's 3 blocks still to copy ahead of b, N_i = 3 blocks, no budget left.
    (inp,) = seen
    assert (inp.swap_queue_tokens, inp.swap_limit_tokens, inp.swap_out_budget_tokens) == (3 * BLOCK, 3 * BLOCK, 0)
    assert core.entries["b"].state is KvState.DISCARDED


def test_infercept_holds_a_long_call_until_the_swap_budget_reaches_it() -> None:
    pool = Pool()
    core = make("infercept", pool)
    busy = StepView(0, None, running_requests=2, running_tokens=2000)
    # a: 12 blocks (a 4-step copy, 80 ms round trip); b: 4 blocks (27 ms), paused while a's hold runs.
    pause(core, pool, "a", 12 * BLOCK, now=0.0)
    pause(core, pool, "b", 4 * BLOCK, now=0.07)
    step(core, pool, 0.081, busy)  # a's hold is over: its copy starts (3 of 12 blocks); b is still held
    assert core.entries["a"].state is KvState.SWAPPING_OUT and core.entries["b"].state is KvState.PRESERVED
    step(core, pool, 0.091, busy)  # 6 of 12
    seen = []
    decide = core.spec.decide
    assert decide is not None
    core.spec = dataclasses.replace(core.spec, decide=lambda inp: seen.append(inp) or decide(inp))
    step(core, pool, 0.101, busy)  # b's hold is over, but a's next 3 blocks take this step's whole budget
    # What the decision was told: a's 6 blocks still to copy ahead of b, N_i = 3 blocks, no budget left.
    (inp,) = seen
    assert (inp.swap_queue_tokens, inp.swap_limit_tokens, inp.swap_out_budget_tokens) == (6 * BLOCK, 3 * BLOCK, 0)
    b = core.entries["b"]
    assert b.state is KvState.PRESERVED  # waits for the budget instead of being recomputed
    step(core, pool, 0.111, busy)  # a's last 3 blocks
    assert b.state is KvState.PRESERVED and core.entries["a"].state is KvState.SWAPPED
    c = step(core, pool, 0.121, busy)  # the budget is free again: b's copy starts
    assert b.state is KvState.SWAPPING_OUT and len(c.swap_out) == 3
    step(core, pool, 0.131, busy)
    assert b.state is KvState.SWAPPED and b.record.kv_fate is Fate.SWAP


def test_demotion_frees_the_latest_back_when_running_work_needs_blocks() -> None:
    pool = Pool(blocks=10)
    core = make("preserve", pool)
    pause(core, pool, "soon", 3 * BLOCK, now=0.0, expected=1.0)
    pause(core, pool, "late", 3 * BLOCK, now=0.0, expected=30.0)
    step(core, pool, 0.1, StepView(blocks_needed=5, head_waiting=None, running_requests=1, running_tokens=10))
    assert core.entries["late"].record.kv_fate is Fate.DEMOTED and core.entries["soon"].state is KvState.PRESERVED
    assert pool.num_free_blocks() == 7


def test_demotion_frees_slots_for_a_resumed_session() -> None:
    pool = Pool(blocks=64, slots=2)
    core = make("preserve", pool)
    pause(core, pool, "a", BLOCK, now=0.0)
    pause(core, pool, "b", BLOCK, now=0.0)
    pause(core, pool, "c", BLOCK, now=0.0)  # a session the pool let in past its slots (a test shortcut)
    core.resume("c", 0.5, 9.0)
    pool.release("c")
    # c waits at the head of the queue and is a known session: it must get a slot.
    step(core, pool, 1.0, StepView(blocks_needed=1, head_waiting="c", running_requests=0, running_tokens=0))
    assert not pool.slots_full() and sum(e.record.kv_fate is Fate.DEMOTED for e in core.entries.values()) == 1


def test_close_in_every_state_frees_host_slots_and_reports_abandoned_loads() -> None:
    pool = Pool()
    core = make("swap", pool)
    for rid in ("p", "o", "l"):
        pause(core, pool, rid, 2 * BLOCK, now=0.0)
    for t in (0.01, 0.02, 0.03):
        step(core, pool, t)
    core.resume("l", 1.0, 9.0)
    step(core, pool, 1.01)
    core.load_allocated("l", [50, 51], 2 * BLOCK)
    for rid in ("p", "o", "l"):
        core.close(rid, 2.0)
    assert core.entries == {} and core.swap.slots.num_free == core.swap.slots.num_slots
    assert core.step_copies().loads_done == ["l"]  # vLLM frees its allocated blocks once reported
    assert core.step_copies().loads_done == []


def test_a_request_closed_while_armed_is_not_reported_loaded() -> None:
    """Armed but not yet allocated: vLLM frees it at once and knows no load of it, so reporting one
    would break vLLM (it asserts every finished load belongs to a live request)."""
    pool = Pool()
    core = make("swap", pool)
    pause(core, pool, "a", 2 * BLOCK, now=0.0)
    for t in (0.01, 0.02):
        step(core, pool, t)
    core.resume("a", 1.0, 9.0)
    step(core, pool, 1.01)
    assert core.entries["a"].state is KvState.LOAD_ARMED
    core.close("a", 1.02)
    assert core.step_copies().loads_done == [] and core.swap.slots.num_free == core.swap.slots.num_slots


def test_transitions_from_the_wrong_state_raise() -> None:
    pool = Pool()
    core = make("swap", pool)
    pause(core, pool, "a", 2 * BLOCK, now=0.0)
    with pytest.raises(TransitionError):
        core.start_swap_out(core.entries["a"], 0.1)  # already copying
    with pytest.raises(TransitionError):
        core.pause(PauseInfo("a", "s", "tts", None, None, None, 32, 0.0), 0.1)
    assert core.resume("never-paused", 0.1, 0.0) is None


def test_tag_refines_the_current_pause() -> None:
    pool = Pool()
    core = make("preserve", pool)
    pause(core, pool, "a", BLOCK, now=0.0, aug="default", expected=None)
    assert core.tag("s-a", "image", 12.5) and core.entries["a"].record.aug_type == "image"
    assert not core.tag("s-unknown", "image", 1.0)


def swapped_out(core: InterceptCore, pool: Pool, rid: str, blocks: int) -> None:
    pause(core, pool, rid, blocks * BLOCK, now=0.0)
    for t in (0.1, 0.11, 0.12, 0.13, 0.14):  # swap-heuristic swaps a call once it outlasts a copy out and in
        step(core, pool, t)
    assert core.entries[rid].state is KvState.SWAPPED


def test_a_swap_in_at_the_head_of_the_queue_is_armed_beyond_the_pipeline() -> None:
    """Held back at the head of vLLM's queue (ordered by arrival), a resumed swapped request is skipped
    while newer requests take the memory it waits for (seen in the benchmark): armed, it holds its
    place (vLLM waits for room there) even when another swap-in fills this step's pipeline."""
    pool = Pool(blocks=40)
    core = make("swap-heuristic", pool)
    swapped_out(core, pool, "a", 6)  # arrived first (arrival_time 1.0)
    swapped_out(core, pool, "bb", 6)  # arrived later (arrival_time 2.0), but resumes first
    core.resume("bb", 1.0, 9.0)
    core.before_schedule(lambda: StepView(0, head_waiting="bb", running_requests=1), 1.01)
    assert core.entries["bb"].state is KvState.LOAD_ARMED
    core.resume("a", 1.02, 9.0)
    core.before_schedule(lambda: StepView(0, head_waiting="new", running_requests=1), 1.03)
    assert core.entries["a"].state is KvState.LOAD_QUEUED  # the pipeline is full: it waits its turn
    core.before_schedule(lambda: StepView(0, head_waiting="a", running_requests=1), 1.04)
    assert core.entries["a"].state is KvState.LOAD_ARMED  # but not behind newer requests


def test_demotion_makes_room_for_a_whole_swap_in() -> None:
    """A swap-in allocates blocks for its whole host copy at once, not one chunk's worth: demotion makes
    room for all of it."""
    pool = Pool(blocks=20)
    core = make("swap-heuristic", pool)
    swapped_out(core, pool, "a", 6)
    core.swap.slots.take(core.swap.slots.num_free)  # the host buffer is full: nothing else moves out
    pause(core, pool, "b", 8 * BLOCK, now=0.5, expected=30.0)
    pause(core, pool, "c", 8 * BLOCK, now=0.5, expected=1.0)
    assert pool.num_free_blocks() == 4
    core.resume("a", 1.0, 9.0)
    view = StepView(blocks_needed=1, head_waiting="a", head_blocks=1, running_requests=1, running_tokens=10)
    core.before_schedule(lambda: view, 1.01)
    # It needs 6 blocks (with the step's 1, less the 1 counted for it): the latest-back paused context
    # was demoted, not just one chunk's worth freed.
    assert core.entries["b"].record.kv_fate is Fate.DEMOTED and core.entries["c"].state is KvState.PRESERVED
    assert pool.num_free_blocks() == 12


def test_a_load_under_way_keeps_its_swap_in_budget_every_step() -> None:
    """Budgets are planned before every step: a load already armed (nothing left queued) still gets
    the step's swap-in budget (3 blocks here), not the one-block trickle that keeps loads finishing."""
    pool = Pool()
    core = make("swap", pool, host_slots=32)
    pause(core, pool, "a", 6 * BLOCK, now=0.0)
    for t in (0.01, 0.02, 0.03):
        step(core, pool, t)
    e = core.entries["a"]
    assert e.state is KvState.SWAPPED
    core.resume("a", 1.0, 99.0)
    assert core.holds_back("a") and core.load_lookup("a", 0) == (None, False)  # vLLM skips it
    step(core, pool, 1.01)
    assert e.state is KvState.LOAD_ARMED and not core.holds_back("a")
    core.load_allocated("a", [40, 41, 42, 43, 44, 45], 6 * BLOCK)
    moved = [len(step(core, pool, t).swap_in) for t in (1.02, 1.03)]
    assert moved == [3, 3] and e.state is KvState.LOADED


def test_a_load_under_way_copies_at_the_full_budget_when_no_block_is_free() -> None:
    """A load copies into the blocks vLLM gave it at admission: a full device (running requests took every
    free block) must not shrink its swap-in budget to the one-block trickle, which would hold those blocks
    idle for six steps instead of two."""
    pool = Pool(blocks=20)
    core = make("swap", pool, host_slots=32)
    pause(core, pool, "a", 6 * BLOCK, now=0.0)
    for t in (0.01, 0.02, 0.03):
        step(core, pool, t)
    e = core.entries["a"]
    assert e.state is KvState.SWAPPED and pool.num_free_blocks() == 20
    core.resume("a", 1.0, 99.0)
    step(core, pool, 1.01)
    assert e.state is KvState.LOAD_ARMED
    pool.alloc("a", 6 * BLOCK)  # vLLM admits the load: its blocks
    core.load_allocated("a", pool.block_ids("a"), 6 * BLOCK)
    pool.alloc("running", 14 * BLOCK)  # and the running batch takes every block left
    assert pool.num_free_blocks() == 0
    moved = [len(step(core, pool, t).swap_in) for t in (1.02, 1.03)]
    assert moved == [3, 3] and e.state is KvState.LOADED


def pressed(host_slots: int = 32) -> tuple[Pool, InterceptCore]:
    """infercept on a 20-block pool holding two short calls' contexts (kept by min-waste) of 6 blocks:
    8 blocks free; "b" is expected back later, so it goes first. With 1,000 tokens running, recomputing
    either would waste more than keeping it for the few tens of ms these tests last."""
    pool = Pool(blocks=20)
    core = make("infercept", pool, host_slots=host_slots)
    pause(core, pool, "a", 6 * BLOCK, now=0.0, aug="math", expected=0.0001)
    pause(core, pool, "b", 6 * BLOCK, now=0.0, aug="math", expected=0.0002)
    return pool, core


def test_infercept_swaps_under_pressure_instead_of_demoting_and_the_head_waits_for_the_copy() -> None:
    pool, core = pressed()
    # A resumed or new request at the head needs 10 blocks; 8 are free; nothing else is short.
    view = StepView(blocks_needed=10, head_waiting="new", head_blocks=10, running_requests=1, running_tokens=1000, blocks_ahead=10)
    step(core, pool, 0.01, view)
    assert core.entries["b"].state is KvState.SWAPPING_OUT and core.entries["a"].state is KvState.PRESERVED
    assert core.ledger.totals.pressure_swaps == 1 and core.ledger.totals.demoted == 0
    step(core, pool, 0.02, view)  # the copy under way will make the room: nothing more moves
    assert core.ledger.totals.pressure_swaps == 1 and core.entries["a"].state is KvState.PRESERVED
    step(core, pool, 0.025, view)
    assert core.entries["b"].state is KvState.SWAPPED and core.entries["b"].record.kv_fate is Fate.SWAP
    assert pool.num_free_blocks() == 14 and core.ledger.totals.demoted == 0


def test_infercept_swaps_ahead_of_need_for_the_prompts_under_way() -> None:
    """This step fits, but the prompts and recomputes under way will need 12 blocks: the copy starts now."""
    pool, core = pressed()
    step(core, pool, 0.01, StepView(blocks_needed=4, head_waiting=None, running_requests=2, running_tokens=1000, blocks_ahead=12))
    assert core.entries["b"].state is KvState.SWAPPING_OUT and core.ledger.totals.pressure_swaps == 1
    assert pool.num_free_blocks() == 8  # nothing freed yet: the copy frees the blocks when done


def test_what_running_requests_need_this_step_is_freed_at_once() -> None:
    pool, core = pressed()
    step(core, pool, 0.01, StepView(blocks_needed=10, head_waiting=None, running_requests=3, running_tokens=1000, blocks_ahead=10))
    assert core.entries["b"].record.kv_fate is Fate.DEMOTED and core.ledger.totals.pressure_swaps == 0
    assert core.entries["a"].state is KvState.PRESERVED and pool.num_free_blocks() == 14


def test_with_a_full_host_buffer_only_this_steps_need_demotes() -> None:
    pool, core = pressed(host_slots=4)  # a 6-block context does not fit
    step(core, pool, 0.01, StepView(blocks_needed=6, head_waiting="new", head_blocks=6, running_requests=1, running_tokens=1000, blocks_ahead=12))
    assert core.ledger.totals.demoted == 0 and core.ledger.totals.pressure_swaps == 0  # room ahead alone: kept
    step(core, pool, 0.02, StepView(blocks_needed=10, head_waiting="new", head_blocks=10, running_requests=1, running_tokens=1000, blocks_ahead=10))
    assert core.entries["b"].record.kv_fate is Fate.DEMOTED and core.entries["a"].state is KvState.PRESERVED


def test_with_nothing_running_pressure_demotes_as_before() -> None:
    """Copies travel with a step's forward pass: with nothing running, waiting for one could stall."""
    pool, core = pressed()
    step(core, pool, 0.01, StepView(blocks_needed=10, head_waiting="new", head_blocks=10, running_requests=0, running_tokens=1000, blocks_ahead=10))
    assert core.entries["b"].record.kv_fate is Fate.DEMOTED and core.ledger.totals.pressure_swaps == 0


def test_the_paper_policy_demotes_under_pressure() -> None:
    pool = Pool(blocks=20)
    core = make("infercept-paper", pool)
    pause(core, pool, "a", 6 * BLOCK, now=0.0, aug="math", expected=0.0001)
    pause(core, pool, "b", 6 * BLOCK, now=0.0, aug="math", expected=0.0002)
    step(core, pool, 0.01, StepView(blocks_needed=10, head_waiting="new", head_blocks=10, running_requests=1, running_tokens=1000, blocks_ahead=10))
    assert core.ledger.totals.demoted == 1 and core.ledger.totals.pressure_swaps == 0


def test_a_copy_under_way_is_given_back_when_running_requests_lack_blocks_this_step() -> None:
    """Every preserved context is already copying out: if the running requests still lack blocks for
    this very step, the copy that moved least is dropped (vLLM would preempt a running request)."""
    pool, core = pressed()
    step(core, pool, 0.01, StepView(blocks_needed=4, head_waiting=None, running_requests=2, running_tokens=1000, blocks_ahead=20))
    assert {core.entries[r].state for r in "ab"} == {KvState.SWAPPING_OUT}
    step(core, pool, 0.011, StepView(blocks_needed=12, head_waiting=None, running_requests=3, running_tokens=1000, blocks_ahead=12))
    dropped = [r for r in "ab" if core.entries[r].record.kv_fate is Fate.DEMOTED]
    assert len(dropped) == 1
    # The other copy's last blocks go in this step, which gives its 6 device blocks back too.
    kept = next(r for r in "ab" if r not in dropped)
    assert core.entries[kept].state is KvState.SWAPPED and pool.num_free_blocks() == 14 + 6
    assert core.swap.slots.num_free == 32 - 6  # the dropped copy's host slots came back


def test_copies_under_way_are_not_counted_twice_against_the_host_buffer() -> None:
    planner = SwapPlanner(PROFILE, BLOCK, host_slots=6)
    assert planner.reserve(6 * BLOCK) is not None and planner.slots.num_free == 0
    # The copy's slots are reserved: its blocks still move at the full budget (3 blocks per step).
    assert planner.budgets(6 * BLOCK, 0, 0, reserved_out_tokens=6 * BLOCK).out_tokens == 3 * BLOCK


def test_the_swap_budget_shrinks_to_the_forward_window_the_workers_measure() -> None:
    """N_i hides copies behind the forward pass; where the workers report that window, a share of the
    step (the rest is host work no copy overlaps), the budget learns the share; steps without a
    measurement leave it alone."""
    prof = dataclasses.replace(PROFILE, _ratios={})  # step_done refines the profile: not the shared one
    spec = policy_spec("swap")
    core = InterceptCore(spec, Pool(), block_size=BLOCK, profile=prof, estimator=DurationEstimator("prior", {}),
                         settings=CoreSettings(ttl_s={"default": 1.0}), swap=SwapPlanner(prof, BLOCK, 32))
    assert core.swap is not None
    assert core.swap.budgets(10 * BLOCK, 0, 0).out_tokens == 3 * BLOCK and core.swap.overlap == 1.0
    for _ in range(200):  # the forward window is half of each step
        core.step_done(0.01, {"r": 8}, resident_tokens=100, stall_s=0.0, window_s=0.005)
    assert core.swap.overlap == pytest.approx(0.5, abs=1e-3)
    assert core.swap.budgets(10 * BLOCK, 0, 0).out_tokens == 3 * BLOCK // 2  # half of 3 blocks' worth
    core.step_done(0.01, {"r": 8}, resident_tokens=100)  # estimated: no window
    assert core.swap.overlap == pytest.approx(0.5, abs=1e-3)
    # A measured stall is not forward time: the window's share is of the step less its stall.
    core.swap.overlap = 1.0
    for _ in range(200):
        core.step_done(0.015, {"r": 8}, resident_tokens=100, stall_s=0.005, window_s=0.005)
    assert core.swap.overlap == pytest.approx(0.5, abs=1e-3)


def test_new_requests_pass_a_blocked_resumed_head_for_a_bounded_number_of_steps() -> None:
    """infercept-admit: a resumed request whose KV went waits for its whole context to fit; new requests
    behind it go first, at most `new_first_max_steps` steps in a row for the same head; then first come,
    first served again (it cannot starve). Policies without `new_first` never reorder."""
    from engine_adapter.intercept.step import StepLimits, StepRequest

    pool = Pool(blocks=64)
    core = make("infercept-admit", pool)
    core.settings = dataclasses.replace(core.settings, new_first_max_steps=2)
    lim = StepLimits(token_budget=256, block_size=BLOCK, max_model_len=4096)
    pause(core, pool, "a", 600, now=1.0)  # 38 blocks
    core.free(core.entries["a"], Fate.DISCARD, 1.0)
    r = core.resume("a", now=2.0, new_arrival_time=5.0)
    assert r is not None and r.kind is ResumeKind.RECOMPUTE and r.arrival_time == 5.0  # queued at its return
    queue = [StepRequest("a", 0, 600, 0), StepRequest("n1", 0, 50, 0), StepRequest("n2", 0, 30, 0)]
    assert core.waiting_order(queue, free_blocks=37, limits=lim) == ["n1", "n2"]
    assert core.waiting_order(queue, free_blocks=37, limits=lim) == ["n1", "n2"]
    assert core.waiting_order(queue, free_blocks=37, limits=lim) == []  # its third step blocked: its turn
    assert core.passed_over_steps == 2
    assert core.waiting_order(queue, free_blocks=38, limits=lim) == []  # it fits: the count starts over
    assert core.waiting_order(queue, free_blocks=37, limits=lim) == ["n1", "n2"]
    assert core.waiting_order(queue[1:], free_blocks=0, limits=lim) == []  # a new head is never passed
    plain = make("infercept", Pool(blocks=64))
    assert plain.waiting_order(queue, free_blocks=0, limits=lim) == []


# ---------------------------------------------------------------- nothing runs, resumed requests hold the KV
def test_with_nothing_running_the_newest_kv_holding_waiting_request_is_evicted_for_the_head() -> None:
    """Three sessions resumed in place hold 18 of 20 blocks and nothing runs; the head needs 4 more blocks
    for its new tokens. vLLM admits nothing past it and preempts only running requests: without the core,
    no step would ever run. The newest holder's blocks go (it is recomputed later), and no more."""
    pool = Pool(blocks=20)
    core = make("preserve", pool)
    for rid in ("a", "b", "c"):
        pause(core, pool, rid, 6 * BLOCK, now=0.0)
    for rid in ("a", "b", "c"):
        assert core.resume(rid, 1.0, 99.0).kind is ResumeKind.KEEP
    pool.ready = ["a", "b", "c"]
    blocked = StepView(blocks_needed=4, head_waiting="a", head_blocks=4, running_requests=0)
    step(core, pool, 1.01, blocked)
    assert pool.evicted == ["c"] and pool.num_free_blocks() == 8
    assert core.ledger.totals.waiting_evictions == 1
    step(core, pool, 1.02, blocked)  # the head fits now: nothing more goes
    assert pool.evicted == ["c"]


def test_with_something_running_or_a_copy_under_way_nothing_is_evicted() -> None:
    """A running request finishes or pauses and gives blocks back; a copy to the host does too."""
    pool = Pool(blocks=20)
    core = make("preserve", pool)
    for rid in ("a", "b", "c"):
        pause(core, pool, rid, 6 * BLOCK, now=0.0)
        core.resume(rid, 1.0, 99.0)
    pool.ready = ["a", "b", "c"]
    step(core, pool, 1.01, StepView(blocks_needed=4, head_waiting="a", head_blocks=4, running_requests=1))
    assert pool.evicted == [] and core.ledger.totals.waiting_evictions == 0

    pool = Pool(blocks=20)
    core = make("swap", pool, host_slots=32)
    pool.alloc("a", 6 * BLOCK)
    pool.alloc("b", 6 * BLOCK)
    pause(core, pool, "c", 6 * BLOCK, now=0.0)  # its copy to the host starts
    pool.ready = ["a", "b"]
    step(core, pool, 0.01, StepView(blocks_needed=4, head_waiting="a", head_blocks=4, running_requests=0))
    assert core.entries["c"].state is KvState.SWAPPING_OUT and pool.evicted == []


def test_an_evicted_finished_swap_in_is_recomputed_and_its_host_copy_freed() -> None:
    pool = Pool(blocks=20)
    core = make("swap", pool, host_slots=32)
    pause(core, pool, "a", 6 * BLOCK, now=0.0)
    for t in (0.01, 0.02, 0.03):
        step(core, pool, t)
    assert core.entries["a"].state is KvState.SWAPPED
    core.resume("a", 1.0, 99.0)
    step(core, pool, 1.01)
    pool.alloc("a", 6 * BLOCK)
    core.load_allocated("a", pool.block_ids("a"), 6 * BLOCK)
    for t in (1.02, 1.03):
        step(core, pool, t)
    assert core.entries["a"].state is KvState.LOADED
    pool.alloc("b", 12 * BLOCK)  # a request resumed in place, ahead of it in the queue
    pool.ready = ["b", "a"]
    step(core, pool, 1.04, StepView(blocks_needed=4, head_waiting="b", head_blocks=4, running_requests=0))
    e = core.entries["a"]
    assert pool.evicted == ["a"] and e.state is KvState.RECOMPUTE_QUEUED and e.host is None
    assert core.swap is not None and core.swap.slots.num_free == 32
    core.scheduled([("a", 0)], 6 * BLOCK)
    assert e.record.restored_by is RestoredBy.RECOMPUTE and e.record.tokens_recomputed == 6 * BLOCK


def test_a_resumed_request_whose_prefix_came_from_a_host_tier_can_be_evicted_too() -> None:
    """Under vllm-offload a freed context's resume loads a prefix from the host tier: the request then
    waits holding blocks while its entry is still RECOMPUTE_QUEUED. Evicting it must not fail."""
    pool = Pool(blocks=20)
    core = make("discard", pool)
    pause(core, pool, "a", 6 * BLOCK, now=0.0)  # freed at the pause
    assert core.resume("a", 1.0, 99.0).kind is ResumeKind.RECOMPUTE
    pool.alloc("a", 6 * BLOCK)  # its prefix loaded back, as the offloading connector does
    pool.alloc("b", 12 * BLOCK)
    pool.ready = ["b", "a"]
    step(core, pool, 1.01, StepView(blocks_needed=4, head_waiting="b", head_blocks=4, running_requests=0))
    assert pool.evicted == ["a"] and core.entries["a"].state is KvState.RECOMPUTE_QUEUED


def test_infercept_sizes_the_swap_budget_to_the_step_being_built_and_the_paper_to_the_last_one() -> None:
    # Forward time grows with the step's tokens: 1 ms for one token, 100 ms for 1,000.
    prof = dataclasses.replace(PROFILE, fwd_tokens=(1, 1000), fwd_seconds=(0.001, 0.1))
    decode_after_prefill = StepView(0, None, running_requests=4, running_tokens=2000, step_tokens=4)
    limits = {}
    for policy in ("infercept", "infercept-paper"):
        pool = Pool()
        spec = policy_spec(policy)
        core = InterceptCore(spec, pool, block_size=BLOCK, profile=prof, estimator=DurationEstimator("prior"),
                             settings=CoreSettings(ttl_s={}), swap=SwapPlanner(prof, BLOCK, 32))
        core.swap.last_batch_tokens = 1000  # the step before was a long prefill
        core.before_schedule(lambda: decode_after_prefill, 0.0)
        limits[policy] = core.swap.limit_tokens
    # N_i = T_fwd(batch) x bandwidth / M: the 4-token step hides 4 ms of copies, the 1,000-token one 100 ms.
    bw = PROFILE.swap_in_bytes_per_s / PROFILE.kv_bytes_per_token
    assert limits == {"infercept": int(prof.t_fwd_s(4) * bw), "infercept-paper": int(0.1 * bw)}
    assert [n for n in POLICY_NAMES if policy_spec(n).swap_budget_from_step] == ["infercept", "infercept-admit",
                                                                                  "infercept-prefetch", "infercept-slack",
                                                                                  "infercept-apc"]


def test_infercept_slack_keeps_paused_kv_in_place_while_blocks_are_spare_and_swaps_once_they_are_not() -> None:
    seen: list = []
    for policy in ("infercept-admit", "infercept-slack"):
        pool = Pool(blocks=64)
        core = make(policy, pool)
        decide = core.spec.decide
        assert decide is not None
        core.spec = dataclasses.replace(core.spec, decide=lambda inp, d=decide: seen.append(inp) or d(inp))
        pause(core, pool, "tts", 4 * BLOCK, now=0.0)  # a 20 s call: worth a swap once its hold is over
        # 60 blocks free, 2 of them for this step, nothing waiting: memory is slack.
        roomy = StepView(blocks_needed=2, head_waiting=None, running_requests=2, running_tokens=200)
        step(core, pool, 0.001, roomy)
        step(core, pool, 0.03, roomy)  # past its hold (27 ms)
        if policy == "infercept-admit":
            assert core.entries["tts"].state is KvState.SWAPPING_OUT
            continue
        assert core.entries["tts"].state is KvState.PRESERVED  # kept in place: its resume needs nothing
        assert (seen[-1].free_blocks, seen[-1].head_waits) == (58, False)  # what the decision was told
        # The step takes every free block: no spare one for the batch to grow into while the context could
        # be copied out, so it is decided as infercept decides (swapped).
        tight = StepView(blocks_needed=60, head_waiting=None, running_requests=2, running_tokens=200)
        step(core, pool, 0.04, tight)
        assert seen[-1].free_blocks == 0 and core.entries["tts"].state is KvState.SWAPPING_OUT
