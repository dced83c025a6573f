"""The load test's clients (aiohttp: one connection per client, as many as the test asks for at once),
and what each one saw."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=120, sock_read=900)
# max_tokens of a session whose message must call a tool: the forced ReAct step (a thought line, then
# `Action: Calculator[...]`) takes the tiny model far more than 16 tokens; with 16 no turn reached its call.
TOOL_TURN_TOKENS = 48


@dataclass
class Outcome:
    kind: str  # done | dropped | error:<type> | http:<status> | connection:<exception>
    seconds: float = 0.0
    status: int | None = None
    first_token_s: float | None = None
    sid: str = ""
    token: str = ""
    tool_called: bool = False
    seen_text: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # the session as read after its turn


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    v = sorted(values)

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(v[-1], 3), "n": len(v)}


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    kinds = Counter(o.kind for o in outcomes)
    ok = [o.seconds for o in outcomes if o.kind == "done"]
    return {
        "clients": len(outcomes), "done": kinds.get("done", 0), "outcomes": dict(sorted(kinds.items())),
        "http_5xx": sum(1 for o in outcomes if o.status is not None and o.status >= 500),
        "refused_or_reset": sum(v for k, v in kinds.items() if k.startswith("connection:")),
        "latency_s": percentiles(ok), "first_token_s": percentiles([o.first_token_s for o in outcomes if o.first_token_s is not None]),
    }


async def tool_sessions(url: str, key: str, n: int) -> tuple[list[Outcome], dict[str, Any]]:
    """`n` clients at once, each opening a session and sending a message that must call a tool: their
    outcomes, and the summary (wall time, turns that called a tool)."""
    t0 = time.perf_counter()
    outcomes = list(await asyncio.gather(*(session_client(url, key, i) for i in range(n))))
    out = summarize(outcomes)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["tool_calls"] = sum(1 for o in outcomes if o.tool_called)
    return outcomes, out


async def sse(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    name, data = "message", []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


async def raw_get(url: str, path: str, headers: dict[str, str], text: bool = False) -> Any:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http, http.get(url + path, headers=headers) as r:
        return await r.text() if text else await r.json()


async def _open(http: aiohttp.ClientSession, url: str, out: Outcome, body: dict[str, Any]) -> bool:
    async with http.post(f"{url}/v1/sessions", json=body) as r:
        out.status = r.status
        if r.status != 201:
            out.kind = f"http:{r.status}"
            return False
        d = await r.json()
        out.sid, out.token = d["id"], d["token"]
        return True


async def session_client(url: str, key: str, i: int, existing: tuple[str, str] | None = None,
                         tool_choice: Any = "required", snapshot: bool = False) -> Outcome:
    """Open a session (or use `existing`) and send one streamed message to its end."""
    out = Outcome("unfinished")
    t0 = time.perf_counter()
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"}) as http:
            if existing is not None:
                out.sid, out.token = existing
            elif not await _open(http, url, out, {"tools": ["calculator"], "max_tokens": TOOL_TURN_TOKENS}):
                return out
            body = {"content": f"What is {i} plus 2?", "tool_choice": tool_choice, "stream": True}
            async with http.post(f"{url}/v1/sessions/{out.sid}/messages", json=body, headers={"X-Session-Token": out.token}) as r:
                out.status = r.status
                if r.status != 200:
                    out.kind = f"http:{r.status}"
                    return out
                async for name, data in sse(r):
                    if name == "token":
                        out.first_token_s = out.first_token_s or time.perf_counter() - t0
                        out.seen_text += data["text"]
                    elif name == "tool_call":
                        out.tool_called = True
                    elif name in ("done", "error"):
                        out.kind = "done" if name == "done" else f"error:{data.get('type')}"
                        break
            if snapshot and out.kind == "done":
                async with http.get(f"{url}/v1/sessions/{out.sid}", headers={"X-Session-Token": out.token}) as r:
                    out.info = await r.json()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        out.kind = f"connection:{type(e).__name__}"
    out.seconds = time.perf_counter() - t0
    return out


async def disconnecting_client(url: str, key: str, i: int, tokens: int = 3, max_tokens: int = 512) -> Outcome:
    """Start a long turn (`max_tokens` within the model's context), read a few tokens, drop the connection."""
    out = Outcome("unfinished")
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"}) as http:
            if not await _open(http, url, out, {"tools": [], "max_tokens": max_tokens}):
                return out
            r = await http.post(f"{url}/v1/sessions/{out.sid}/messages", json={"content": f"Tell me a long story, {i}"},
                                headers={"X-Session-Token": out.token})
            out.status = r.status
            if r.status != 200:
                out.kind = f"http:{r.status}"
                r.close()
                return out
            seen = 0
            async for name, _ in sse(r):
                if name == "token":
                    seen += 1
                if seen >= tokens or name in ("done", "error"):
                    out.kind = "dropped" if seen >= tokens else f"ended:{name}"
                    break
            r.close()  # closes the connection under the stream: the server sees the client gone
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        out.kind = f"connection:{type(e).__name__}"
    return out


class MidTurnClient:
    """A client whose turn is still streaming when the server is killed."""

    def __init__(self, url: str, key: str, i: int, max_tokens: int = 512) -> None:
        self.url, self.key, self.i, self.max_tokens = url, key, i, max_tokens
        self.out = Outcome("unfinished")

    async def run(self) -> Outcome:
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT, headers={"Authorization": f"Bearer {self.key}"}) as http:
                if not await _open(http, self.url, self.out, {"tools": [], "max_tokens": self.max_tokens}):
                    return self.out
                async with http.post(f"{self.url}/v1/sessions/{self.out.sid}/messages", json={"content": f"Tell me a long story, {self.i}"},
                                     headers={"X-Session-Token": self.out.token}) as r:
                    self.out.status = r.status
                    if r.status != 200:
                        self.out.kind = f"http:{r.status}"
                        return self.out
                    async for name, data in sse(r):
                        if name == "token":
                            self.out.seen_text += data["text"]
                        elif name in ("done", "error"):
                            self.out.kind = name
                            return self.out
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            self.out.kind = f"connection:{type(e).__name__}"
        return self.out

    @property
    def settled(self) -> bool:
        """Seen tokens (so it is mid-turn), or already ended."""
        return bool(self.out.seen_text) or self.out.kind != "unfinished"


async def check_restored(url: str, key: str, finished: list[Outcome], mid: list[Outcome]) -> dict[str, Any]:
    """After the restart: is every session back as it was, and does it answer a new message?"""
    headers = {"Authorization": f"Bearer {key}"}
    lost, intact_done, intact_mid = 0, 0, 0
    async with aiohttp.ClientSession(timeout=TIMEOUT, headers=headers) as http:
        for o in finished + mid:
            if not o.sid:
                continue
            async with http.get(f"{url}/v1/sessions/{o.sid}", headers={"X-Session-Token": o.token}) as r:
                if r.status != 200:
                    lost += 1
                    continue
                info = await r.json()
            if o in finished:
                intact_done += info["state"] == "awaiting_user" and info["transcript"] == o.info.get("transcript")
            else:
                last = info["transcript"][-1] if info["transcript"] else {}
                intact_mid += (info["state"] == "awaiting_user" and last.get("interrupted") is True
                               and last.get("content", "").startswith(o.seen_text))
    refs = [(o.sid, o.token) for o in finished + mid if o.sid]
    nxt = await asyncio.gather(*(session_client(url, key, i, existing=ref, tool_choice="none") for i, ref in enumerate(refs)))
    return {"sessions_lost": lost, "finished_sessions_intact": intact_done, "finished_sessions": len(finished),
            "interrupted_sessions_intact": intact_mid, "interrupted_sessions": len(mid),
            "next_message_done": sum(1 for o in nxt if o.kind == "done"), "next_message_outcomes": _count(nxt)}


def _count(outcomes: list[Outcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        out[o.kind] = out.get(o.kind, 0) + 1
    return out
