"""The aiohttp application: agent sessions over REST with streaming, OpenAI-compatible routes,
artifacts, metrics, the web client. `create_app(gateway)` builds it around a `gateway.gateway.Gateway`,
whose lifecycle runs in `cleanup_ctx`: the gateway opens what it holds (tool registry, state folder lock,
session store), the engine starts in the background after the server is up (`/healthz` answers 503
"starting" meanwhile, and routes that need the engine answer 503), stored sessions are read back, a
watchdog restarts a dead engine, idle sessions expire, and everything is shut down with the app.
`GET /openapi.json` is the OpenAPI 3.1 document of every route, built from the routes' declarations
(`gateway.api`) once the gateway is open (it names this server's tools).

The route modules import the gateway's app key from `gateway.gateway`, never this module: the
dependency runs one way, app -> routes -> gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.api import Api, openapi, set_integer_maximum, set_string_enum
from gateway.gateway import GATEWAY_KEY, Gateway, gw_of
from gateway.middlewares import auth_middleware, errors_middleware
from gateway.replicas import forwarding_middleware
from gateway.routes_admin import api as admin_api
from gateway.routes_openai import api as openai_api
from gateway.routes_sessions import api as session_api

STATIC = Path(__file__).resolve().parent / "static"
VERSION = "0.1.0"
APIS: tuple[Api, ...] = (session_api, openai_api, admin_api)
OPENAPI_KEY: web.AppKey[dict[str, Any]] = web.AppKey("openapi", dict)

__all__ = ["GATEWAY_KEY", "create_app", "gw_of"]


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY_KEY]
    await gw.open()
    app[OPENAPI_KEY] = _document(gw, serves_index=(STATIC / "index.html").is_file())
    tasks = [asyncio.create_task(gw.start_engine(), name="engine-start"),
             asyncio.create_task(gw.expire_loop(), name="session-expiry"),
             asyncio.create_task(gw.watch_engine(), name="engine-watchdog"),
             asyncio.create_task(gw.lease_loop(), name="replica-lease")]
    try:
        async with contextlib.AsyncExitStack() as stack:
            server = gw.config.server
            if server.agent_port is not None:  # the balancer's load agent (gateway/lb_agent.py)
                await stack.enter_async_context(gw.load_agent().serving(server.host, server.agent_port))
            yield
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await gw.close()


def _document(gw: Gateway, serves_index: bool) -> dict[str, Any]:
    """The OpenAPI document of the declared routes, with what the models cannot know: this server's tool
    names and its model's context length."""
    doc = openapi(APIS, title="infercept", version=VERSION, api_key=bool(gw.config.server.api_key))
    schemas = doc["components"]["schemas"]
    names = sorted({*gw.registry.names(), *(key for key in gw.config.augmentations if gw.registry.resolve(key))})
    set_string_enum(schemas["CreateSession"]["properties"]["tools"], names)
    limit = gw.engine_config.max_model_len
    set_integer_maximum(schemas["CreateSession"]["properties"]["max_tokens"], limit)
    for key in ("max_tokens", "max_completion_tokens"):
        set_integer_maximum(schemas["ChatCompletionRequest"]["properties"][key], limit)
    doc["paths"]["/openapi.json"] = {"get": {"summary": "This document", "operationId": "get_openapi", "tags": ["admin"],
                                             "responses": {"200": {"description": "OpenAPI 3.1",
                                                                   "content": {"application/json": {"schema": {"type": "object"}}}}}}}
    if serves_index:
        doc["paths"]["/"] = {"get": {"summary": "The web client", "operationId": "get_index", "tags": ["admin"],
                                     "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}}}
    return doc


async def _openapi_json(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI_KEY])


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


def create_app(gateway: Gateway) -> web.Application:
    app = web.Application(middlewares=[errors_middleware, auth_middleware(gateway.config.server.api_key),
                                       forwarding_middleware(gateway)],
                          client_max_size=4 * 2**20)
    app[GATEWAY_KEY] = gateway
    for api in APIS:
        app.add_routes(api.routes)
    app.router.add_get("/openapi.json", _openapi_json)
    if (STATIC / "index.html").is_file():
        app.router.add_get("/", _index)
        app.router.add_static("/static/", STATIC)
    app.cleanup_ctx.append(_lifecycle)
    return app
