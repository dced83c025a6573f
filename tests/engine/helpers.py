"""Shared steps of the engine tests: run a turn, compare with an uninterrupted request, wait for the
engine core to free everything."""

from __future__ import annotations

import asyncio

from engine_adapter.engine import InterceptEngine
from engine_adapter.events import TurnEnd
from engine_adapter.session import Session


async def run_turn(session: Session, tokens: list[int] | str, max_tokens: int) -> TurnEnd:
    end = None
    async for ev in session.turn(tokens, max_tokens=max_tokens):
        if isinstance(ev, TurnEnd):
            end = ev
    assert end is not None
    return end


async def fresh_output(engine: InterceptEngine, context: list[int], max_tokens: int) -> list[int]:
    """Greedy output of a brand-new request over `context` (the reference for resume equivalence)."""
    s = engine.open_session()
    try:
        return (await run_turn(s, context, max_tokens)).token_ids
    finally:
        await s.close()


async def fill_kv(engine: InterceptEngine, *prompts: tuple[int, int, int], max_tokens: int = 8) -> list[Session]:
    """One turn each of new sessions, run together, with prompts of (length, first token id, span): token
    ids first + i % span (ids no other test uses, so that no block is a prefix-cache hit). What the swap
    tests fill the KV with; the sessions are returned open."""
    sessions = [engine.open_session() for _ in prompts]
    await asyncio.gather(*(run_turn(s, [first + i % span for i in range(n)], max_tokens=max_tokens)
                           for s, (n, first, span) in zip(sessions, prompts)))
    return sessions


async def wait_all_free(engine: InterceptEngine) -> dict[str, int]:
    """Integrity-checked block counts once every block is free again (aborts and closes reach the
    engine core asynchronously); returns the last counts either way."""
    counts = await engine.check_integrity()
    for _ in range(100):
        if counts.free == counts.total and counts.host_tokens == 0:
            break
        await asyncio.sleep(0.05)
        counts = await engine.check_integrity()
    return counts
