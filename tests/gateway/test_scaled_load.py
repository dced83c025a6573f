"""`infercept loadtest`'s sessions and disconnect phases, scaled down onto the package's shared gateway
(tiny model), with the same clients and the same verdicts: 200 sessions connecting at once, each a
message that must call the calculator; 100 clients that drop their stream mid-turn. The engine's own
integrity check closes each."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from infercept import load_verdict
from infercept.loadtest import phase_disconnects, phase_sessions
from tests.gateway.conftest import API_KEY, Served

SESSIONS = 200
DISCONNECTS = 100
TURN_TOKENS = 48  # the dropped turns: long enough to still stream after the client's 3 tokens


@pytest.fixture
def roomy(served: Served) -> Iterator[None]:
    """The shared gateway with room for this many sessions and turns at once (its default is 6)."""
    gw = served.gw
    original = gw.config
    gw.config = dataclasses.replace(original, server=dataclasses.replace(
        original.server, max_sessions=SESSIONS + 50, max_queued_turns=SESSIONS + 50))
    yield
    gw.config = original


async def all_free(served: Served) -> None:
    for _ in range(100):
        counts = await served.gw.engine.check_integrity()  # raises if the block books are broken
        if counts.free == counts.total:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"KV blocks still held: {counts}")


async def test_200_sessions_at_once_each_calling_the_calculator(served: Served, roomy: None) -> None:
    before = served.gw.durable_sessions()
    out = await asyncio.wait_for(phase_sessions(SimpleNamespace(url=served.url), SESSIONS, key=API_KEY), 300)  # type: ignore[arg-type]
    verdict = load_verdict.judge("sessions", out)
    assert verdict["pass"], (verdict["failures"], out)
    assert out["done"] == SESSIONS and out["http_5xx"] == 0 and out["tool_calls"] == SESSIONS
    await all_free(served)
    assert served.gw.durable_sessions() == before  # every one deleted


async def test_100_clients_disconnecting_mid_stream(served: Served, roomy: None) -> None:
    before = served.gw.durable_sessions()
    out = await asyncio.wait_for(phase_disconnects(SimpleNamespace(url=served.url), DISCONNECTS, key=API_KEY,  # type: ignore[arg-type]
                                                   turn_tokens=TURN_TOKENS), 300)
    verdict = load_verdict.judge("disconnects", out)
    assert verdict["pass"], (verdict["failures"], out)
    assert out["after_drop"]["leaked_blocks"] == 0 and out["after_drop"]["running"] == 0
    assert out["still_usable"]["done"] == DISCONNECTS  # every session answered a new message after its drop
    assert out["server_counted_disconnects"] >= out["dropped_mid_stream"] * 0.9
    await all_free(served)
    assert served.gw.durable_sessions() == before
