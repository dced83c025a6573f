"""A stand-in for the engine behind a `SessionTable`, for the session layer's tests that run no engine (the
fault units, the stored format): engine sessions that record what they were opened with and whether they
were closed, and the context the session layer hands its sessions."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock


class StandInEngineSession:
    def __init__(self, session_id: str, history: list[int] | None = None, **kw: Any) -> None:
        self.id, self.history = session_id, list(history or [])
        self.context_len = self.context_tokens = len(self.history)
        self.sampling: dict[str, Any] = {"temperature": kw.get("temperature", 0.0), "seed": kw.get("seed")}
        self.opened_with = {k: ({n: dataclasses.asdict(h) for n, h in v.items()} if k == "tools" else v) for k, v in kw.items()}
        self.closed = False

    def context_since(self, start: int) -> list[int]:
        return self.history[start:]

    async def close(self) -> None:
        self.closed = True


def stand_in_ctx(model_path: str) -> Any:
    """What `SessionTable.open`/`restore` need of the gateway; `engine.opened` lists the engine sessions in
    the order they were opened."""
    engine = SimpleNamespace(model_path=model_path, opened=[])

    def open_session(session_id: str, **kw: Any) -> StandInEngineSession:
        es = StandInEngineSession(session_id, **kw)
        engine.opened.append(es)
        return es

    engine.open_session = open_session
    registry = MagicMock()
    registry.hints.return_value = {}
    registry.__contains__.return_value = True
    return SimpleNamespace(engine=engine, registry=registry, metrics=MagicMock(), limits=SimpleNamespace(sse_ping_s=None))


def opened_by_id(ctx: Any) -> dict[str, StandInEngineSession]:
    """The engine session last opened for each session id."""
    return {es.id: es for es in ctx.engine.opened}
