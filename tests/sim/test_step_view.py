"""The simulator and the engine's vLLM port build the core's `StepView` with the same rule
(`engine_adapter/intercept/step.py`): the same queues give the same view; and the simulator admits by
vLLM's `scheduler_reserve_full_isl`, on or off."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from vllm.v1.request import RequestStatus

from infercept.benchmarks.sim.pool import BlockPool
from infercept.benchmarks.sim.request import SimRequest, Status
from infercept.benchmarks.sim.scheduler import SimScheduler
from engine_adapter.intercept.state import StepView
from engine_adapter.vllm_port import VllmPort
from tests.sim.helpers import request

BS = 16
# (id, computed, tokens, blocks held): three running (a decodes inside its 7th block, b opens an 8th, c is a
# 200-token prompt), a session resumed in place with 30 new tokens, a 500-token prompt waiting.
RUNNING = [("a", 100, 101, 7), ("b", 112, 113, 7), ("c", 0, 200, 0)]
RESUMED = ("t", 300, 330, 19)
WAITING = ("h", 0, 500, 0)
# Budget 300: a 1 token, b 1 (1 block), c 200 (13 blocks), then t is the head: 30 tokens, 2 blocks past its 19.
EXPECTED = StepView(blocks_needed=16, head_waiting="t", head_blocks=2, running_requests=3, running_tokens=212,
                    blocks_ahead=16, step_tokens=202)


def sim_request(pool: BlockPool, rid: str, computed: int, tokens: int, blocks: int, status: Status) -> SimRequest:
    r = request(rid, tokens, [(1, None, 0)])
    r.num_computed, r.status, r.blocks = computed, status, pool.allocate(blocks)
    return r


def test_the_simulator_and_the_port_see_the_same_step() -> None:
    pool = BlockPool(64, BS, prefix_caching=False)
    sched = SimScheduler(pool, max_num_seqs=8, max_model_len=1000, token_budget=300)
    sched.running = [sim_request(pool, *r, Status.RUNNING) for r in RUNNING]
    sched.resume_in_place(sim_request(pool, *RESUMED, Status.PAUSED))
    sched.waiting = [sim_request(pool, *WAITING, Status.WAITING)]
    assert sched.step_view() == EXPECTED

    blocks: dict[str, list[Any]] = {}
    next_id = iter(range(1, 1000))

    def vllm_request(rid: str, computed: int, tokens: int, held: int, status: RequestStatus) -> SimpleNamespace:
        blocks[rid] = [SimpleNamespace(block_id=next(next_id), is_null=False) for _ in range(held)]
        return SimpleNamespace(request_id=rid, num_computed_tokens=computed, num_tokens=tokens,
                               num_tokens_with_spec=tokens, num_output_placeholders=0, status=status)

    paused = vllm_request("p", 50, 50, 4, RequestStatus.WAITING_FOR_STREAMING_REQ)  # skipped: not ready
    s = SimpleNamespace(
        running=[vllm_request(*r, RequestStatus.RUNNING) for r in RUNNING],
        kv_holding_waiting=[paused, vllm_request(*RESUMED, RequestStatus.WAITING)],
        waiting=[vllm_request(*WAITING, RequestStatus.WAITING)],
        max_num_scheduled_tokens=300, block_size=BS, max_model_len=1000, scheduler_reserve_full_isl=True,
        num_lookahead_tokens=0,
        kv_cache_manager=SimpleNamespace(coordinator=SimpleNamespace(
            single_type_managers=[SimpleNamespace(req_to_blocks=blocks)])))
    assert VllmPort(s).step_view() == EXPECTED


@pytest.mark.parametrize("reserve_full_isl", [True, False])
def test_the_simulator_admits_a_prompt_by_reserve_full_isl(reserve_full_isl: bool) -> None:
    # 8 free blocks; a 200-token prompt needs 13 in all, its first 32-token chunk 2.
    pool = BlockPool(8, BS, prefix_caching=False)
    sched = SimScheduler(pool, max_num_seqs=4, max_model_len=8192, token_budget=32, reserve_full_isl=reserve_full_isl)
    r = request("p", 200, [(1, None, 0)])
    sched.add(r)
    assert sched.step_view().head_blocks == (13 if reserve_full_isl else 2)
    out = sched.schedule()
    if reserve_full_isl:
        assert out.tokens == {} and pool.num_free() == 8 and sched.waiting == [r]
    else:
        assert out.tokens == {r: 32} and len(r.blocks) == 2 and sched.running == [r] and r.num_computed == 32


def test_the_simulator_and_the_port_move_the_same_requests_ahead() -> None:
    """`waiting_ahead` (infercept-admit's new-first order): both hand the order function the ready requests
    of the waiting queue in order with the free blocks and the step's limits, and move what it names to
    the front, keeping its order and everyone else's."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue

    from engine_adapter.intercept.step import new_first

    seen: list[tuple[list[str], int]] = []

    def order(queue: Any, free: int, limits: Any) -> list[str]:
        reqs = list(queue)
        seen.append(([r.request_id for r in reqs], free))
        return new_first(reqs[0], [r.request_id for r in reqs if r.request_id.startswith("n")], free, limits)

    # a resumed 640-token recompute (40 blocks) at the head, 30 blocks free, two new prompts behind it.
    queue = [("r", 0, 640), ("n1", 0, 50), ("x", 0, 20), ("n2", 0, 30)]
    pool = BlockPool(30, BS, prefix_caching=False)
    sched = SimScheduler(pool, max_num_seqs=8, max_model_len=1000, token_budget=256)
    sched.waiting = [sim_request(pool, rid, c, t, 0, Status.WAITING) for rid, c, t in queue]
    assert sched.waiting_ahead(order) == 2
    assert [r.rid for r in sched.waiting] == ["n1", "n2", "r", "x"]

    fcfs = FCFSRequestQueue()
    for rid, c, t in queue:
        fcfs.add_request(SimpleNamespace(request_id=rid, num_computed_tokens=c, num_tokens=t, status=RequestStatus.WAITING))
    s = SimpleNamespace(
        waiting=fcfs, max_num_scheduled_tokens=256, block_size=BS, max_model_len=1000, scheduler_reserve_full_isl=True,
        num_lookahead_tokens=0,
        kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: 30),
                                         coordinator=SimpleNamespace(single_type_managers=[SimpleNamespace(req_to_blocks={})])))
    assert VllmPort(s).waiting_ahead(order) == 2
    assert [r.request_id for r in fcfs] == ["n1", "n2", "r", "x"] and isinstance(fcfs, FCFSRequestQueue)
    assert seen[0] == seen[1] == (["r", "n1", "x", "n2"], 30)


def test_the_simulator_keeps_the_loads_it_admits_first_come_first_served() -> None:
    """vLLM's waiting scan reaches the plain waiting queue only once it has visited every KV-holding
    request, and re-queues what it skipped in the order it visited it: a load it admits lands behind
    every KV-holding request, so two loads finishing together are promoted oldest first."""
    pool = BlockPool(64, BS, prefix_caching=False)
    sched = SimScheduler(pool, max_num_seqs=8, max_model_len=1000, token_budget=300)
    # The core's KV lookup: every request's context but its last token is on the host, loaded asynchronously.
    sched.core = SimpleNamespace(swap=object(), load_lookup=lambda rid, computed: (96 - computed, True),
                                 load_allocated=lambda *args: None)
    x, y = request("x", 97, [(1, None, 0)]), request("y", 97, [(1, None, 0)])
    for r in (x, y):
        sched.add(r)
        sched.schedule()  # admitted alone in its step: blocks for what it loads, then it waits for its copies
        assert r.status is Status.LOADING and len(r.blocks) == 6  # the loaded 96 tokens; the 97th at its forward
    sched.loads_done(["y", "x"])
    sched._promote_loaded()
    assert sched.kv_holding_waiting() == ["x", "y"]


def test_the_port_finds_the_request_the_scan_stopped_at_though_vllm_deferred_it_before() -> None:
    """The admission meter asks where vLLM's waiting scan stopped. It skips a paused session (not ready),
    a swap-in the connector holds back and a request whose last output is still in flight; it stops at
    the first other one. vLLM keeps a request in `deferred_waiting` from its first skip until it runs, so
    a resumed request skipped while it was held back, and now armed but too large, is still there: it
    is the stop all the same (the meter counts the new requests behind it as waiting behind a resumed
    head, not for blocks)."""
    def req(rid: str, status: RequestStatus, stale: int = 0) -> SimpleNamespace:
        return SimpleNamespace(request_id=rid, status=status, num_computed_tokens=0, num_tokens=100,
                               num_stale_output_tokens=stale, drop_stale_output=False)

    paused = req("p", RequestStatus.WAITING_FOR_STREAMING_REQ)
    held, stale, armed, new = (req("q", RequestStatus.WAITING), req("s", RequestStatus.WAITING, stale=1),
                               req("r", RequestStatus.WAITING), req("n", RequestStatus.WAITING))
    s = SimpleNamespace(kv_holding_waiting=[paused], waiting=[held, stale, armed, new],
                        deferred_waiting=[paused, held, stale, armed])
    port = VllmPort(s)
    assert port.scan_stop(lambda rid: rid == "q") is armed
    assert port.scan_stop(lambda rid: rid in ("q", "r")) is new
