"""The engine-core process dies under the package's gateway (killed for real): health says so, the open
stream ends with an `error` event, the gateway starts a new engine and reads every session back from
the store onto exactly the context tokens it had, and the sessions go on. (The tests after this one in
the package run on the restarted engine.)"""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from gateway.client import ApiError, Event
from tests.gateway.conftest import API_KEY, Served


async def read_tokens(stream, n: int) -> list[Event]:  # type: ignore[no-untyped-def]
    seen: list[Event] = []
    async for ev in stream:
        seen.append(ev)
        if sum(1 for e in seen if e.name == "token") >= n:
            break
    return seen


async def test_engine_death_ends_streams_restarts_and_restores(served: Served) -> None:
    c, gw = served.client, served.gw
    done = await c.create_session(tools=["calculator"], max_tokens=48)
    await c.send_message(done, "What is 2 plus 3?", tool_choice={"name": "Calculator"})
    human = await c.create_session(tools=["human"], max_tokens=48)
    asked = await c.send_message(human, "Book a table", tool_choice={"name": "AskHuman"})
    busy = await c.create_session(tools=[], max_tokens=2000)
    stream = c.stream_message(busy, "Tell me a long story")
    seen = await read_tokens(stream, 3)
    context = {s.id: gw.sessions[s.id].es.context_since(0) for s in (done, human)}
    before = await c.get_session(done)
    old_engine = gw.engine
    (core,) = old_engine.core_pids()

    os.kill(core, signal.SIGKILL)
    rest = [ev async for ev in stream]
    assert rest[-1].name == "error" and rest[-1]["type"] == "engine_died"

    # The stream learned of the death from the engine's own monitor: health says so from then on, until
    # the new engine is ready.
    statuses: list[tuple[int, dict]] = []
    async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {API_KEY}"}) as raw:
        while not statuses or statuses[-1][0] != 200:
            r = await raw.get("/healthz")
            statuses.append((r.status_code, r.json()))
            if r.json()["status"] == "restarting" and len(statuses) < 3:
                during = await raw.get(f"/v1/sessions/{done.id}", headers={"X-Session-Token": done.token})
                assert during.status_code == 503 and during.json()["error"]["type"] == "not_ready" and during.headers["Retry-After"]
            assert len(statuses) < 4000, statuses[-1]
            await asyncio.sleep(0.1)
    assert statuses[0][1]["status"] == "restarting" and statuses[-1][1]["status"] == "ok"
    restarting = [body for status, body in statuses if body["status"] == "restarting"]
    assert all(status == 503 for status, body in statuses if body["status"] == "restarting")
    assert restarting[0]["error"].startswith("the engine died (") and "exited with code -9" in restarting[0]["error"]
    assert gw.engine is not old_engine and gw.metrics.engine_restarts._value.get() == 1

    # Every session back, on exactly the context tokens it had (not a re-tokenization).
    for sid, ids in context.items():
        assert gw.sessions[sid].es.history == ids and gw.sessions[sid].es.context_since(0) == ids
    after = await c.get_session(done)
    assert after["transcript"] == before["transcript"] and after["calls"] == before["calls"]
    info = await c.get_session(human)
    assert info["state"] == "awaiting_user" and info["pending_call"]["call_id"] == asked["pending_call"]["call_id"]
    info = await c.get_session(busy)
    last = info["transcript"][-1]
    assert last["interrupted"] is True and last["reason"] == "engine_died"
    assert last["content"].startswith("".join(ev["text"] for ev in seen + rest if ev.name == "token"))

    events = [ev async for ev in c.stream_message(done, "And now?")]
    resume = next(ev for ev in events if ev.name != "token")
    assert resume.name == "resume" and resume["restored_by"] == "recompute" and events[-1].name == "done"
    answered = [ev async for ev in c.stream_message(human, "7 pm")]
    assert [ev.name for ev in answered if ev.name != "token"][:2] == ["tool_result", "resume"] and answered[-1].name == "done"
    assert (await c.send_message(busy, "Short, please", tool_choice="none"))["state"] == "awaiting_user"

    for s in (done, human, busy):
        await c.close_session(s)
    with pytest.raises(ApiError) as e:
        await c.get_session(done)
    assert e.value.status == 404
    counts = await gw.engine.check_integrity()
    for _ in range(100):
        if counts.free == counts.total:
            break
        await asyncio.sleep(0.05)
        counts = await gw.engine.check_integrity()
    assert counts.free == counts.total
