"""The session API over a real server and engine (tiny model): tool calls with intercepts, the human
and client-tool pauses, artifacts, errors, auth, isolation, disconnects, expiry and metrics."""

from __future__ import annotations

import asyncio
import re
import struct
from collections.abc import AsyncIterator

import httpx
import pytest

from engine_adapter.intercept.reports import Integrity
from gateway.client import ApiError, Event, SessionRef
from tests.gateway.conftest import API_KEY, MAX_SESSIONS, Served
from tests.waiting import wait_until

AUTH = {"Authorization": f"Bearer {API_KEY}"}


async def collect(events: AsyncIterator[Event]) -> list[Event]:
    return [ev async for ev in events]


def names(events: list[Event]) -> list[str]:
    """Event names with runs of tokens collapsed."""
    out: list[str] = []
    for ev in events:
        if ev.name == "token" and out and out[-1] == "token":
            continue
        out.append(ev.name)
    return out


async def all_free(served: Served, timeout: float = 10.0) -> Integrity:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        counts = await served.gw.engine.check_integrity()
        if counts.free == counts.total or asyncio.get_running_loop().time() > deadline:
            return counts
        await asyncio.sleep(0.05)


@pytest.fixture
async def sessions(served: Served) -> AsyncIterator[list[SessionRef]]:
    """Sessions a test opens; all closed afterwards so each test starts with free KV."""
    opened: list[SessionRef] = []
    yield opened
    for s in opened:
        await served.client.close_session(s)


async def new(served: Served, sessions: list[SessionRef], **kw: object) -> SessionRef:
    s = await served.client.create_session(**kw)  # type: ignore[arg-type]
    sessions.append(s)
    return s


async def test_health_answers_while_the_engine_starts(served: Served) -> None:
    """The engine starts off the event loop: while it built (seconds), every health check was answered
    ("starting", 503) within its 2-second timeout, then 200 (tests/gateway/conftest.wait_answering)."""
    statuses = [status for status, _ in served.startup_polls]
    assert statuses[-1] == 200 and 503 in statuses, served.startup_polls
    assert None not in statuses and max(t for _, t in served.startup_polls) < 2.0


async def test_health_models_and_auth(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as raw:
        h = (await raw.get("/healthz")).json()
        assert h == {"status": "ok", "model": "tiny", "policy": "infercept"}
        r = await raw.post("/v1/sessions", json={})
        assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized"
        r = await raw.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await raw.get("/v1/models", headers=AUTH)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"


async def test_forced_calculator_call_streams_every_event(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=["calculator"], max_tokens=48)
    assert s.tools == ["Calculator"]
    events = await collect(c.stream_message(s, "What is 2 plus 3?", tool_choice={"name": "calculator"}))
    seq = names(events)
    assert seq[:6] == ["token", "tool_call", "intercept", "tool_result", "resume", "token"] or \
        seq[:5] == ["token", "tool_call", "intercept", "tool_result", "resume"], seq
    assert seq[-1] == "done"
    by = {ev.name: ev.data for ev in events if ev.name != "token"}
    call_id = by["tool_call"]["call_id"]
    assert by["tool_call"]["tool"] == "Calculator" and by["tool_call"]["executor"] == "server"
    assert by["intercept"]["call_id"] == call_id and by["intercept"]["type"] == "math"
    assert by["intercept"]["engine_policy"] == "infercept"
    # The engine's policy is infercept: at a pause it preserves, and decides per iteration afterwards;
    # nothing else runs during this sub-millisecond call, so no iteration happens and the KV stays.
    assert by["intercept"]["policy"] == "preserve"
    assert by["intercept"]["context_tokens"] > 100
    # The random model's arguments are not arithmetic: the calculator's error is the observation.
    assert by["tool_result"]["call_id"] == call_id and isinstance(by["tool_result"]["content"], str)
    assert by["resume"]["call_id"] == call_id
    assert by["resume"]["restored_by"] == "preserve" and by["resume"]["tokens_recomputed"] == 0
    assert by["done"]["state"] == "awaiting_user" and by["done"]["usage"]["completion_tokens"] > 0
    text = "".join(ev["text"] for ev in events if ev.name == "token")
    assert re.search(r"Action: Calculator\[[^\]]+\]", text)

    info = await c.get_session(s)
    assert info["state"] == "awaiting_user"
    assert [m["role"] for m in info["transcript"]] == ["user", "assistant", "tool", "assistant"]
    [rec] = [i for i in info["intercepts"] if i["tool"] == "Calculator"]
    assert rec["type"] == "math" and rec["duration_s"] is not None and rec["restored_by"] == by["resume"]["restored_by"]
    assert info["calls"][0]["call_id"] == call_id


async def test_non_streaming_and_second_message(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=["calculator"], max_tokens=48)
    first = await c.send_message(s, "Hello", tool_choice="none")
    assert first["state"] == "awaiting_user" and first["events"][-1]["event"] == "done"
    assert first["text"].startswith("Thought: ") and "\nAnswer: " in first["text"]
    assert first["reply"] == first["text"].split("Answer: ", 1)[1].strip()
    # The next message resumes the turn-end (chat) intercept of the same engine request.
    second = await c.send_message(s, "And now?")
    kinds = [e["event"] for e in second["events"]]
    assert kinds[0] == "resume" and second["events"][0]["call_id"] is None and kinds[-1] == "done"
    info = await c.get_session(s)
    assert [m["role"] for m in info["transcript"]] == ["user", "assistant", "user", "assistant"]
    assert sum(1 for i in info["intercepts"] if i["type"] == "chat") >= 1


async def test_ask_human_pauses_until_the_next_message(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=["human"], max_tokens=48)
    first = await collect(c.stream_message(s, "Book a table", tool_choice={"name": "AskHuman"}))
    done = first[-1]
    assert done.name == "done" and done["state"] == "awaiting_user" and done["finish_reason"] == "ask_human"
    call = done["pending_call"]
    assert call["tool"] == "AskHuman" and call["kind"] == "human"
    intercept = next(e for e in first if e.name == "intercept")
    assert intercept["type"] == "chat" and intercept["expected_duration_s"] == pytest.approx(28.6)
    assert (await c.get_session(s))["state"] == "awaiting_user"
    answer = await collect(c.stream_message(s, "7 pm, two people"))
    assert names(answer)[:2] == ["tool_result", "resume"] and answer[-1].name == "done"
    assert answer[0]["call_id"] == call["call_id"] and answer[0]["content"] == "7 pm, two people"
    info = await c.get_session(s)
    assert info["calls"][0]["result"] == "7 pm, two people" and info["calls"][0]["duration_s"] > 0


async def test_client_tool_round_trip(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=[], client_tools=[{"name": "lookup", "description": "find a record", "type": "qa", "expected_s": 2.0}],
                  max_tokens=48)
    first = await collect(c.stream_message(s, "Find order 12", tool_choice={"name": "lookup"}))
    done = first[-1]
    assert done["state"] == "in_tool" and done["finish_reason"] == "tool_calls"
    call_id = done["pending_call"]["call_id"]
    intercept = next(e for e in first if e.name == "intercept")
    assert intercept["type"] == "qa" and intercept["expected_duration_s"] == 2.0
    with pytest.raises(ApiError) as e:
        await c.send_message(s, "hurry up")
    assert e.value.status == 409 and e.value.kind == "awaiting_tool_result"
    with pytest.raises(ApiError) as e:
        await c.send_tool_result(s, "call_nope", "x")
    assert e.value.status == 404
    rest = await c.send_tool_result(s, call_id, "order 12: shipped")
    kinds = [ev["event"] for ev in rest["events"]]
    assert kinds[:2] == ["tool_result", "resume"] and kinds[-1] == "done"
    with pytest.raises(ApiError) as e:
        await c.send_tool_result(s, call_id, "again")
    assert e.value.status == 409 and e.value.kind == "no_pending_call"


async def test_image_and_speech_artifacts(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=["image", "tts"], max_tokens=48)
    for tool, mime in (("Image", "image/png"), ("TTS", "audio/wav")):
        events = await collect(c.stream_message(s, "go", tool_choice={"name": tool}))
        result = next(e for e in events if e.name == "tool_result")
        assert not result["error"], result.data
        (url,) = result["artifacts"]
        assert url.startswith("/v1/artifacts/")
        async with httpx.AsyncClient(base_url=served.url) as raw:
            r = await raw.get(url)  # artifact URLs are capabilities: no key needed (an <img> can load them)
        assert r.status_code == 200 and r.headers["content-type"] == mime
        if mime == "image/png":
            assert struct.unpack(">II", r.content[16:24]) == (64, 64)
        else:
            assert r.content[:4] == b"RIFF" and r.content[8:12] == b"WAVE"
        intercept = next(e for e in events if e.name == "intercept")
        assert intercept["type"] == {"Image": "image", "TTS": "tts"}[tool]
    async with httpx.AsyncClient(base_url=served.url) as raw:
        assert (await raw.get("/v1/artifacts/nope.png")).status_code == 404


async def test_alfworld_tool_plays_the_session_game(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=["alfworld"], max_tokens=48)
    events = await collect(c.stream_message(s, "play", tool_choice={"name": "ALFWorld"}))
    result = next(e for e in events if e.name == "tool_result")
    assert "-= " in result["content"]  # the game's first observation (room heading)
    assert next(e for e in events if e.name == "intercept")["type"] == "ve"


async def test_bad_requests_get_clear_errors(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=["calculator"])
    h = {**AUTH, "X-Session-Token": s.token}
    async with httpx.AsyncClient(base_url=served.url, headers=h) as raw:
        async def err(method: str, path: str, status: int, kind: str, **kw: object) -> dict:
            r = await raw.request(method, path, **kw)  # type: ignore[arg-type]
            assert r.status_code == status, r.text
            body = r.json()["error"]
            assert body["type"] == kind and body["message"]
            return body

        await err("POST", f"/v1/sessions/{s.id}/messages", 400, "invalid_json", content=b"{")
        await err("POST", f"/v1/sessions/{s.id}/messages", 400, "invalid_request", content=b"[1]")
        await err("POST", f"/v1/sessions/{s.id}/messages", 400, "invalid_request", json={"content": 5})
        await err("POST", f"/v1/sessions/{s.id}/messages", 400, "invalid_request", json={})
        await err("POST", f"/v1/sessions/{s.id}/messages", 400, "invalid_request", json={"content": "hi", "stream": "yes"})
        await err("POST", f"/v1/sessions/{s.id}/messages", 400, "invalid_request", json={"content": "hi", "tool_choice": "sometimes"})
        await err("POST", f"/v1/sessions/{s.id}/messages", 400, "unknown_tool", json={"content": "hi", "tool_choice": {"name": "Image"}})
        await err("POST", f"/v1/sessions/{s.id}/messages", 413, "message_too_long", json={"content": "x" * 20001})
        body = await err("POST", f"/v1/sessions/{s.id}/messages", 413, "context_too_long", json={"content": "seven " * 3000})
        assert body["limit"] == 2048 and body["tokens"] > 2048
        await err("POST", "/v1/sessions", 400, "unknown_tool", json={"tools": ["abacus"]})
        await err("POST", "/v1/sessions", 400, "invalid_request", json={"tools": "calculator"})
        await err("POST", "/v1/sessions", 400, "invalid_request", json={"max_tokens": 0})
        await err("POST", "/v1/sessions", 400, "invalid_request", json={"max_tokens": True})
        await err("POST", "/v1/sessions", 400, "invalid_request", json={"client_tools": [{"name": "calculator"}], "tools": ["calculator"]})
        await err("GET", "/v1/sessions/sess-nope", 404, "not_found")
        await err("POST", f"/v1/sessions/{s.id}/tool_results", 409, "no_pending_call", json={"call_id": "c", "content": "x"})
        await err("GET", "/v1/nothing-here", 404, "not_found")
    # The session survived all of it.
    ok = await c.send_message(s, "hi", tool_choice="none")
    assert ok["state"] == "awaiting_user"


async def test_session_isolation(served: Served, sessions: list[SessionRef]) -> None:
    a = await new(served, sessions)
    b = await new(served, sessions)
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as raw:
        for path, method in ((f"/v1/sessions/{b.id}", "GET"), (f"/v1/sessions/{b.id}/messages", "POST"), (f"/v1/sessions/{b.id}", "DELETE")):
            r = await raw.request(method, path, headers={"X-Session-Token": a.token}, json={"content": "x"})
            assert r.status_code == 403 and r.json()["error"]["type"] == "forbidden"
            r = await raw.request(method, path, json={"content": "x"})
            assert r.status_code == 403
    assert (await served.client.get_session(b))["state"] == "awaiting_user"


async def test_at_the_session_limit_the_idle_ones_hibernate_and_come_back(served: Served, sessions: list[SessionRef]) -> None:
    """`server.max_sessions` bounds sessions in memory, not sessions: at the limit, a new session sends the
    least recently active idle one out of memory (committed, its engine request and KV freed), and that one
    comes back, read from the store, at its next request, its context recomputed."""
    gw, c = served.gw, served.client
    first = await new(served, sessions, tools=[])
    await c.send_message(first, "Hello", tool_choice="none")
    before = (await c.get_session(first))
    open_now = sum(1 for sid in gw.sessions if sid.startswith("sess-"))
    for _ in range(MAX_SESSIONS - open_now):
        await new(served, sessions)
    hibernated = gw.metrics.sessions_hibernated._value.get()
    oldest = min((s for s in gw.sessions.values() if s.id.startswith("sess-")), key=lambda s: s.last_active_s).id
    await new(served, sessions)  # one more than the limit: room is made
    assert gw.metrics.sessions_hibernated._value.get() == hibernated + 1
    assert oldest not in gw.sessions and sum(1 for sid in gw.sessions if sid.startswith("sess-")) == MAX_SESSIONS
    assert first.id in gw.sessions or oldest == first.id
    # Hibernate "first" for certain (as the idle timer does), then read it back by asking for it.
    if first.id in gw.sessions:
        assert await gw.table._hibernate(gw.sessions[first.id])
    rehydrated = gw.metrics.sessions_rehydrated._value.get()
    back = await c.get_session(first)
    # As it was, but for what became of its last pause's KV (freed when the session left memory).
    assert {k: v for k, v in back.items() if k != "intercepts"} == {k: v for k, v in before.items() if k != "intercepts"}
    assert [i["intercept_id"] for i in back["intercepts"]] == [i["intercept_id"] for i in before["intercepts"]]
    assert gw.metrics.sessions_rehydrated._value.get() == rehydrated + 1 and first.id in gw.sessions
    events = [ev async for ev in c.stream_message(first, "And again?", tool_choice="none")]
    resume = next(ev for ev in events if ev.name == "resume")
    assert resume["restored_by"] == "recompute" and resume["after"] == "hibernation" and events[-1].name == "done"
    # Requests at the limit at once share the work: one session leaves memory for each new one, no more.
    hibernated = gw.metrics.sessions_hibernated._value.get()
    await asyncio.gather(*(new(served, sessions) for _ in range(3)))
    assert gw.metrics.sessions_hibernated._value.get() == hibernated + 3
    assert sum(1 for sid in gw.sessions if sid.startswith("sess-")) == MAX_SESSIONS


async def test_idle_sessions_leave_memory_after_hibernate_s_and_are_removed_after_session_idle_s(
        served: Served, sessions: list[SessionRef]) -> None:
    """The expiry loop's rounds (`Gateway.expire_idle`) on real sessions: a session waiting for its user past
    `hibernate_s` leaves memory (a recent one stays), answers its next message from the store, and once
    hibernated past `session_idle_s` it is removed from the store: 404 afterwards, as a live one would be.
    The gateway is shared, so the times are far beyond any other test's: `old` is made idle 10,000 s and
    the limits are 5,000 s."""
    gw, c = served.gw, served.client
    old = await new(served, sessions, tools=[])
    await c.send_message(old, "Hello", tool_choice="none")
    recent = await new(served, sessions, tools=[])
    gw.sessions[old.id].last_active_s -= 10_000.0  # idle 10,000 s by the server's clock
    hibernated = gw.metrics.sessions_hibernated._value.get()
    assert await gw.table.hibernate_idle(5_000.0) >= 1
    assert old.id not in gw.sessions and recent.id in gw.sessions
    assert gw.metrics.sessions_hibernated._value.get() >= hibernated + 1
    # Its next message reads it back from the store (its context recomputed), and it is in memory again.
    rehydrated = gw.metrics.sessions_rehydrated._value.get()
    events = [ev async for ev in c.stream_message(old, "Still there?", tool_choice="none")]
    assert events[-1].name == "done" and old.id in gw.sessions
    assert gw.metrics.sessions_rehydrated._value.get() == rehydrated + 1
    # Hibernated again, then idle past session_idle_s (here 5,000 s: it was last active 10,000 s ago):
    # removed from the store, and every request for it is 404.
    gw.sessions[old.id].last_active_s -= 10_000.0
    assert await gw.table.hibernate_idle(5_000.0) >= 1 and old.id not in gw.sessions
    assert gw.ctx is not None
    sessions.remove(old)  # gone whatever the asserts below find: the fixture must not close it
    assert await gw.table.expire_hibernated(gw.ctx, 5_000.0) >= 1
    assert await gw.table.store.get(old.id) is None
    with pytest.raises(ApiError) as e:
        await c.get_session(old)
    assert e.value.status == 404
    assert (await c.get_session(recent))["id"] == recent.id and recent.id in gw.sessions


async def test_with_every_session_in_memory_busy_a_new_one_is_429_with_retry_after() -> None:
    from gateway.http import ApiError as ServerError
    from gateway.session_table import SessionTable
    from gateway.store import SqliteStore

    store = SqliteStore(":memory:")
    try:
        with pytest.raises(ServerError) as e:
            await SessionTable(store).make_room(0)  # nothing idle to send out of memory
        assert e.value.status == 429 and e.value.kind == "too_many_sessions" and e.value.extra["retry_after"] > 0
    finally:
        await store.close()


async def test_busy_session_is_409_and_disconnect_aborts_and_frees_kv(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=[], max_tokens=2000)
    before = served.gw.metrics.disconnects._value.get()
    seen = 0
    async with httpx.AsyncClient(base_url=served.url, headers={**AUTH, "X-Session-Token": s.token}) as raw:
        async with raw.stream("POST", f"/v1/sessions/{s.id}/messages", json={"content": "Tell me a long story"}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("event: token"):
                    seen += 1
                if seen == 3:
                    # While it generates, a second message is refused.
                    with pytest.raises(ApiError) as e:
                        await c.send_message(s, "me too")
                    assert e.value.status == 409 and e.value.kind == "session_busy"
                    break  # leaving the block drops the connection mid-stream
    counts = await all_free(served)
    assert counts.free == counts.total, counts
    for _ in range(100):
        if served.gw.metrics.disconnects._value.get() > before:
            break
        await asyncio.sleep(0.05)
    assert served.gw.metrics.disconnects._value.get() == before + 1
    info = await c.get_session(s)
    assert info["state"] == "awaiting_user"
    assert served.gw.ctx is not None
    prompt = len(served.gw.engine.encode(served.gw.ctx.prompts.opening(None, [], [], "Tell me a long story")))
    assert info["context_tokens"] >= prompt + 3  # what was generated before the abort stays in the context
    # The session is still usable.
    again = await c.send_message(s, "Short answer please", tool_choice="none")
    assert again["state"] == "awaiting_user"


async def test_delete_frees_kv_and_idle_sessions_expire(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=["calculator"])
    await c.send_message(s, "hi", tool_choice="none")
    # Paused at the end of its turn (a chat intercept) with its KV preserved: nothing else runs, so
    # infercept has no iteration in which to move it. The engine holds exactly its context's blocks.
    stats, info = await c.stats(), await c.get_session(s)
    assert stats["paused"] == 1 and info["intercepts"][-1]["kv_fate"] == "preserve"
    kv_tokens = info["context_tokens"] - 1  # the last sampled token is fed with the next message
    assert stats["blocks"]["preserved"] == -(-kv_tokens // stats["block_size"])
    await c.close_session(s)
    sessions.remove(s)
    with pytest.raises(ApiError) as e:
        await c.get_session(s)
    assert e.value.status == 404
    counts = await all_free(served)
    assert counts.free == counts.total

    idle = await new(served, sessions)
    await c.send_message(idle, "hi", tool_choice="none")
    served.gw.sessions[idle.id].last_active_s -= served.gw.config.server.session_idle_s + 1
    assert await served.gw.expire_idle() == 1
    with pytest.raises(ApiError) as e:
        await c.get_session(idle)
    assert e.value.status == 404
    sessions.remove(idle)
    assert (await all_free(served)).free == counts.total


async def test_delete_while_generating_ends_the_stream(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client
    s = await new(served, sessions, tools=[], max_tokens=2000)
    events: list[Event] = []

    async def read() -> None:
        async for ev in c.stream_message(s, "Tell me a long story"):
            events.append(ev)

    reader = asyncio.create_task(read())
    await wait_until(lambda: events or reader.done(), 120, "the first event of the stream")
    assert events, reader
    await c.close_session(s)
    sessions.remove(s)
    await asyncio.wait_for(reader, 10)
    assert events[-1].name == "error" and events[-1]["type"] == "session_closed"
    assert (await all_free(served)).free == (await served.gw.engine.check_integrity()).total


async def test_metrics_move_with_intercepts(served: Served, sessions: list[SessionRef]) -> None:
    c = served.client

    def value(text: str, name: str, **labels: str) -> float:
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if all(f'{k}="{v}"' in line for k, v in labels.items()):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    before = await c.metrics()
    s = await new(served, sessions, tools=["calculator"], max_tokens=48)
    await c.send_message(s, "2+2?", tool_choice={"name": "Calculator"})
    after = await c.metrics()
    assert value(after, "infercept_intercepts_total", type="math") == value(before, "infercept_intercepts_total", type="math") + 1
    assert value(after, "infercept_tool_latency_seconds_count", tool="Calculator") == \
        value(before, "infercept_tool_latency_seconds_count", tool="Calculator") + 1
    assert value(after, "infercept_engine_intercepts") > value(before, "infercept_engine_intercepts")
    total = sum(value(after, "infercept_kv_blocks", state=st) for st in ("free", "running", "preserved"))
    assert total == 199  # 200 blocks less vLLM's null block
    assert value(after, "infercept_sessions", state="awaiting_user") >= 1
    for name in ("infercept_memory_waste_gb_minutes", "infercept_swap_bytes", "infercept_recomputed_tokens"):
        assert name in after
    # vLLM's own families beside ours, so vLLM dashboards work unchanged.
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:inter_token_latency_seconds_count"):
        assert re.search(rf"^{re.escape(name)}{{", after, re.M), name
    assert value(after, "vllm:time_to_first_token_seconds_count") > value(before, "vllm:time_to_first_token_seconds_count")
    assert value(after, "vllm:generation_tokens_total") > value(before, "vllm:generation_tokens_total")


async def test_json_tool_calls_use_vllms_hermes_parser(served: Served) -> None:
    assert served.gw.ctx is not None
    calls = served.gw.ctx.calls
    assert calls.json_calls('<tool_call>{"name": "tts", "arguments": {"text": "hello"}}</tool_call>') == [("tts", '{"text": "hello"}')]
    assert calls.parse("tool_call", None, '{"name": "calculator", "arguments": {"expression": "2+2"}}') == ("calculator", "2+2")
    assert calls.parse("tool_call", None, "not json") == ("unparsable", "not json")
    assert calls.parse("react", "Calculator", " 1+1 ") == ("Calculator", "1+1")


async def test_sync_client(served: Served) -> None:
    from gateway.client import Client

    def run() -> list[str]:
        with Client(served.url, api_key=API_KEY) as c:
            s = c.create_session(tools=["calculator"], max_tokens=48)
            seq = [ev.name for ev in c.stream_message(s, "1+1?", tool_choice={"name": "Calculator"})]
            c.close_session(s)
            return seq

    seq = await asyncio.to_thread(run)
    assert "tool_call" in seq and "tool_result" in seq and seq[-1] == "done"


async def test_format_react_constrains_every_turn_to_one_step(served: Served, sessions: list[SessionRef]) -> None:
    """`format: react`: every model turn is one ReAct step (structured outputs), so even the random
    model writes a well-formed step each turn and never an observation of its own."""
    c = served.client
    s = await new(served, sessions, tools=["calculator"], max_tokens=64)
    events = await collect(c.stream_message(s, "What is 3 times 4?", step_format="react"))
    assert events[-1].name == "done" and events[-1]["reprompts"] == 0
    turns, text = [], ""
    for ev in events:
        if ev.name == "token":
            text += ev["text"]
        elif ev.name in ("tool_call", "done"):
            turns.append(text)
            text = ""
    step = re.compile(r"Thought: [^\n]{1,200}\n(Action: Calculator\[[^\n\]\[]{1,200}\]|Answer: [^\n]{1,200})")
    assert turns and all(step.fullmatch(t) for t in turns), turns
    assert "Observation:" not in "".join(turns)
    r = await c.http.post(f"/v1/sessions/{s.id}/messages", json={"content": "x", "format": "json"},
                          headers={"X-Session-Token": s.token})
    assert r.status_code == 400 and "format" in r.json()["error"]["message"]
