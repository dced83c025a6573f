"""One real vLLM engine per policy, shared by the engine tests and shut down when this package is done.

vLLM's engine core runs in a child process; tests drive it through the same `InterceptEngine` facade
the gateway uses. Engines are expensive (~20 s to start on 2 cores), so a package-scoped, parametrized
fixture holds one per policy (pytest groups the tests that use it and finalizes each engine before the
next policy's starts)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from engine_adapter.engine import InterceptEngine
from tests.conftest import tiny_config


@pytest_asyncio.fixture(scope="package")
async def policy_engine(request: pytest.FixtureRequest, uses_engine: None) -> AsyncIterator[InterceptEngine]:
    # Parametrized by tests/conftest.py's pytest_generate_tests: the policies each test names.
    engine = InterceptEngine(tiny_config(request.param))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()
