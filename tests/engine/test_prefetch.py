"""Prefetch for real (`infercept-prefetch`): a swapped context is copied back into blocks the paused
request holds again, before its call returns, and the resumed turn continues exactly as an uninterrupted
one, both when the copy finished first (the resume keeps the blocks) and when the resume overtook it (the
request waits, as an asynchronous KV load, for the rest of the copy in place).

Timing: the oracle estimator with each call's true duration in the session's hint (the prefetch starts
when the remaining time falls within the copy's horizon), a pinned profile (10 ms steps) and an emulated
link slow enough that a step moves a few of the context's 40 blocks. With nothing running the engine does
not step, and a copy under way waits: the first case keeps the engine stepping with a second session's
decode; the second drives the steps one at a time, so that the resume is sent while the engine is idle
and the copy unfinished, by construction rather than by winning a race."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest_asyncio

from engine_adapter.engine import InterceptEngine
from engine_adapter.hints import TURN_END_KEY, ToolHint
from engine_adapter.session import Session
from tests.conftest import tiny_config
from tests.engine.helpers import fresh_output, run_turn, wait_all_free

CALL_S = 0.3
# The paused context (its last block partly filled): several times the blocks one step moves even on a slow
# machine (8-11 blocks at the 7-9 ms steps of a 2-core AMD EPYC), so that a copy always spans steps.
CONTEXT_BLOCKS = 40
MAX_LEN = 2048
KV_BLOCKS = 96
KEEP_BUSY_TOKENS = 236  # the other session's decode: longer than the call; 8 blocks beside the context


async def _prefetches(engine: InterceptEngine) -> int:
    return (await engine.stats()).totals.prefetches


async def _fetched_back(engine: InterceptEngine, before: int) -> bool:
    """A prefetch started since `before` and its copy is done: the paused context is on the device, with
    no block left to copy in."""
    st = await engine.stats()
    return st.totals.prefetches > before and st.swap is not None and st.swap.loading_blocks == 0 and st.paused_preserved == 1


async def _paused(engine: InterceptEngine, seed: int) -> tuple[Session, list[int], list[int]]:
    """A session paused after its first turn on a call of CALL_S (declared in its hint): once the engine
    steps, its context is held one copy round trip, swapped out, and fetched back ahead of CALL_S."""
    block = (await engine.stats()).block_size
    a = engine.open_session(tools={TURN_END_KEY: ToolHint("image", expected_s=CALL_S)}, ignore_eos=True)
    prompt = [500 + (seed * 37 + i) % 900 for i in range((CONTEXT_BLOCKS - 1) * block + 2)]
    first = await run_turn(a, prompt, max_tokens=8)
    return a, prompt, first.token_ids


@pytest_asyncio.fixture
async def engine(tmp_path: Path, uses_engine: None) -> InterceptEngine:
    profile = tmp_path / "tiny-10ms.json"
    profile.write_text(json.dumps({
        "model": "tiny", "device": "cpu", "fwd_tokens": [1, 4096], "fwd_seconds": [0.01, 0.01], "saturation_tokens": 256,
        "kv_bytes_per_token": 1024, "swap_out_bytes_per_s": 1e9, "swap_in_bytes_per_s": 1e9,
    }))
    # 40 MB/s: a 32 KiB block per 0.8 ms, so N_i (the copies a step hides) is one to four blocks for the
    # tiny model's 1.5-3 ms steps on a fast machine, 8-11 on a slow one (the profile's 10 ms is refined to
    # them within the first steps): at least one, or infercept would not swap by choice, and well under
    # the context's 40, so that a fetch spans several steps.
    eng = InterceptEngine(tiny_config("infercept-prefetch", estimator="oracle", swap_link_gbps=0.04, profile=str(profile),
                                     max_model_len=MAX_LEN, num_kv_blocks=KV_BLOCKS))
    await eng.start()
    try:
        yield eng
    finally:
        await eng.shutdown()


async def test_prefetched_and_overtaken_resumes_continue_exactly(engine: InterceptEngine) -> None:
    appended = engine.encode("\nObservation: a red door.\n")

    # 1. The call returns after the prefetch: the KV is on the device when the resume comes (the test waits
    # for the copy to be done rather than for a fixed time, which a slow step could overrun).
    busy = engine.open_session(ignore_eos=True)
    a, prompt, first = await _paused(engine, 1)
    keep_busy = asyncio.create_task(run_turn(busy, list(range(100, 116)), max_tokens=KEEP_BUSY_TOKENS))
    deadline = time.monotonic() + 5 * CALL_S
    while not await _fetched_back(engine, 0):
        assert time.monotonic() < deadline and not keep_busy.done(), "no prefetch finished while the engine stepped"
        await asyncio.sleep(0.005)
    resumed = await run_turn(a, appended, max_tokens=8)
    await a.close()  # its next pause must not be prefetched meanwhile
    rec = (await engine.intercepts(a.id))[0]
    totals = (await engine.stats()).totals
    assert rec.kv_fate == "swap" and rec.restored_by == "swap", rec
    assert rec.tokens_swapped_in == len(prompt) + len(first) - 1 and rec.tokens_recomputed == 0
    assert (totals.prefetches, totals.prefetch_hits, totals.prefetch_late) == (1, 1, 0), totals
    await keep_busy
    await busy.close()
    assert resumed.token_ids == await fresh_output(engine, prompt + first + appended, 8)

    # 2. The resume overtakes the prefetch. The engine steps only while something runs (a paused request
    # with or without its blocks is not work), and a prefetch moves only in steps: so the test drives the
    # steps itself, one one-token turn of a third session at a time, until it sees the prefetch start,
    # then sends the resume with the engine idle and the copy unfinished.
    late = (await engine.stats()).totals.prefetch_late
    b, prompt, first = await _paused(engine, 2)
    before = await _prefetches(engine)
    driver = engine.open_session(ignore_eos=True)  # closed at the end: a close makes the engine step
    deadline = time.monotonic() + 20 * CALL_S
    driven = 0
    while await _prefetches(engine) == before:
        assert time.monotonic() < deadline, f"no prefetch started in {driven} driven steps"
        await run_turn(driver, [300 + driven % 64], max_tokens=1)  # one step
        driven += 1
    st = await engine.stats()
    assert st.swap is not None and st.swap.loading_blocks > 0, (
        f"the prefetch finished before the resume could overtake it: {st.swap}")
    resumed = await run_turn(b, appended, max_tokens=8)
    await b.close()
    rec = (await engine.intercepts(b.id))[0]
    assert rec.restored_by == "swap" and rec.tokens_swapped_in == len(prompt) + len(first) - 1, rec
    assert (await engine.stats()).totals.prefetch_late == late + 1
    assert resumed.token_ids == await fresh_output(engine, prompt + first + appended, 8)
    await driver.close()
    counts = await wait_all_free(engine)
    assert counts.free == counts.total and counts.host_tokens == 0, counts
