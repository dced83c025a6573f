"""One real gateway (aiohttp on a loopback port) over one real engine on the tiny model, shared by
the gateway tests. The tiny model's weights are random, so tests that need a tool call steer it with
`tool_choice`, which the engine enforces with vLLM's structured outputs (a regex over the ReAct step)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest_asyncio
from aiohttp.test_utils import TestServer

from engine_adapter.config import EngineConfig
from gateway.app import Gateway, create_app
from gateway.client import AsyncClient
from gateway.config import DEFAULT_AUGMENTATIONS, GatewayConfig, ServerConfig
from tests.conftest import tiny_config

API_KEY = "test-key"
MAX_SESSIONS = 6


@dataclass
class Served:
    gw: Gateway
    url: str
    client: AsyncClient  # authorized


def gateway_config(**server: object) -> GatewayConfig:
    augs = dict(DEFAULT_AUGMENTATIONS)
    augs["image"] = {"timeout_s": 120, "steps": 2, "size": 64}
    kw: dict[str, object] = dict(api_key=API_KEY, max_sessions=MAX_SESSIONS, max_message_chars=20000, max_tokens=16)
    kw.update(server)
    return GatewayConfig(server=ServerConfig(**kw), augmentations=augs)  # type: ignore[arg-type]


@pytest_asyncio.fixture(scope="session")
async def served() -> AsyncIterator[Served]:
    # Room for the few-shot prompt of all six tools (~750 tokens) and several sessions.
    cfg = tiny_config("infercept", num_kv_blocks=200, max_model_len=2048, max_num_seqs=8)
    gw = Gateway(cfg, gateway_config())
    server = TestServer(create_app(gw), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    client = AsyncClient(url, api_key=API_KEY)
    try:
        await client.wait_ready(300)
        yield Served(gw, url, client)
    finally:
        await client.aclose()
        await server.close()


@pytest_asyncio.fixture(scope="session")
async def default_url() -> AsyncIterator[str]:
    """A gateway on the offline default model (SmolLM2-135M-Instruct), no API key."""
    gw = Gateway(EngineConfig(model="default", policy="infercept", max_model_len=2048, max_num_seqs=8),
                 GatewayConfig(server=ServerConfig(max_tokens=64), augmentations={"calculator": {}, "wikipedia": {}}))
    server = TestServer(create_app(gw), host="127.0.0.1")
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    async with AsyncClient(base) as c:
        await c.wait_ready(300)
    try:
        yield base
    finally:
        await server.close()
