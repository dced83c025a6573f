"""The events of a session's loop on their way to the one request that reads them.

The loop emits `(name, data)` events; the reader takes them in *batches*: everything queued when it
looks. Before a batch is handed over, the session commits what the batch reports (`commit`), so an event
a client has seen is never lost to a crash, and a burst of tokens costs one commit, not one per token.
While nothing comes for `ping_s` the reader gets an empty batch (an SSE stream writes a comment then,
so proxies keep it open).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

Event = tuple[str, dict[str, Any]]
TERMINAL = ("done", "error")


class EventChannel:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    def emit(self, name: str, data: dict[str, Any]) -> None:
        self._queue.put_nowait((name, data))

    def reset(self) -> None:
        """Drop what nobody read (after the reader left): nothing stale reaches the next one."""
        self._queue = asyncio.Queue()

    async def batches(self, commit: Callable[[], Awaitable[None]], ping_s: float | None = None) -> AsyncIterator[list[Event]]:
        """Batches up to and including the next done/error; `[]` after each quiet `ping_s`."""
        q = self._queue
        getter: asyncio.Future[Event] | None = None
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(q.get())
                # Waiting on the getter without cancelling it on a timeout: no event can be lost.
                done, _ = await asyncio.wait({getter}, timeout=ping_s)
                if not done:
                    yield []
                    continue
                batch = [getter.result()]
                getter = None
                while batch[-1][0] not in TERMINAL and not q.empty():
                    batch.append(q.get_nowait())
                await commit()
                yield batch
                if batch[-1][0] in TERMINAL:
                    return
        finally:
            if getter is not None:
                getter.cancel()


__all__ = ["TERMINAL", "Event", "EventChannel"]
