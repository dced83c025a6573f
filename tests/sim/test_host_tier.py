"""`vllm-offload` in the simulator: vLLM's host KV tier (`benchmarks/sim/host_tier.py`), on its own with
exact numbers (the link's queue, a lookup deferred while a store is on the link, LRU eviction that
spares what a load reads) and in the engine loop (a resume loads from the host what the device's
prefix cache lost, over the link's time, where `vllm-apc` recomputes it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercept.benchmarks.replay import VARIANTS
from infercept.benchmarks.sim.host_tier import SimHostTier
from infercept.benchmarks.sim.run import outcome
from infercept.benchmarks.sim.setup import SIMULATED_LABELS
from tests.sim.helpers import STEP_S, request, toy_bench, toy_profile


def tier(capacity: int = 100, link: float | None = 1000.0, ended_first: bool = False) -> SimHostTier:
    # blocks of 4 tokens and 100 bytes: 0.1 s a block over a 1 kB/s link; copies beside the step (GPU)
    return SimHostTier(capacity, 4, 100, link, None, None, ended_first=ended_first)


def test_every_benchmark_policy_is_simulated() -> None:
    assert set(SIMULATED_LABELS) == set(VARIANTS)


def test_stores_queue_on_one_link_and_a_lookup_waits_for_them() -> None:
    t = tier()
    a, b = request("a", 10, [(1, None, 0)]), request("b", 10, [(1, None, 0)])
    a.key, b.key = 0, 1000
    a.num_computed = a.num_tokens = b.num_computed = b.num_tokens = 10  # 2 full blocks each
    stores = t.plan_stores([a, b])
    assert stores == [("a", [0, 1]), ("b", [1000, 1001])]
    t.end_step(stores, now=1.0)
    # a's two blocks take the link 1.0-1.2 s, b's 1.2-1.4 s
    assert t.next_event() == pytest.approx(1.2)
    t.now = 1.1
    assert t.lookup(a, 0) is None and t.deferred_lookups == 1  # its own stores are still on the link
    t.now = 1.2
    assert t.lookup(a, 0) == 2 and t.lookup(a, 1) == 1
    assert t.lookup(b, 0) is None
    t.now = 1.4
    assert t.lookup(b, 0) == 2
    # nothing new to store: the stored index moved past both blocks
    assert t.plan_stores([a, b]) == []


def test_a_load_takes_its_link_time_from_the_step_that_admitted_it() -> None:
    t = tier()
    a = request("a", 12, [(1, None, 0)])
    a.num_computed = a.num_tokens = 12
    t.end_step(t.plan_stores([a]), now=0.0)  # 3 blocks through at 0.3 s
    t.now = 5.0
    assert t.lookup(a, 1) == 2
    t.admit_load(a, 1, 2)
    assert t.start_step() == (1, 0.0)  # copies beside the step: nothing added to it
    assert t.poll(5.1) == [] and t.poll(5.2) == ["a"]
    assert (t.report().loads, t.report().tokens_loaded) == (1, 8)


def test_on_a_cpu_the_copies_lengthen_the_step() -> None:
    t = SimHostTier(100, 4, 100, None, copy_out_bytes_per_s=1000.0, copy_in_bytes_per_s=500.0)
    a = request("a", 8, [(1, None, 0)])
    a.num_computed = a.num_tokens = 8
    stores = t.plan_stores([a])
    assert t.store_copy_s(stores) == pytest.approx(0.2)
    t.end_step(stores, now=0.0)  # no emulated link: through when copied
    assert t.lookup(a, 0) == 2
    t.admit_load(a, 0, 2)
    assert t.start_step() == (1, pytest.approx(0.4))
    assert t.poll(0.39) == [] and t.poll(0.4) == ["a"]  # through when copied


def test_lru_eviction_spares_blocks_a_load_is_reading() -> None:
    t = tier(capacity=3, link=None)
    a, b = request("a", 8, [(1, None, 0)]), request("b", 8, [(1, None, 0)])
    a.key, b.key = 0, 1000
    a.num_computed = a.num_tokens = 8
    t.end_step(t.plan_stores([a]), now=0.0)  # keys 0, 1
    t.admit_load(a, 0, 1)  # key 0 is read (a lookup or a load does not make it recent)
    b.num_computed = b.num_tokens = 8
    t.end_step(t.plan_stores([b]), now=0.0)  # key 1000 fits; 1001 evicts key 1, the oldest not read
    assert t.lookup(a, 0) == 1 and t.lookup(b, 0) == 2
    c = request("c", 4, [(1, None, 0)])
    c.key, c.num_computed, c.num_tokens = 2000, 4, 4
    t.end_step(t.plan_stores([c]), now=0.0)  # key 1000 is the oldest not read: evicted
    assert t.lookup(b, 0) == 0 and t.lookup(c, 0) == 1


def test_a_finished_request_makes_its_blocks_the_most_recent_first_block_last() -> None:
    t = tier(capacity=3, link=None)
    a, b, c = (request(x, 8, [(1, None, 0)]) for x in "abc")
    a.key, b.key, c.key = 0, 1000, 2000
    a.num_computed = a.num_tokens = 8
    t.end_step(t.plan_stores([a]), now=0.0)  # 0, 1
    b.num_computed = b.num_tokens = 4
    t.end_step(t.plan_stores([b]), now=0.0)  # 0, 1, 1000
    t.finished(a)  # 1000, 1, 0
    c.num_computed = c.num_tokens = 4
    t.end_step(t.plan_stores([c]), now=0.0)  # evicts 1000, not a's first block
    assert t.lookup(b, 0) == 0 and t.lookup(a, 0) == 2


def test_ended_first_evicts_a_finished_requests_blocks_before_any_other_last_block_first() -> None:
    """`infercept-offload` (`host_tier.SessionEndLRU` in the engine): the finished request's blocks go
    first, the earliest finished first, each one's last block before its first."""
    t = tier(capacity=5, link=None, ended_first=True)
    a, b, c, d = (request(x, 8, [(1, None, 0)]) for x in "abcd")
    a.key, b.key, c.key, d.key = 0, 1000, 2000, 3000
    for r in (a, b):
        r.num_computed = r.num_tokens = 8
        t.end_step(t.plan_stores([r]), now=0.0)  # 0, 1, 1000, 1001
    c.num_computed = c.num_tokens = 4
    t.end_step(t.plan_stores([c]), now=0.0)  # and 2000: full
    t.finished(b)
    t.finished(a)  # ended: 1001, 1000, then 1, 0
    d.num_computed = d.num_tokens = 12
    t.end_step(t.plan_stores([d]), now=0.0)  # 3 blocks: 1001, 1000, 1 go
    assert t.lookup(c, 0) == 1 and t.lookup(a, 0) == 1 and t.lookup(b, 0) == 0 and t.lookup(d, 0) == 3


def test_a_store_takes_all_its_blocks_or_none_and_is_offered_again() -> None:
    t = tier(capacity=3)  # 0.1 s a block on the link
    a, b = request("a", 8, [(1, None, 0)]), request("b", 8, [(1, None, 0)])
    a.key, b.key = 0, 1000
    a.num_computed = a.num_tokens = 8
    t.end_step(t.plan_stores([a]), now=0.0)  # keys 0, 1 on the link until 0.2 s: not evictable
    b.num_computed = b.num_tokens = 8
    t.now = 0.1
    assert t.plan_stores([b]) == [] and t.failed_stores == 1  # 2 blocks, room for 1
    t.now = 0.2
    assert t.plan_stores([b]) == [("b", [1000, 1001])]  # offered again: key 0 evicted for it
    assert t.lookup(a, 0) == 0


def test_reusing_a_block_whose_store_is_on_the_link_waits_for_it() -> None:
    t = tier()
    a = request("a", 8, [(1, None, 0)])
    a.num_computed = a.num_tokens = 8
    a.blocks = [5, 6]
    t.end_step(t.plan_stores([a]), now=1.0)  # through at 1.2 s
    t.now = 1.05
    t.finished(a)
    t.allocated([7])
    assert t.take_stall() == 0.0
    t.allocated([6])
    assert t.take_stall() == pytest.approx(0.15)
    t.now = 1.3  # a later step: the store is through
    t.allocated([5])
    assert t.take_stall() == 0.0


def run_two(tmp_path: Path, policy: str, link_bytes_per_s: float = 1e12) -> tuple[object, object]:
    # 17 usable blocks of 16 tokens; `a` pauses with 102 tokens computed (7 blocks, 6 of them full and,
    # under vllm-offload, stored to the host); `b`'s 200-token prompt then takes 13 free blocks: the 10
    # never used, then `a`'s blocks 6, 5 and 4 (a freed request's last blocks go first). At `a`'s resume
    # the device still holds its blocks 0-3 and the host all six.
    bench = toy_bench(tmp_path, kv_tokens=17 * 16, profile=toy_profile(swap_bytes_per_s=link_bytes_per_s))
    eng = bench.engine(policy, check_every=1)
    a = request("a", 100, [(3, 1.0, 10), (2, None, 0)])
    b = request("b", 200, [(3, None, 0)], arrival=0.1)
    eng.submit(a)
    eng.submit(b)
    eng.run()
    return eng, a


def test_vllm_offload_loads_from_the_host_what_the_device_cache_lost(tmp_path: Path) -> None:
    apc, _ = run_two(tmp_path / "apc", "vllm-apc")
    off, _ = run_two(tmp_path / "off", "vllm-offload")
    rec_apc, rec_off = apc.core.ledger.records[0], off.core.ledger.records[0]
    assert (rec_apc.tokens_prefix_hit, rec_apc.tokens_recomputed) == (64, 38)
    assert (rec_off.tokens_prefix_hit, rec_off.tokens_recomputed) == (96, 6)
    host = off.stats()["host_tier"]
    assert (host["loads"], host["tokens_loaded"]) == (1, 32)  # blocks 4 and 5
    # a's 6 blocks and b's 12, each stored once; everything is given back
    assert host["blocks_stored"] == 6 + 12 + 1  # and a's seventh, completed by its resumed turn
    assert off.sched.pool.num_free() == off.sched.pool.num_blocks and not off.sched.loading
    assert apc.stats()["host_tier"] is None


def test_the_resume_waits_for_the_load_over_the_link(tmp_path: Path) -> None:
    # 2 blocks of 16 tokens x 100 B over 32 kB/s: 0.1 s on the link
    off, a = run_two(tmp_path, "vllm-offload", link_bytes_per_s=32_000.0)
    resumed = outcome(a, 0, 0.0).turns[1]
    # the load starts with the step after the call's end (a step with no forward: the toy profile gives
    # it no time) and is heard of once it is through; then one step computes the rest and samples
    assert resumed.first_s == pytest.approx(0.1 + STEP_S, abs=0.002)
