"""The aiohttp application: agent sessions over REST with streaming, OpenAI-compatible routes,
artifacts, metrics, the web client. `create_app(gateway)` builds it from the shared state
(`gateway.state.Gateway`), whose lifecycle runs in `cleanup_ctx`: the engine starts in the background
after the server is up (`/healthz` answers 503 "starting" meanwhile, and routes that need the engine
answer 503), idle sessions expire, and everything is shut down with the app.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from gateway.middlewares import auth_middleware, errors_middleware
from gateway.state import Gateway

STATIC = Path(__file__).resolve().parent / "static"
GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")


def gw_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY_KEY]
    tasks = [asyncio.create_task(gw.start_engine(), name="engine-start"),
             asyncio.create_task(gw.expire_loop(), name="session-expiry")]
    yield
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    await gw.close()


def create_app(gateway: Gateway) -> web.Application:
    from gateway.routes_admin import routes as admin_routes
    from gateway.routes_openai import routes as openai_routes
    from gateway.routes_sessions import routes as session_routes

    app = web.Application(middlewares=[errors_middleware, auth_middleware(gateway.config.server.api_key)],
                          client_max_size=4 * 2**20)
    app[GATEWAY_KEY] = gateway
    app.add_routes(session_routes)
    app.add_routes(openai_routes)
    app.add_routes(admin_routes)
    if (STATIC / "index.html").is_file():
        async def index(request: web.Request) -> web.FileResponse:
            return web.FileResponse(STATIC / "index.html")

        app.router.add_get("/", index)
        app.router.add_static("/static/", STATIC)
    app.cleanup_ctx.append(_lifecycle)
    return app
