"""Data parallelism through vLLM's own engine cores: every rank runs the intercept scheduler and the
swap connector, each session stays on its rank for life, stats and integrity cover every rank.

One engine with two ranks on the tiny model (two engine-core processes: vLLM's multiprocessing DP with
its coordinator). The rank choice and the stats merge are tested without an engine below."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.engine import InterceptEngine, least_loaded, merge_stats
from tests.conftest import tiny_config
from tests.engine.helpers import fresh_output, run_turn, wait_all_free


def test_least_loaded_rank_ties_to_lowest() -> None:
    assert least_loaded([0, 0]) == 0
    assert least_loaded([1, 0]) == 1
    assert least_loaded([2, 1, 1]) == 1
    assert least_loaded([]) == 0


def test_merge_stats_sums_counts_and_keeps_descriptions() -> None:
    a = {"policy": "infercept", "block_size": 16, "token_budget": 512, "blocks": {"total": 10, "free": 7},
         "waste": {"forward_s": 2.0, "recompute_forward_s": 1.0, "recompute_share_of_forward": 0.5, "by_kind": {"x": {"token_s": 1.5}}},
         "profile": {"source": "p", "saturation_tokens": 512}, "swap": None}
    b = {"policy": "infercept", "block_size": 16, "token_budget": 512, "blocks": {"total": 10, "free": 3},
         "waste": {"forward_s": 6.0, "recompute_forward_s": 0.0, "recompute_share_of_forward": 0.0, "by_kind": {"x": {"token_s": 2.5}}},
         "profile": {"source": "p", "saturation_tokens": 512}, "swap": None}
    m = merge_stats([a, b])
    assert m["blocks"] == {"total": 20, "free": 10}
    assert (m["policy"], m["block_size"], m["token_budget"]) == ("infercept", 16, 512)
    assert m["waste"]["forward_s"] == 8.0 and m["waste"]["recompute_share_of_forward"] == pytest.approx(1 / 8)
    assert m["waste"]["by_kind"]["x"]["token_s"] == 4.0
    assert m["profile"] == a["profile"] and m["swap"] is None


async def test_two_ranks_pin_sessions_pause_and_resume_on_their_own_core(uses_engine: None) -> None:
    engine = InterceptEngine(tiny_config("infercept", data_parallel_size=2))
    await engine.start()
    try:
        assert engine.ranks == 2 and len(engine.core_pids()) >= 2
        a = engine.open_session(max_tokens=6)
        b = engine.open_session(max_tokens=6)
        assert (a.rank, b.rank) == (0, 1) and engine.sessions_per_rank() == [1, 1]
        prompt = engine.encode("The capital of France is a city called")
        # Both turns end at max_tokens: each request pauses (the human's turn) in its own engine core.
        ends = await asyncio.gather(run_turn(a, prompt, 6), run_turn(b, prompt, 6))
        assert ends[0].token_ids == ends[1].token_ids  # same model, same greedy output on either rank
        total, ranks = await engine.stats_by_rank()
        assert [r.totals.intercepts for r in ranks] == [1, 1] and total.totals.intercepts == 2
        assert [r.paused for r in ranks] == [1, 1]
        assert [len(await engine.intercepts(s.id)) for s in (a, b)] == [1, 1]
        # Resumed on rank 1, the continuation is what a fresh request over the whole context gives.
        more = engine.encode(" and its river is")
        context = prompt + ends[1].token_ids + more
        resumed = await run_turn(b, more, 8)
        assert resumed.token_ids == await fresh_output(engine, context, 8)
        assert (await engine.intercepts(b.id))[0].session_id == b.id
        checks = await engine.integrity_by_rank()
        assert len(checks) == 2 and all(c.total == checks[0].total for c in checks)
        await a.close()
        c = engine.open_session(max_tokens=4)
        assert c.rank == 0  # rank 0 is now the least loaded
        await c.close()
        await b.close()
        counts = await wait_all_free(engine)
        assert counts.free == counts.total and counts.total == 2 * checks[0].total
        assert all(c.free == c.total for c in await engine.integrity_by_rank())
    finally:
        await engine.shutdown()
