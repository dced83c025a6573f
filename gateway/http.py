"""HTTP plumbing shared by the routes: JSON errors, body validation, Server-Sent Events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from gateway.schemas import ErrorBody, ErrorDetail


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.kind, self.extra = status, kind, extra


def json_body(model: BaseModel, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A response whose body is `model`'s dump: what the route's documented model says, nothing else."""
    return web.json_response(model.model_dump(mode="json"), status=status, headers=headers)


def error_body(kind: str, message: str, **extra: Any) -> ErrorBody:
    """`{"error": {"type", "message", ...}}`: the extras are `ErrorDetail`'s optional fields."""
    return ErrorBody(error=ErrorDetail(type=kind, message=message, **extra))


def error_response(status: int, kind: str, message: str, **extra: Any) -> web.Response:
    """An `error_body` response; a `retry_after` (seconds) also goes out as `Retry-After`."""
    headers = {"Retry-After": str(extra["retry_after"])} if extra.get("retry_after") is not None else None
    return json_body(error_body(kind, message, **extra), status=status, headers=headers)


async def read_json(request: web.Request) -> dict[str, Any]:
    if not request.body_exists:
        raise ApiError(400, "invalid_request", "a JSON object body is required")
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, "invalid_json", f"malformed JSON: {e}") from e
    except RecursionError:
        raise ApiError(400, "invalid_json", "JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    return body


def error_status(error_event: Mapping[str, Any]) -> int:
    """The HTTP status of a non-streamed response whose events ended in an `error` event."""
    return {"context_too_long": 413, "session_closed": 410, "engine_died": 503, "shutting_down": 503,
            "store_unavailable": 503, "session_moved": 503}.get(str(error_event.get("type")), 500)


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

    @staticmethod
    def encode(event: str | None, data: Any) -> str:
        payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        head = f"event: {event}\n" if event else ""
        return f"{head}data: {payload}\n\n"

    async def send(self, event: str | None, data: Any) -> None:
        await self.response.write(self.encode(event, data).encode())

    async def send_many(self, events: list[tuple[str | None, Any]]) -> None:
        """Several events in one write (one committed batch of a session's events)."""
        await self.response.write("".join(self.encode(e, d) for e, d in events).encode())

    async def ping(self) -> None:
        """A comment line: ignored by SSE readers, keeps proxies from closing a quiet stream."""
        await self.response.write(b": ping\n\n")

    async def close(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response


async def stream_batches(request: web.Request, batches: AsyncIterator[list[tuple[str, dict[str, Any]]]]) -> web.StreamResponse:
    """An SSE response of a session's event batches: one write per batch, a ping for an empty one. The
    headers go out at once, before the first event: a turn queued behind load still has an open, answered
    stream (and pings while it waits), which proxies keep."""
    sse = SSE(request)
    await sse.open()
    await sse.ping()  # bytes at once, not only headers: some proxies wait for the body
    async for batch in batches:
        if batch:
            await sse.send_many(list(batch))
        else:
            await sse.ping()
    return await sse.close()
