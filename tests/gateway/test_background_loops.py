"""The gateway's background loops (engine watchdog, session expiry) on fakes: an exception in one round
is logged and the loop goes on, so one failed engine restart or store error does not end restarts or
expiry for the life of the server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

import gateway.gateway as gateway_mod
from gateway.gateway import Gateway
from gateway.store import StoreError
from tests.waiting import wait_until


def fake_gateway(**kw: Any) -> Any:
    gw = SimpleNamespace(ready=asyncio.Event(), **kw)
    gw.ready.set()
    return gw


async def test_the_watchdog_survives_a_failed_restart_and_tries_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_mod, "WATCH_S", 0.005)
    attempts: list[str] = []
    engine = SimpleNamespace(dead=True, dead_reason=lambda: "EngineCore died")

    async def restart(reason: str) -> None:
        attempts.append(reason)
        if len(attempts) < 3:
            raise RuntimeError("could not start")
        engine.dead = False

    gw = fake_gateway(engine=engine, restart_engine=restart)
    task = asyncio.ensure_future(Gateway.watch_engine(gw))  # type: ignore[arg-type]
    try:
        await wait_until(lambda: len(attempts) >= 3 or task.done(), 10, "three restart attempts")
        assert attempts == ["EngineCore died"] * 3 and not task.done()
    finally:
        task.cancel()


async def test_the_expiry_loop_survives_a_failed_round() -> None:
    rounds: list[int] = []

    async def expire() -> int:
        rounds.append(1)
        if len(rounds) == 1:
            raise StoreError("database is locked")
        return 0

    gw = fake_gateway(config=SimpleNamespace(server=SimpleNamespace(session_idle_s=0.2, hibernate_s=0.2)), expire_idle=expire)
    task = asyncio.ensure_future(Gateway.expire_loop(gw))  # type: ignore[arg-type]
    try:
        await wait_until(lambda: len(rounds) >= 3 or task.done(), 10, "three expiry rounds")
        assert len(rounds) >= 3 and not task.done()
    finally:
        task.cancel()
