"""More paused sessions than the KV cache (and the running slots) can hold: nothing deadlocks, every
session completes, block accounting stays exact, and everything is free once the sessions close."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.engine import InterceptEngine
from engine_adapter.events import TurnEnd
from tests.conftest import TINY_KV_BLOCKS, TINY_MAX_SEQS
from tests.engine.helpers import fresh_output, run_turn, wait_all_free

N_SESSIONS = 8  # twice the running slots
PROMPT_WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi"


async def test_paused_sessions_overflowing_the_cache(policy_engine: InterceptEngine) -> None:
    engine = policy_engine
    prompts = [engine.encode(f"Session {i}: " + " ".join([PROMPT_WORDS] * 4)) for i in range(N_SESSIONS)]
    start = await engine.stats()  # the engine is shared with other tests: compare with what it had done
    block, before = start.block_size, start.totals
    per_session_blocks = -(-(len(prompts[0]) + 8) // block)
    assert per_session_blocks * N_SESSIONS > TINY_KV_BLOCKS - 1  # really more than the cache holds
    assert N_SESSIONS > TINY_MAX_SEQS

    sessions = [engine.open_session(max_tokens=8) for _ in prompts]
    integrity_failures: list[str] = []
    # Each session's context before its last turn, that turn's input and output (greedy decoding).
    last_turns: list[tuple[list[int], list[int], list[int]]] = [([], [], [])] * N_SESSIONS

    async def run(i: int) -> int:
        s = sessions[i]
        produced = 0
        context: list[int] = []
        for turn in range(3):
            tokens = prompts[i] if turn == 0 else engine.encode(f"\nObservation {turn}: done.\n")
            async for ev in s.turn(tokens, max_tokens=8):
                if isinstance(ev, TurnEnd):
                    produced += len(ev.token_ids)
                    last_turns[i] = (list(context), list(tokens), list(ev.token_ids))
                    context += tokens + list(ev.token_ids)
            # Let the calls overlap so that many sessions sit paused at once.
            await asyncio.sleep(0.05 * ((i + turn) % 3))
            try:
                await engine.check_integrity()
            except Exception as e:  # collected, asserted below
                integrity_failures.append(repr(e))
        return produced

    produced = await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(N_SESSIONS))), timeout=300)
    assert produced == [24] * N_SESSIONS
    assert not integrity_failures

    stats = await engine.stats()
    totals = stats.totals
    print(engine.config.policy, totals)
    assert totals.intercepts - before.intercepts == 3 * N_SESSIONS  # every turn ended in a pause
    assert totals.resumed - before.resumed == 2 * N_SESSIONS
    if engine.config.policy in ("preserve", "ttl"):
        # The cache cannot hold all paused sessions: some preserved KV had to be given back.
        assert totals.demoted + totals.ttl_expired > before.demoted + before.ttl_expired
    if engine.config.policy in ("swap", "infercept"):
        assert totals.swapped_out > before.swapped_out and totals.swapped_in_tokens > before.swapped_in_tokens
    if engine.config.policy == "infercept":
        # The cache cannot hold the paused sessions: infercept makes the room by copying preserved KV
        # to the host (`swap_under_pressure`), where infercept-paper demotes it.
        assert totals.pressure_swaps > before.pressure_swaps
    if engine.config.policy in ("swap", "infercept"):
        # Swap-outs give their blocks back in the step that copies them, and here, with the cache
        # full, other requests take some of them in that very step: their copies ran first.
        assert stats.swap is not None and start.swap is not None
        assert stats.swap.blocks_out_first > start.swap.blocks_out_first, stats.swap
    # Whatever became of each session's KV in between (kept, swapped, dropped, reused), its last turn
    # is what a fresh request over the same context produces.
    for context, tokens, out in last_turns:
        assert out == await fresh_output(engine, context + tokens, len(out))
    # Memory waste by kind, measured over the real iterations.
    waste = stats.waste
    kinds = waste.by_kind
    assert waste.forward_s > 0 and 0 <= waste.recompute_share_of_forward <= 1
    if totals.recomputed_tokens > 0:
        assert waste.recompute_forward_s > 0 and kinds["recompute"].gb_min > 0
    if engine.config.policy in ("preserve", "ttl"):
        assert kinds["preserved_idle"].token_s > 0
    if engine.config.policy in ("swap", "infercept"):
        # CPU copies share the cores with the forward: the workers measure what they add to each step.
        assert kinds["swap_stall"].token_s > 0 and waste.swap_stall_measured_steps > start.waste.swap_stall_measured_steps
    for s in sessions:
        await s.close()
    counts = await wait_all_free(engine)  # the closes reach the engine core asynchronously
    assert counts.free == counts.total, counts
    after = await engine.stats()
    assert after.paused == 0 and after.running == 0


@pytest.mark.policies("preserve")  # it keeps every pause in place: all three come back holding their KV
async def test_resumed_sessions_holding_the_cache_with_nothing_running_do_not_deadlock(policy_engine: InterceptEngine) -> None:
    """Three sessions pause holding 21 of the 23 blocks, and their observations arrive together (the
    scheduler is held while they do, so that all three are waiting, in place, when it builds the next
    step). Each needs 3 more blocks; 2 are free; nothing runs. vLLM admits nothing past a head that does
    not fit and preempts only running requests, so without the intercept core's eviction no step would
    ever run again. The newest holder is recomputed instead, and every turn is what a fresh request over
    the same context produces."""
    engine = policy_engine
    before = (await engine.stats()).totals
    prompts = [engine.encode(f"Session {i}: " + " ".join([PROMPT_WORDS] * 16))[:200] for i in range(3)]
    observation = engine.encode(" ".join([PROMPT_WORDS] * 8))[:100]
    assert [len(p) for p in prompts] == [200] * 3 and len(observation) == 100
    sessions = [engine.open_session(max_tokens=8) for _ in prompts]
    firsts = await asyncio.wait_for(asyncio.gather(*(run_turn(s, p, 8) for s, p in zip(sessions, prompts))), timeout=120)
    stats = await engine.stats()
    assert stats.paused == 3 and stats.blocks.free == TINY_KV_BLOCKS - 1 - 3 * 7, stats.blocks
    await engine.llm.pause_generation(mode="keep", clear_cache=False)
    try:
        turns = [asyncio.ensure_future(run_turn(s, observation, 8)) for s in sessions]
        for _ in range(200):  # until all three resumed (in place: no longer paused)
            if (await engine.stats()).paused == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        await engine.llm.resume_generation()
    seconds = await asyncio.wait_for(asyncio.gather(*turns), timeout=120)
    totals = (await engine.stats()).totals
    assert totals.waiting_evictions - before.waiting_evictions >= 1
    for p, first, second in zip(prompts, firsts, seconds):
        context = p + first.token_ids + observation
        assert second.token_ids == await fresh_output(engine, context, len(second.token_ids))
    for s in sessions:
        await s.close()
    counts = await wait_all_free(engine)
    assert counts.free == counts.total, counts
