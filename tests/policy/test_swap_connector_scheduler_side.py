"""The swap connector's scheduler-side bookkeeping, driven directly (no engine): slot accounting,
chunked swap-in within the per-step budget, and a request closed mid-load being reported so that vLLM
frees its blocks."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from engine_adapter.swap_connector import InterceptSwapConnector, SlotPool, SwapMeta

BLOCK = 16


def connector(slots: int) -> InterceptSwapConnector:
    c = InterceptSwapConnector.__new__(InterceptSwapConnector)  # scheduler state only, set up as _init_scheduler does
    c.block_size = BLOCK
    c.block_bytes = BLOCK * 100
    c.slots = SlotPool(slots)
    c.host, c._pending_in, c._loading, c._abandoned = {}, {}, {}, []
    c.in_budget_blocks, c.last_in_blocks, c._out = 0, 0, []
    c.stats = {"tokens_out": 0, "tokens_in": 0, "blocks_out": 0, "blocks_in": 0, "fallbacks": 0}
    return c


def blocks(ids: list[int]) -> SimpleNamespace:
    return SimpleNamespace(get_block_ids=lambda: (ids,))


def req(rid: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid)


def test_reserve_full_blocks_only_and_fallback() -> None:
    c = connector(slots=3)
    assert c.reserve("a", 40) == 32  # two full blocks; the 8-token tail is recomputed at the resume
    assert c.reserve("b", 10) == 0  # under one block: nothing to swap
    assert c.reserve("c", 48) == 0 and c.stats["fallbacks"] == 1  # needs 3 slots, 1 left
    assert c.host_tokens() == 32 and c.slots.num_free == 1


def test_swap_out_then_chunked_swap_in_within_budget() -> None:
    c = connector(slots=8)
    c.reserve("a", 64)
    assert c.plan_swap_out("a", [10, 11, 12, 13], max_blocks=3) == 3 and not c.out_complete("a")
    assert c.plan_swap_out("a", [10, 11, 12, 13], max_blocks=3) == 1 and c.out_complete("a")
    meta = c.build_connector_meta(None)
    assert [p[0] for p in meta.swap_out] == [10, 11, 12, 13]

    assert c.get_num_new_matched_tokens(req("a"), 0) == (None, False)  # on the host, not armed
    c.arm_swap_in("a")
    assert c.get_num_new_matched_tokens(req("a"), 0) == (64, True)  # asynchronous load
    c.update_state_after_alloc(req("a"), blocks([20, 21, 22, 23, 24]), 64)
    c.in_budget_blocks = 3
    m1 = c.build_connector_meta(None)
    assert m1.swap_in == [(20, 0), (21, 1), (22, 2)] and m1.loads_done == []
    m2 = c.build_connector_meta(None)
    assert m2.swap_in == [(23, 3)] and m2.loads_done == ["a"]
    assert c.restored() == ["a"] and c.slots.num_free == 8 and c.host == {}


def test_closed_while_loading_is_reported_once() -> None:
    c = connector(slots=8)
    c.reserve("a", 64)
    c.plan_swap_out("a", [1, 2, 3, 4], 4)
    c.build_connector_meta(None)
    c.arm_swap_in("a")
    c.update_state_after_alloc(req("a"), blocks([5, 6, 7, 8]), 64)
    c.in_budget_blocks = 1
    assert c.build_connector_meta(None).swap_in == [(5, 0)]
    c.request_finished(req("a"), [5, 6, 7, 8])  # the client went away mid-load
    meta = c.build_connector_meta(None)
    assert isinstance(meta, SwapMeta) and meta.swap_in == [] and meta.loads_done == ["a"]
    assert c.build_connector_meta(None).loads_done == []
    assert c.slots.num_free == 8 and c.loading_blocks() == 0
    assert isinstance(c._loading, dict) and not isinstance(c._loading.get("a"), deque)
