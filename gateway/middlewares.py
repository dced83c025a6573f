"""The gateway's middlewares: domain errors to JSON HTTP errors in one place, and the API key."""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from aiohttp import web

from gateway.agent import AgentError
from gateway.http import ApiError, error_response
from gateway.store import StoreError

log = logging.getLogger("infercept.gateway")


@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except (ApiError, AgentError) as e:
        return error_response(e.status, e.kind, str(e), **e.extra)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(e.status, "http_error")
        return error_response(e.status, kind, e.reason or str(e))
    except StoreError as e:  # the session store failed (a full disk, a locked file): the client may retry
        log.error("session store error on %s %s: %s", request.method, request.path, e)
        return error_response(503, "store_unavailable", f"the session store failed ({e}); retry shortly", retry_after=2)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", f"{type(e).__name__}: {e}")


def auth_middleware(api_key: str | None) -> Any:
    """With an API key, every /v1 route needs `Authorization: Bearer KEY`, except artifact URLs (they are
    unguessable capabilities, so an <img> can load them)."""

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if api_key and request.path.startswith("/v1/") and not request.path.startswith("/v1/artifacts/"):
            got = request.headers.get("Authorization", "")
            if not got.startswith("Bearer ") or not secrets.compare_digest(got[7:].encode(), api_key.encode()):
                return error_response(401, "unauthorized", "a valid 'Authorization: Bearer <key>' header is required")
        return await handler(request)

    return auth
