"""Several gateway replicas over one shared PostgreSQL store (`server.replica_id`): a request for a session
another live replica owns is forwarded to it, streamed through unchanged.

A balancer that hashes the session id sends a session's requests to its owner; forwarding covers what
the hash does not: a replica that joined or left (the hash ring moved) and a session that moved after a
takeover. Only one hop: a forwarded request (it carries `FORWARDED_BY`) is served where it lands, and if
that replica does not own the session it answers 503 and the client retries, so replicas that disagree
for a moment cannot bounce a request between them. The ownership rules themselves (leases, claims,
fencing) are the store's (`gateway/store_pg.py`); taking a session over is the table's
(`SessionTable.find`).
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
from aiohttp import web

from gateway.http import ApiError
from gateway.store import StoreError

log = logging.getLogger("infercept.gateway")

FORWARDED_BY = "X-Infercept-Forwarded-By"
RETRY_UNREACHABLE_S = 2
# Hop-by-hop headers (RFC 9110 7.6.1) and what aiohttp sets itself for the new connection and body.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length"}


class Forwarder:
    """The HTTP client a replica forwards with (one connection pool, opened at the first forward)."""

    def __init__(self, connect_timeout_s: float = 5.0) -> None:
        self._client: aiohttp.ClientSession | None = None
        self._connect_timeout_s = connect_timeout_s

    async def forward(self, request: web.Request, base_url: str, me: str) -> web.StreamResponse:
        """`request` sent to the same path at `base_url`; its answer streamed back as it comes (an SSE turn
        included). An owner that cannot be reached: 503 with Retry-After."""
        if self._client is None:
            # Bodies pass through as they are (compressed or not): the client decodes them, not the hop.
            self._client = aiohttp.ClientSession(auto_decompress=False,
                                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers[FORWARDED_BY] = me
        body = await request.read()
        try:
            async with self._client.request(request.method, base_url.rstrip("/") + request.rel_url.path_qs,
                                            headers=headers, data=body if body else None) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason,
                                          headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientConnectionError as e:
            raise ApiError(503, "owner_unreachable", f"the replica serving this session ({base_url}) cannot be reached "
                           f"({type(e).__name__}); retry: its sessions are taken over once its lease lapses",
                           retry_after=RETRY_UNREACHABLE_S) from e

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def forwarding_middleware(gw: Any) -> Any:
    """Forward a request for a session that a live replica other than this one owns. `gw`: the app's
    `Gateway` (its session table, metrics and forwarder)."""

    @web.middleware
    async def forward(request: web.Request, handler: Any) -> web.StreamResponse:
        sid = request.match_info.get("sid")
        if sid is None or FORWARDED_BY in request.headers:
            return await handler(request)
        table = gw.table_if_open
        replica = table.replica if table is not None else None
        if replica is None or table.serving(sid):  # type: ignore[union-attr]
            return await handler(request)
        try:
            owner = await replica.owner(sid)
        except StoreError:
            return await handler(request)  # the handler's own store access reports it
        if owner is None or not owner.alive or owner.replica_id == replica.replica_id:
            return await handler(request)  # not stored, or free to take over: the handler does
        gw.metrics.requests_forwarded.inc()
        log.debug("forwarding %s %s to replica %s at %s", request.method, request.path, owner.replica_id, owner.url)
        return await gw.forwarder.forward(request, owner.url, replica.replica_id)

    return forward


__all__ = ["FORWARDED_BY", "Forwarder", "forwarding_middleware"]
