"""One real gateway (aiohttp on a loopback port) over one real engine on the tiny model, shared by the
gateway tests of this package and shut down when they are done. The tiny model's weights are random,
so tests that need a tool call steer it with `tool_choice`, which the engine enforces with vLLM's
structured outputs (a regex over the ReAct step)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.client import AsyncClient
from gateway.config import DEFAULT_AUGMENTATIONS, GatewayConfig, ServerConfig
from gateway.gateway import Gateway
from tests.conftest import tiny_config

API_KEY = "test-key"
MAX_SESSIONS = 6
READY_TIMEOUT_S = 300.0
PING_S = 0.5


@dataclass
class Served:
    gw: Gateway
    url: str
    client: AsyncClient  # authorized
    # Every health check made while the engine started: (HTTP status or None for no answer, seconds).
    startup_polls: list[tuple[int | None, float]]
    app: web.Application


def gateway_config(**server: object) -> GatewayConfig:
    augs = dict(DEFAULT_AUGMENTATIONS)
    augs["image"] = {"timeout_s": 120, "steps": 2, "size": 64}
    # Pings every half second: every stream of these tests carries them, so every client shows it ignores them.
    kw: dict[str, object] = dict(api_key=API_KEY, max_sessions=MAX_SESSIONS, max_message_chars=20000, max_tokens=16,
                                 state_path=":memory:", sse_ping_s=PING_S)
    kw.update(server)
    return GatewayConfig(server=ServerConfig(**kw), augmentations=augs)  # type: ignore[arg-type]


async def wait_answering(client: AsyncClient, timeout_s: float, poll_timeout_s: float = 2.0) -> list[tuple[int | None, float]]:
    """Poll /healthz until 200, recording each answer's status and latency; fail loudly, with what was
    seen, if the engine fails, the deadline passes, or the server stops answering meanwhile (each poll
    gets `poll_timeout_s`: the server must keep serving while its engine starts)."""
    loop = asyncio.get_running_loop()
    deadline, polls = loop.time() + timeout_s, []
    while True:
        t0 = loop.time()
        try:
            h = await client.health(timeout_s=poll_timeout_s)
        except httpx.TimeoutException:
            polls.append((None, loop.time() - t0))
            raise RuntimeError(f"GET /healthz got no answer within {poll_timeout_s:g} s while the engine started; "
                               f"earlier polls: {polls[-5:]}") from None
        polls.append((h["status_code"], loop.time() - t0))
        if h["status_code"] == 200:
            return polls
        if h.get("status") == "failed" or loop.time() > deadline:
            raise RuntimeError(f"not ready after {loop.time() - deadline + timeout_s:.0f} s: last health {h}")
        await asyncio.sleep(0.25)


@asynccontextmanager
async def running_gateway(gw: Gateway, api_key: str | None = None) -> AsyncIterator[Served]:
    """A gateway on a loopback port, ready (its engine answered), closed on exit. A gateway that does not
    get ready fails loudly with what it saw (the health checks' answers, the engine's error)."""
    app = create_app(gw)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    client = AsyncClient(url, api_key=api_key)
    try:
        try:
            polls = await wait_answering(client, READY_TIMEOUT_S)
        except Exception as e:
            raise RuntimeError(f"gateway at {url} (model {gw.engine_config.model}) not ready: {e}; "
                               f"engine start error: {gw.start_error!r}") from e
        yield Served(gw, url, client, polls, app)
    finally:
        await client.aclose()
        await server.close()  # the app's cleanup closes its sessions and shuts the engine down


@pytest_asyncio.fixture(scope="package")
async def served(tmp_path_factory: pytest.TempPathFactory, uses_server: None) -> AsyncIterator[Served]:
    # Room for the few-shot prompt of all six tools (~750 tokens) and several sessions. A real session
    # store on disk: every test here also runs the commits before each batch of events.
    cfg = tiny_config("infercept", num_kv_blocks=200, max_model_len=2048, max_num_seqs=8, log_stats=True)
    state = tmp_path_factory.mktemp("state") / "sessions.db"
    async with running_gateway(Gateway(cfg, gateway_config(state_path=str(state))), api_key=API_KEY) as s:
        yield s
