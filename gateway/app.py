"""The aiohttp application: agent sessions over REST with streaming, OpenAI-compatible routes,
artifacts, metrics, the web client. `create_app(gateway)` builds it from the shared state
(`gateway.state.Gateway`), whose lifecycle runs in `cleanup_ctx`: the engine starts in the background
after the server is up (`/healthz` answers 503 "starting" meanwhile, and routes that need the engine
answer 503), stored sessions are read back, a watchdog restarts a dead engine, idle sessions expire,
and everything is shut down with the app. `GET /openapi.json` is the OpenAPI 3.1 document of every
route, built from the routes' declarations (`gateway.api`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.middlewares import auth_middleware, errors_middleware
from gateway.state import Gateway

STATIC = Path(__file__).resolve().parent / "static"
VERSION = "0.1.0"
GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway")


def gw_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY_KEY]
    tasks = [asyncio.create_task(gw.start_engine(), name="engine-start"),
             asyncio.create_task(gw.expire_loop(), name="session-expiry"),
             asyncio.create_task(gw.watch_engine(), name="engine-watchdog")]
    yield
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    await gw.close()


def _describe_this_server(doc: dict[str, Any], gw: Gateway) -> None:
    """What the models cannot know: this server's tool names and its model's context length."""
    from gateway.api import set_integer_maximum, set_string_enum

    schemas = doc["components"]["schemas"]
    names = sorted({*gw.registry.names(), *(key for key in gw.config.augmentations if gw.registry.resolve(key))})
    set_string_enum(schemas["CreateSession"]["properties"]["tools"], names)
    limit = gw.engine_config.max_model_len
    set_integer_maximum(schemas["CreateSession"]["properties"]["max_tokens"], limit)
    for key in ("max_tokens", "max_completion_tokens"):
        set_integer_maximum(schemas["ChatCompletionRequest"]["properties"][key], limit)


def create_app(gateway: Gateway) -> web.Application:
    from gateway.api import openapi
    from gateway.routes_admin import api as admin_api
    from gateway.routes_openai import api as openai_api
    from gateway.routes_sessions import api as session_api

    apis = [session_api, openai_api, admin_api]
    app = web.Application(middlewares=[errors_middleware, auth_middleware(gateway.config.server.api_key)],
                          client_max_size=4 * 2**20)
    app[GATEWAY_KEY] = gateway
    for api in apis:
        app.add_routes(api.routes)
    doc = openapi(apis, title="infercept", version=VERSION, api_key=bool(gateway.config.server.api_key))
    _describe_this_server(doc, gateway)
    doc["paths"]["/openapi.json"] = {"get": {"summary": "This document", "operationId": "get_openapi", "tags": ["admin"],
                                             "responses": {"200": {"description": "OpenAPI 3.1",
                                                                   "content": {"application/json": {"schema": {"type": "object"}}}}}}}

    async def openapi_json(request: web.Request) -> web.Response:
        return web.json_response(doc)

    app.router.add_get("/openapi.json", openapi_json)
    if (STATIC / "index.html").is_file():
        async def index(request: web.Request) -> web.FileResponse:
            return web.FileResponse(STATIC / "index.html")

        app.router.add_get("/", index)
        app.router.add_static("/static/", STATIC)
        doc["paths"]["/"] = {"get": {"summary": "The web client", "operationId": "get_index", "tags": ["admin"],
                                     "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}}}
    app.cleanup_ctx.append(_lifecycle)
    return app
