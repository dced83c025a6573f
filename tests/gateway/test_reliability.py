"""Faults, pressure and the contract, on the package's real gateway (tiny model): tool executors that
raise, hang past their timeout, return too much, or lose their worker; keep-alive pings; 429/503 with
Retry-After; the OpenAPI document and real responses checked against it; validation errors that name
the field; rows removed by DELETE and expiry; a disconnect committed as an interrupted turn."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from pydantic import TypeAdapter

from augmentations.base import Artifact, CallContext, ToolResult
from augmentations.workers import WorkerPool
from gateway.client import ApiError, Event, SessionRef
from gateway.config import load_gateway_config
from gateway.durable import fold
from gateway.schemas import (
    EVENTS,
    Health,
    MessageResult,
    SessionCreated,
    SessionInfo,
    Stats,
    ToolList,
)
from gateway.schemas_openai import ChatCompletion, ModelList
from tests.gateway.conftest import API_KEY, MAX_SESSIONS, Served

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PNG = b"\x89PNG\r\n\x1a\n not really an image"


class Fault:
    """A test executor: what `run` does is the fault."""

    aug_type = "math"

    def __init__(self, name: str) -> None:
        self.name, self.description = name, f"the {name} fault"
        self.calls = 0
        self.release = threading.Event()
        self.pool = WorkerPool(name.lower(), kind="process" if name == "Crash" else "thread")

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        self.calls += 1
        if self.name == "Boom":
            raise RuntimeError("kaboom")
        if self.name == "Big":
            return ToolResult("x" * 5000)
        if self.name == "Pic":
            return ToolResult("made a picture", artifacts=(Artifact("image", "image/png", PNG),))
        if self.name == "Slow":
            await asyncio.sleep(1.6)  # three ping intervals
            return ToolResult("slow but fine")
        if self.name == "Hang":  # the first call never returns; the next runs on a new worker
            return ToolResult(await self.pool.run(self.release.wait) if self.calls == 1 else await self.pool.run(str, "fresh worker"))
        assert self.name == "Crash"  # the first call kills its worker process; the next gets a new one
        return ToolResult(str(await self.pool.run(os._exit, 3) if self.calls == 1 else await self.pool.run(os.getpid)))

    async def close(self) -> None:
        self.release.set()
        self.pool.close()


@pytest.fixture
async def faults(served: Served) -> AsyncIterator[dict[str, Fault]]:
    tools = {name: Fault(name) for name in ("Boom", "Hang", "Big", "Crash", "Slow", "Pic")}
    for t in tools.values():
        served.gw.registry.add(t)
    served.gw.timeouts["Hang"] = 0.5
    yield tools
    for t in tools.values():
        served.gw.registry.remove(t.name)
        await t.close()
    served.gw.timeouts.pop("Hang")


@pytest.fixture
async def sessions(served: Served) -> AsyncIterator[list[SessionRef]]:
    opened: list[SessionRef] = []
    yield opened
    for s in opened:
        await served.client.close_session(s)


async def call(served: Served, s: SessionRef, tool: str) -> list[Event]:
    events = [ev async for ev in served.client.stream_message(s, "go", tool_choice={"name": tool})]
    assert events[-1].name == "done", events[-1]
    return events


def result_of(events: list[Event]) -> Event:
    return next(ev for ev in events if ev.name == "tool_result")


async def test_tool_faults_become_observations(served: Served, faults: dict[str, Fault], sessions: list[SessionRef]) -> None:
    s = await served.client.create_session(tools=list(faults), max_tokens=48)
    sessions.append(s)

    boom = result_of(await call(served, s, "Boom"))
    assert boom["error"] is True and boom["content"] == "Error: Boom failed (RuntimeError: kaboom)."

    hang = result_of(await call(served, s, "Hang"))
    assert hang["error"] is True and hang["content"] == "Error: Hang timed out after 0.5 s."
    assert faults["Hang"].pool.replaced == 1  # its stuck thread was retired...
    again = result_of(await call(served, s, "Hang"))
    assert again["content"] == "fresh worker" and again["error"] is False  # ...and the next call ran at once

    big = result_of(await call(served, s, "Big"))
    limit = served.gw.config.result_limit
    assert big["content"] == "x" * limit + f" ...[truncated: the tool returned 5000 characters; the first {limit} are shown]"

    crash = result_of(await call(served, s, "Crash"))
    assert crash["error"] is True and crash["content"].startswith("Error: the crash worker process died under the call")
    pid = result_of(await call(served, s, "Crash"))
    assert pid["error"] is False and int(pid["content"]) != os.getpid() and faults["Crash"].pool.replaced == 1

    info = await served.client.get_session(s)
    assert info["state"] == "awaiting_user"
    assert [m["content"] for m in info["transcript"] if m["role"] == "tool"] == \
        [r["content"] for r in (boom, hang, again, big, crash, pid)]


async def test_quiet_streams_get_pings(served: Served, faults: dict[str, Fault], sessions: list[SessionRef]) -> None:
    s = await served.client.create_session(tools=["Slow"], max_tokens=48)
    sessions.append(s)
    lines: list[str] = []
    async with httpx.AsyncClient(base_url=served.url, headers={**AUTH, "X-Session-Token": s.token}, timeout=60) as raw:
        async with raw.stream("POST", f"/v1/sessions/{s.id}/messages", json={"content": "go", "tool_choice": {"name": "Slow"}}) as r:
            async for line in r.aiter_lines():
                lines.append(line)
    call_at = lines.index("event: tool_call")
    result_at = lines.index("event: tool_result")
    assert ": ping" in lines[call_at:result_at]  # the tool ran for three ping intervals
    assert lines[-2].startswith("data: ") and lines[-3] == "event: done"


async def test_a_stream_opens_and_pings_before_its_first_event(served: Served, sessions: list[SessionRef]) -> None:
    s = await served.client.create_session(tools=[], max_tokens=8)
    sessions.append(s)
    live = served.gw.sessions[s.id]
    gate = asyncio.Event()
    commit = live.commit

    async def held_commit() -> None:  # the first batch waits, as a turn queued behind load does
        await gate.wait()
        await commit()

    live.commit = held_commit  # type: ignore[method-assign]
    try:
        async with httpx.AsyncClient(base_url=served.url, headers={**AUTH, "X-Session-Token": s.token}, timeout=60) as raw, \
                raw.stream("POST", f"/v1/sessions/{s.id}/messages", json={"content": "hi", "tool_choice": "none"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = r.aiter_lines()
            early = [await asyncio.wait_for(lines.__anext__(), 5) for _ in range(2)]  # no event can have come yet
            assert early == [": ping", ""]
            gate.set()
            rest = [line async for line in lines]
    finally:
        del live.commit
    assert "event: done" in rest


async def test_overload_and_draining_answer_with_retry_after(served: Served, sessions: list[SessionRef]) -> None:
    gw = served.gw
    c = served.client
    busy = await c.create_session(tools=[], max_tokens=2000)
    other = await c.create_session(tools=[])
    sessions += [busy, other]
    original = gw.config
    gw.config = dataclasses.replace(original, server=dataclasses.replace(original.server, max_queued_turns=1))
    try:
        stream = c.stream_message(busy, "Tell me a long story")
        first = await stream.__anext__()
        assert first.name in ("token", "resume")
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as raw:
            r = await raw.post(f"/v1/sessions/{other.id}/messages", json={"content": "hi"}, headers={"X-Session-Token": other.token})
            assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded" and r.headers["Retry-After"] == "1"
            r = await raw.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        await stream.aclose()  # a disconnect: the turn ends, its slot frees
    finally:
        gw.config = original
    assert (await c.send_message(other, "hi", tool_choice="none"))["state"] == "awaiting_user"

    for _ in range(MAX_SESSIONS - gw.durable_sessions()):
        sessions.append(await c.create_session(tools=[]))
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as raw:
        # At the limit of sessions in memory, an idle one leaves memory for the new one (the 429 when
        # every one is busy: tests/gateway/test_sessions_api.py).
        r = await raw.post("/v1/sessions", json={})
        assert r.status_code == 201
        sessions.append(SessionRef(r.json()["id"], r.json()["token"]))
        gw.draining = True
        try:
            health = await raw.get("/healthz")
            assert health.status_code == 503 and health.json()["status"] == "draining"
            r = await raw.post(f"/v1/sessions/{other.id}/messages", json={"content": "hi"}, headers={"X-Session-Token": other.token})
            assert r.status_code == 503 and r.json()["error"]["type"] == "draining" and int(r.headers["Retry-After"]) > 0
        finally:
            gw.draining = False


async def test_delete_and_expiry_remove_rows_and_a_disconnect_is_committed(served: Served, sessions: list[SessionRef]) -> None:
    c, store = served.client, served.gw.store
    s = await c.create_session(tools=[], max_tokens=2000)
    stored = await store.get(s.id)
    assert stored is not None and s.token not in str(stored.head) and stored.token_hash != s.token

    stream = c.stream_message(s, "Tell me a long story")
    seen = ""
    async for ev in stream:
        seen += ev["text"] if ev.name == "token" else ""
        if len(seen) > 10:
            break
    await stream.aclose()  # the client goes away mid-turn
    for _ in range(200):
        info = await c.get_session(s)
        if info["transcript"][-1:] and info["transcript"][-1]["role"] == "assistant":
            break
        await asyncio.sleep(0.05)
    last = info["transcript"][-1]
    assert last["interrupted"] is True and last["reason"] == "client_disconnected" and last["content"].startswith(seen)
    stored = await store.get(s.id)
    assert stored is not None and fold(stored.head, stored.events).transcript == info["transcript"]
    assert fold(stored.head, stored.events).context == served.gw.sessions[s.id].es.context_since(0)

    await c.close_session(s)
    assert await store.get(s.id) is None

    idle = await c.create_session(tools=[])
    await c.send_message(idle, "hi", tool_choice="none")
    assert await store.get(idle.id) is not None
    served.gw.sessions[idle.id].last_active_s -= served.gw.config.server.session_idle_s + 1
    assert await served.gw.expire_idle() == 1
    assert await store.get(idle.id) is None


async def test_openapi_document_covers_every_route(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as raw:
        doc = (await raw.get("/openapi.json")).json()
    assert doc["openapi"] == "3.1.0"
    routes = {(r.method.lower(), r.resource.canonical) for r in served_app_routes(served)}
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert routes - documented == set()
    msg = doc["paths"]["/v1/sessions/{sid}/messages"]["post"]
    assert {p["name"] for p in msg["parameters"]} == {"sid", "X-Session-Token"}
    assert msg["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/PostMessage"}
    events = msg["responses"]["200"]["content"]["text/event-stream"]["schema"]["oneOf"]
    assert [e["properties"]["event"]["const"] for e in events] == list(EVENTS)
    assert set(msg["responses"]) == {"200", "400", "401", "403", "404", "409", "410", "413", "500", "503"}
    assert msg["responses"]["503"]["headers"]["Retry-After"]["schema"] == {"type": "integer"}
    assert doc["paths"]["/v1/chat/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/v1/artifacts/{aid}"]["get"]
    for name in ("ChatCompletionRequest", "CreateSession", "DoneEvent", "ErrorBody", "SessionInfo"):
        assert name in doc["components"]["schemas"]


def served_app_routes(served: Served) -> list[web.AbstractRoute]:
    """The running app's routes, the static folder left out."""
    return [r for r in served.app.router.routes() if r.method != "HEAD" and not r.resource.canonical.startswith("/static")]


async def test_real_responses_match_the_documented_models(served: Served, sessions: list[SessionRef]) -> None:
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=120) as raw:
        Health.model_validate((await raw.get("/healthz")).json())
        ToolList.model_validate((await raw.get("/v1/tools")).json())
        Stats.model_validate((await raw.get("/v1/stats")).json())
        ModelList.model_validate((await raw.get("/v1/models")).json())
        created = (await raw.post("/v1/sessions", json={"tools": ["calculator"], "max_tokens": 48})).json()
        SessionCreated.model_validate(created)
        s = SessionRef(created["id"], created["token"])
        sessions.append(s)
        events = [ev async for ev in served.client.stream_message(s, "2+2?", tool_choice={"name": "Calculator"})]
        assert {ev.name for ev in events} >= {"token", "tool_call", "intercept", "tool_result", "resume", "done"}
        for ev in events:
            EVENTS[ev.name].model_validate(ev.data)
        r = await raw.post(f"/v1/sessions/{s.id}/messages", json={"content": "again", "stream": False}, headers={"X-Session-Token": s.token})
        MessageResult.model_validate(r.json())
        SessionInfo.model_validate((await raw.get(f"/v1/sessions/{s.id}", headers={"X-Session-Token": s.token})).json())
        r = await raw.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        ChatCompletion.model_validate(r.json())


async def problems(served: Served, path: str, body: object, status: int = 400) -> tuple[str, list[dict[str, str]]]:
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as raw:
        r = await raw.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request"
    return err["message"], err.get("errors", [])


async def test_validation_errors_name_the_field_and_why(served: Served) -> None:
    msg, errs = await problems(served, "/v1/sessions", {"max_tokens": 0, "temperature": "hot", "toolz": []})
    assert errs == [{"field": "max_tokens", "message": "Input should be greater than or equal to 1"},
                    {"field": "temperature", "message": "must be a number"},
                    {"field": "toolz", "message": "is not a field of this request"}]
    assert msg == ("'max_tokens' Input should be greater than or equal to 1; 'temperature' must be a number; "
                   "'toolz' is not a field of this request")
    _, errs = await problems(served, "/v1/sessions", {"client_tools": [{"name": "9lives"}]})
    assert errs[0]["field"] == "client_tools[0].name" and "pattern" in errs[0]["message"]

    chat = "/v1/chat/completions"
    user = {"role": "user", "content": "hi"}
    cases: list[tuple[object, dict[str, str]]] = [
        ({"messages": []}, {"field": "messages", "message": "List should have at least 1 item after validation, not 0"}),
        ({"messages": [{"role": "wizard", "content": "x"}]},
         {"field": "messages[0].role", "message": "must be one of 'system', 'developer', 'user', 'assistant', 'tool' (got 'wizard')"}),
        ({"messages": [{"role": "user"}]}, {"field": "messages[0].content", "message": "is required"}),
        ({"messages": [{"content": "x"}]}, {"field": "messages[0].role", "message": "is required"}),
        ({"messages": [user], "temperature": 2.5}, {"field": "temperature", "message": "Input should be less than or equal to 2"}),
        ({"messages": [user], "top_p": -0.1}, {"field": "top_p", "message": "Input should be greater than or equal to 0"}),
        ({"messages": [user], "presence_penalty": 3}, {"field": "presence_penalty", "message": "Input should be less than or equal to 2"}),
        ({"messages": [user], "frobnicate": True}, {"field": "frobnicate", "message": "is not a field of this request"}),
        ({"messages": [user], "tool_choice": "required"}, {"field": "tool_choice", "message": "is only allowed when 'tools' are specified"}),
        ({"messages": [user, {"role": "tool", "content": "21 C", "tool_call_id": "call_1"}]},
         {"field": "messages[1].tool_call_id", "message": "a 'tool' message must answer a tool call of the preceding assistant "
                                                          "message; there is no unanswered call 'call_1'"}),
        ({"messages": [user, {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                                                   "function": {"name": "f", "arguments": "{}"}}]}, user]},
         {"field": "messages[1].tool_calls", "message": "an assistant message with 'tool_calls' must be followed by tool "
                                                        "messages answering each 'tool_call_id'; not answered: call_1"}),
        ({"messages": [user, {"role": "assistant"}]}, {"field": "messages[1].content", "message": "an assistant message needs 'content' or 'tool_calls'"}),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         {"field": "messages[0].content[0].type", "message": "'image_url' content is not supported: this model reads text"}),
        ({"messages": [user], "tools": [{"type": "function", "function": {"name": "has space"}}]},
         {"field": "tools[0].function.name", "message": "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"}),
    ]
    for body, want in cases:
        _, errs = await problems(served, chat, body)
        assert errs == [want], body


async def test_session_tool_choice_error_is_one_message(served: Served, sessions: list[SessionRef]) -> None:
    s = await served.client.create_session(tools=["calculator"])
    sessions.append(s)
    async with httpx.AsyncClient(base_url=served.url, headers={**AUTH, "X-Session-Token": s.token}) as raw:
        r = await raw.post(f"/v1/sessions/{s.id}/messages", json={"content": "hi", "tool_choice": "sometimes"})
    assert r.status_code == 400
    assert r.json()["error"]["errors"] == [{"field": "tool_choice", "message": 'must be "auto", "required", "none", {"name": TOOL} '
                                                                                'or {"type": "function", "function": {"name": TOOL}}'}]
    with pytest.raises(ApiError) as e:
        await served.client.send_message(s, "hi", tool_choice={"type": "function", "function": {"name": "abacus"}})
    assert e.value.status == 400 and e.value.kind == "unknown_tool"
    ok = await served.client.send_message(s, "hi", tool_choice={"type": "function", "function": {"name": "calculator"}})
    assert ok["state"] == "awaiting_user"
    TypeAdapter(list[dict]).validate_python(ok["events"])


async def test_max_result_chars_from_the_yaml_truncates_with_a_note(served: Served, faults: dict[str, Fault],
                                                                     sessions: list[SessionRef], tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("augmentations:\n  calculator: {}\n  max_result_chars: 120\n")
    cfg = load_gateway_config(str(path))
    assert cfg.max_result_chars == 120 and cfg.result_limit == 120
    gw, original = served.gw, served.gw.ctx
    assert original is not None and original.result_limit != 120
    gw.ctx = dataclasses.replace(original, result_limit=cfg.result_limit)  # as a server started with this YAML
    try:
        s = await served.client.create_session(tools=["Big"], max_tokens=48)
    finally:
        gw.ctx = original
    sessions.append(s)
    big = result_of(await call(served, s, "Big"))
    note = " ...[truncated: the tool returned 5000 characters; the first 120 are shown]"
    assert big["content"] == "x" * 120 + note
    stored = await gw.store.get(s.id)  # the model, the client and the store all see the cut result
    assert stored is not None
    assert [m["content"] for m in fold(stored.head, stored.events).transcript if m["role"] == "tool"] == [big["content"]]


async def test_delete_removes_the_sessions_artifacts(served: Served, faults: dict[str, Fault]) -> None:
    c, arts = served.client, served.gw.artifacts
    s = await c.create_session(tools=["Pic"], max_tokens=48)
    try:
        (url,) = result_of(await call(served, s, "Pic"))["artifacts"]
        aid = url.rsplit("/", 1)[1]
        item = arts.get(aid)
        assert item is not None and item.path is not None and item.path.is_file()  # on disk, beside the store
        async with httpx.AsyncClient(base_url=served.url) as raw:
            assert (await raw.get(url)).content == PNG
    finally:
        await c.close_session(s)
    assert arts.get(aid) is None and not item.path.exists() and not item.path.parent.exists()
    async with httpx.AsyncClient(base_url=served.url) as raw:
        assert (await raw.get(url)).status_code == 404
