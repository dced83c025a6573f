"""A gateway on the offline default model (SmolLM2-135M-Instruct), no API key, shared by this package's
tests and shut down when they are done (so it never runs beside the tiny model's gateway)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from engine_adapter.config import EngineConfig
from gateway.config import GatewayConfig, ServerConfig
from gateway.gateway import Gateway
from tests.gateway.conftest import running_gateway


@pytest_asyncio.fixture(scope="package")
async def default_url(uses_server: None, uses_default_model: None) -> AsyncIterator[str]:
    gw = Gateway(EngineConfig(model="default", policy="infercept", max_model_len=2048, max_num_seqs=8),
                 GatewayConfig(server=ServerConfig(max_tokens=64, state_path=":memory:"), augmentations={"calculator": {}, "wikipedia": {}}))
    async with running_gateway(gw) as s:
        yield s.url
