"""HTTP plumbing shared by the routes: JSON errors, body validation, Server-Sent Events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra


def error_response(status: int, kind: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message, **extra}}, status=status)


async def read_json(request: web.Request) -> dict[str, Any]:
    if not request.body_exists:
        raise ApiError(400, "invalid_request", "a JSON object body is required")
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, "invalid_json", f"malformed JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    return body


_TYPE_NAMES = {str: "a string", bool: "a boolean", int: "an integer", list: "a list", dict: "an object", float: "a number"}


def field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False, default: Any = None) -> Any:
    """body[name] checked against `kind` (bool is never accepted as a number)."""
    if name not in body or body[name] is None:
        if required:
            raise ApiError(400, "invalid_request", f"'{name}' is required")
        return default
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        want = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise ApiError(400, "invalid_request", f"'{name}' must be {want}")
    return value


def int_field(body: Mapping[str, Any], name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    value = field(body, name, int, default=default)
    if value is not None and not lo <= value <= hi:
        raise ApiError(400, "invalid_request", f"'{name}' must be between {lo} and {hi}")
    return value


def number_field(body: Mapping[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    value = field(body, name, (int, float), default=default)
    if not lo <= value <= hi:
        raise ApiError(400, "invalid_request", f"'{name}' must be between {lo:g} and {hi:g}")
    return float(value)


def error_status(error_event: Mapping[str, Any]) -> int:
    """The HTTP status of a non-streamed response whose events ended in an `error` event."""
    return {"context_too_long": 413, "session_closed": 410}.get(str(error_event.get("type")), 500)


class SSE:
    """A Server-Sent Events response. Writing to a client that has gone raises ConnectionError."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        })

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, event: str | None, data: Any) -> None:
        payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        head = f"event: {event}\n" if event else ""
        await self.response.write(f"{head}data: {payload}\n\n".encode())

    async def close(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response


async def stream_events(request: web.Request, first: tuple[str, dict[str, Any]], rest: AsyncIterator[tuple[str, dict[str, Any]]]) -> web.StreamResponse:
    sse = SSE(request)
    await sse.open()
    await sse.send(first[0], first[1])
    async for name, data in rest:
        await sse.send(name, data)
    return await sse.close()
