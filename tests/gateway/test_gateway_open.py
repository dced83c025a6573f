"""What a `Gateway` holds is opened with its app, not when it is built (no engine here): building one
touches nothing on disk; `open` locks the state folder and opens the store; a second server on the same
folder is refused and leaves nothing open; `close` lets the next one in."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapter.config import EngineConfig
from gateway.config import GatewayConfig, ServerConfig
from gateway.gateway import Gateway, NotOpen


def gateway(state: Path) -> Gateway:
    return Gateway(EngineConfig(model="tiny", policy="infercept"),
                   GatewayConfig(server=ServerConfig(state_path=str(state / "sessions.db")), augmentations={"calculator": {}}))


async def test_building_opens_nothing_and_open_takes_the_folder(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = gateway(state)
    assert not state.exists()
    with pytest.raises(NotOpen):
        first.store  # noqa: B018
    await first.open()
    try:
        assert (state / "sessions.db").exists() and (state / "lock").exists()
        assert first.registry.names() == ["Calculator"] and first.sessions == {}
        second = gateway(state)
        with pytest.raises(RuntimeError, match="is in use by another infercept server"):
            await second.open()
        with pytest.raises(NotOpen):
            second.registry  # noqa: B018  (built, then closed again when the lock was refused)
    finally:
        await first.close()
    with pytest.raises(NotOpen):
        first.store  # noqa: B018
    third = gateway(state)
    await third.open()  # the folder is free again
    await third.close()
