"""Prefetch for real (`infercept-prefetch`): a swapped context is copied back into blocks the paused
request holds again, before its call returns, and the resumed turn continues exactly as an uninterrupted
one, both when the copy finished first (the resume keeps the blocks) and when the resume overtook it (the
request waits, as an asynchronous KV load, for the rest of the copy in place).

Timing: the oracle estimator with each call's true duration in the session's hint (the prefetch starts
when the remaining time falls within the copy's horizon), a pinned profile (10 ms steps) and an emulated
link slow enough that a step moves one to four of the context's 15 blocks, and a second session whose
decoding keeps the engine stepping (with nothing running the engine does not step, and a prefetch under
way waits)."""

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
CONTEXT_BLOCKS = 15  # the paused context (its last block partly filled)
KEEP_BUSY_TOKENS = 236  # the other session's decode: longer than the call; 8 blocks beside the context's 15


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
    # tiny model's 1.5-3 ms steps (the profile's 10 ms is refined to them within the first steps): at
    # least one, or infercept would not swap by choice, and few, so that a fetch spans several steps.
    eng = InterceptEngine(tiny_config("infercept-prefetch", estimator="oracle", swap_link_gbps=0.04, profile=str(profile)))
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

    # 2. The resume overtakes the prefetch: it is sent as soon as the prefetch is seen to start (and the
    # busy session is cut); the resumed request must wait for the rest of the copy, in place. Whether it
    # lands before the last chunk depends on the steps in between (each message to the engine core waits
    # for the step under way), so this is tried a few times: every resume must continue exactly, and at
    # least one must have overtaken its copy.
    late = (await engine.stats()).totals.prefetch_late
    for attempt in range(4):
        busy = engine.open_session(ignore_eos=True)
        b, prompt, first = await _paused(engine, 2 + attempt)
        before = await _prefetches(engine)
        keep_busy = asyncio.create_task(run_turn(busy, list(range(200, 216)), max_tokens=KEEP_BUSY_TOKENS))
        deadline = time.monotonic() + 5 * CALL_S
        while await _prefetches(engine) == before:
            assert time.monotonic() < deadline and not keep_busy.done(), "no prefetch started"
            await asyncio.sleep(0.002)
        resume = asyncio.create_task(run_turn(b, appended, max_tokens=8))  # first: one step less
        keep_busy.cancel()
        resumed = await resume
        await busy.close()
        await b.close()
        rec = (await engine.intercepts(b.id))[0]
        assert rec.restored_by == "swap" and rec.tokens_swapped_in == len(prompt) + len(first) - 1, rec
        assert resumed.token_ids == await fresh_output(engine, prompt + first + appended, 8)
        if (await engine.stats()).totals.prefetch_late > late:
            break
    else:
        raise AssertionError("no resume overtook its prefetch in four tries")
    counts = await wait_all_free(engine)
    assert counts.free == counts.total and counts.host_tokens == 0, counts
