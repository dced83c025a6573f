"""A small client for the gateway's session API (httpx), async with a sync wrapper.

    async with AsyncClient("http://127.0.0.1:8000") as c:
        s = await c.create_session(tools=["calculator"])
        async for ev in c.stream_message(s, "What is 29 times 13?"):
            print(ev.name, ev.data)
        await c.close_session(s)

Every event is an `Event(name, data)`; `done` and `error` end a stream. The examples and load tools use
this client; nothing else parses the SSE stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, body: Any = None, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {kind}: {message}")
        self.status, self.kind, self.message, self.body = status, kind, message, body
        self.retry_after = retry_after  # seconds, from the Retry-After header (503, 429)


@dataclass(frozen=True)
class Event:
    name: str  # token, tool_call, intercept, tool_result, resume, done, error
    data: dict[str, Any]

    @property
    def terminal(self) -> bool:
        return self.name in ("done", "error")

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


@dataclass
class SessionRef:
    id: str
    token: str
    tools: list[str] = field(default_factory=list)
    client_tools: list[str] = field(default_factory=list)


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        retry_after: float | None = float(resp.headers["Retry-After"])
    except (KeyError, ValueError):
        retry_after = None
    try:
        body = resp.json()
        err = body.get("error", {})
        raise ApiError(resp.status_code, err.get("type", "error"), err.get("message", resp.text), body, retry_after)
    except ValueError:
        raise ApiError(resp.status_code, "http_error", resp.text, retry_after=retry_after) from None


def _message_body(content: str, tool_choice: Any, step_format: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"content": content}
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if step_format is not None:
        body["format"] = step_format
    return body


async def parse_sse(lines: AsyncIterator[str]) -> AsyncIterator[Event]:
    """Server-Sent Events from a line iterator (`event:`/`data:` fields, blank line ends an event)."""
    name, data = "message", []
    async for line in lines:
        if not line:
            if data:
                text = "\n".join(data)
                yield Event(name, json.loads(text) if text != "[DONE]" else {"done": True})
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        text = "\n".join(data)
        yield Event(name, json.loads(text) if text != "[DONE]" else {"done": True})


class AsyncClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    @staticmethod
    def _auth(s: SessionRef) -> dict[str, str]:
        return {"X-Session-Token": s.token}

    async def health(self, timeout_s: float | None = None) -> dict[str, Any]:
        r = await self.http.get("/healthz", timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT)
        return {"status_code": r.status_code, **r.json()}

    async def wait_ready(self, timeout_s: float = 300.0, poll_timeout_s: float = 5.0) -> dict[str, Any]:
        """Poll /healthz until the engine is ready. Each poll has its own short timeout inside the
        overall deadline, so a server that stops answering cannot stall the wait; on failure the error
        says what the last poll saw."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen = "no answer yet"
        while True:
            left = deadline - loop.time()
            try:
                h = await self.health(timeout_s=max(0.1, min(poll_timeout_s, left)))
                if h["status_code"] == 200:
                    return h
                if h.get("status") == "failed":
                    raise ApiError(503, "not_ready", h.get("error", "engine failed"))
                seen = f"HTTP {h['status_code']} {h.get('status')}"
            except httpx.TimeoutException:
                seen = f"no response to GET /healthz within {poll_timeout_s:g} s"
            except httpx.TransportError as e:
                seen = f"{type(e).__name__}: {e}"
            if loop.time() + 0.5 > deadline:
                raise TimeoutError(f"{self.base_url} not ready after {timeout_s:g} s; last health check: {seen}")
            await asyncio.sleep(0.5)

    async def create_session(self, *, system: str | None = None, tools: list[str] | None = None,
                             client_tools: list[Any] | None = None, max_tokens: int | None = None, **extra: Any) -> SessionRef:
        body: dict[str, Any] = {k: v for k, v in dict(system=system, tools=tools, client_tools=client_tools,
                                                      max_tokens=max_tokens, **extra).items() if v is not None}
        r = await self.http.post("/v1/sessions", json=body)
        _raise_for(r)
        d = r.json()
        return SessionRef(d["id"], d["token"], d.get("tools", []), d.get("client_tools", []))

    async def get_session(self, s: SessionRef) -> dict[str, Any]:
        r = await self.http.get(f"/v1/sessions/{s.id}", headers=self._auth(s))
        _raise_for(r)
        return r.json()

    async def close_session(self, s: SessionRef) -> None:
        r = await self.http.delete(f"/v1/sessions/{s.id}", headers=self._auth(s))
        if r.status_code != 404:
            _raise_for(r)

    async def _stream(self, path: str, s: SessionRef, body: dict[str, Any]) -> AsyncIterator[Event]:
        async with self.http.stream("POST", path, json={**body, "stream": True}, headers=self._auth(s)) as r:
            if r.status_code >= 400:
                await r.aread()
                _raise_for(r)
            async for ev in parse_sse(r.aiter_lines()):
                yield ev
                if ev.terminal:
                    return

    def stream_message(self, s: SessionRef, content: str, tool_choice: Any = None, step_format: str | None = None) -> AsyncIterator[Event]:
        """`tool_choice`: auto | required | none | {"name"}; `step_format`: free | react (every model turn
        constrained to one ReAct step)."""
        return self._stream(f"/v1/sessions/{s.id}/messages", s, _message_body(content, tool_choice, step_format))

    def stream_tool_result(self, s: SessionRef, call_id: str, content: str) -> AsyncIterator[Event]:
        return self._stream(f"/v1/sessions/{s.id}/tool_results", s, {"call_id": call_id, "content": content})

    async def send_message(self, s: SessionRef, content: str, tool_choice: Any = None, step_format: str | None = None) -> dict[str, Any]:
        """Non-streaming: {"reply", "state", "events", "usage", ...}."""
        body = _message_body(content, tool_choice, step_format) | {"stream": False}
        r = await self.http.post(f"/v1/sessions/{s.id}/messages", json=body, headers=self._auth(s))
        _raise_for(r)
        return r.json()

    async def send_tool_result(self, s: SessionRef, call_id: str, content: str) -> dict[str, Any]:
        r = await self.http.post(f"/v1/sessions/{s.id}/tool_results", json={"call_id": call_id, "content": content, "stream": False},
                                 headers=self._auth(s))
        _raise_for(r)
        return r.json()

    async def metrics(self) -> str:
        r = await self.http.get("/metrics")
        _raise_for(r)
        return r.text

    async def stats(self) -> dict[str, Any]:
        r = await self.http.get("/v1/stats")
        _raise_for(r)
        return r.json()

    async def artifact(self, url: str) -> bytes:
        r = await self.http.get(url)
        _raise_for(r)
        return r.content


class Client:
    """The same API, blocking (it runs the async client on a private event loop)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        self._loop = asyncio.new_event_loop()
        self._c = self._loop.run_until_complete(self._make(base_url, api_key, timeout))

    @staticmethod
    async def _make(base_url: str, api_key: str | None, timeout: float) -> AsyncClient:
        return AsyncClient(base_url, api_key, timeout)

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._run(self._c.aclose())
        self._loop.close()

    def _iterate(self, agen: AsyncIterator[Event]) -> Iterator[Event]:
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(agen.aclose())  # type: ignore[attr-defined]

    def health(self) -> dict[str, Any]:
        return self._run(self._c.health())

    def wait_ready(self, timeout_s: float = 300.0) -> dict[str, Any]:
        return self._run(self._c.wait_ready(timeout_s))

    def create_session(self, **kw: Any) -> SessionRef:
        return self._run(self._c.create_session(**kw))

    def get_session(self, s: SessionRef) -> dict[str, Any]:
        return self._run(self._c.get_session(s))

    def close_session(self, s: SessionRef) -> None:
        self._run(self._c.close_session(s))

    def stream_message(self, s: SessionRef, content: str, tool_choice: Any = None, step_format: str | None = None) -> Iterator[Event]:
        return self._iterate(self._c.stream_message(s, content, tool_choice, step_format))

    def stream_tool_result(self, s: SessionRef, call_id: str, content: str) -> Iterator[Event]:
        return self._iterate(self._c.stream_tool_result(s, call_id, content))

    def send_message(self, s: SessionRef, content: str, tool_choice: Any = None, step_format: str | None = None) -> dict[str, Any]:
        return self._run(self._c.send_message(s, content, tool_choice, step_format))

    def send_tool_result(self, s: SessionRef, call_id: str, content: str) -> dict[str, Any]:
        return self._run(self._c.send_tool_result(s, call_id, content))

    def metrics(self) -> str:
        return self._run(self._c.metrics())

    def stats(self) -> dict[str, Any]:
        return self._run(self._c.stats())

    def artifact(self, url: str) -> bytes:
        return self._run(self._c.artifact(url))
