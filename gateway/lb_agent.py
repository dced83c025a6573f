"""The balancer's agent: tells HAProxy how loaded this replica is, so that a new session goes to the
replica with the most room (`server.agent_port`; `infercept cluster` sets it, infercept/balancer.py points
each server's `agent-check` at it).

HAProxy's agent protocol: it connects to the port every second, reads one line and closes. The line is
`up 37%` (the server's weight becomes 37% of its configured weight), or `0%` while the server drains
(weight 0: no new sessions, while requests of the sessions it owns still reach it). Not HAProxy's `drain`
word: that puts the server in a forced drain mode which only `ready` ends, and `ready` would also end a
maintenance mode an operator set; the rolling-restart load test caught a restarted replica left drained.
HAProxy's `leastconn` then picks the server with the fewest connections per unit of weight, so open
streams and free room both count. A replica the agent cannot reach keeps its last weight: the HTTP
health check alone decides up or down.

Room is the smaller of two shares: the KV cache's free blocks (a session holds KV across its calls, and a
new one that does not fit pushes paused contexts out) and the room left under `server.max_sessions`
(sessions in memory). Sessions open but hibernated take neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger(__name__)

STATS_TIMEOUT_S = 0.5  # the agent answers within HAProxy's check timeout even when the engine is slow to
# answer: without the KV share, from the sessions alone


def weight_percent(free_blocks: int | None, total_blocks: int | None, live_sessions: int, max_sessions: int) -> int:
    """The weight to report, 1..100: the smaller of the free KV share and the room under max_sessions
    (1, not 0, when full: 0 takes the replica out of the choice, and a full replica still takes sessions
    when every other one is full too; its own 429 then says so)."""
    shares = [max(0.0, 1.0 - live_sessions / max_sessions)] if max_sessions > 0 else []
    if free_blocks is not None and total_blocks:
        shares.append(max(0.0, min(1.0, free_blocks / total_blocks)))
    share = min(shares) if shares else 1.0
    return max(1, min(100, round(100 * share)))


class LoadAgent:
    """One line per connection: `0%` while the server drains, else `up N%`."""

    def __init__(self, draining: Callable[[], bool], blocks: Callable[[], Awaitable[tuple[int, int] | None]],
                 live_sessions: Callable[[], int], max_sessions: int) -> None:
        self.draining, self.blocks, self.live_sessions, self.max_sessions = draining, blocks, live_sessions, max_sessions

    async def line(self) -> str:
        if self.draining():
            return "0%\n"
        try:
            got = await asyncio.wait_for(self.blocks(), STATS_TIMEOUT_S)
        except Exception:  # the engine is starting, restarting or slow: the sessions' share alone
            got = None
        free, total = got if got is not None else (None, None)
        return f"up {weight_percent(free, total, self.live_sessions(), self.max_sessions)}%\n"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write((await self.line()).encode())
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    @contextlib.asynccontextmanager
    async def serving(self, host: str, port: int) -> AsyncIterator[asyncio.AbstractServer]:
        server = await asyncio.start_server(self._answer, host, port)
        log.info("balancer agent on %s:%d", host, port)
        try:
            yield server
        finally:
            server.close()
            await server.wait_closed()


__all__ = ["LoadAgent", "weight_percent"]
