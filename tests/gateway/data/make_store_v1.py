"""How `store_v1.sqlite` and `store_v1.expected.json` were made: by the gateway as it was at commit
b87a361 (session format 1, before the session layer was reworked), on the tiny model, for
tests/gateway/test_stored_format.py. Not run by the tests; kept to show where the data came from.

    git worktree add /tmp/v1 b87a361 && cd /tmp/v1
    PYTHONPATH=. python /path/to/tests/gateway/data/make_store_v1.py /path/to/tests/gateway/data

A real gateway (real engine, real SQLite store) gets four sessions:

* `done`: a forced Calculator call (tool_call, intercept, tool_result, resume), a finished turn, then a
  second message (the chat intercept resumed);
* `human`: an AskHuman call, pending (the session waits for the user's answer);
* `client`: a client tool call, pending (the session waits for the client's result);
* `busy`: a long answer being generated when the store is copied (SQLite's backup API: a consistent
  snapshot of what was committed), so the copy holds an unfinished turn (head state "generating").

The expected file is what the code of that commit read back from (a copy of) the copy (`SessionTable.restore_all`
on a stand-in engine that records the context tokens it is given): every session's state, transcript,
calls, usage, pending call and context tokens. The current code must read back exactly the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

from gateway.sessions import SessionTable
from gateway.state import Gateway
from gateway.store import SqliteStore
from tests.conftest import tiny_config
from tests.gateway.conftest import API_KEY, gateway_config, running_gateway


class StandInEngineSession:
    def __init__(self, session_id: str, history: list[int] | None = None, **_: Any) -> None:
        self.id, self.history = session_id, list(history or [])
        self.context_len = self.context_tokens = len(self.history)
        self.sampling: dict[str, Any] = {"temperature": 0.0, "seed": None}

    def context_since(self, start: int) -> list[int]:
        return self.history[start:]

    async def close(self) -> None:
        pass


def stand_in_ctx(model_path: str) -> Any:
    engine = SimpleNamespace(model_path=model_path, opened={})

    def open_session(session_id: str, **kw: Any) -> StandInEngineSession:
        es = engine.opened[session_id] = StandInEngineSession(session_id, **kw)
        es.opened_with = {k: ({n: dataclasses.asdict(h) for n, h in v.items()} if k == "tools" else v)  # type: ignore[attr-defined]
                          for k, v in kw.items() if k != "history"}
        return es

    engine.open_session = open_session
    registry = MagicMock()
    registry.hints.return_value = {}
    registry.__contains__.return_value = True
    return SimpleNamespace(engine=engine, registry=registry, metrics=MagicMock(), limits=SimpleNamespace(sse_ping_s=None))


async def read_back(db: Path, model_path: str) -> dict[str, Any]:
    store = SqliteStore(db)
    ctx = stand_in_ctx(model_path)
    table = SessionTable(store)
    try:
        assert await table.restore_all(ctx) == 4 and table.skipped == 0
        out = {}
        for sid, s in table.live.items():
            es = ctx.engine.opened[sid]
            out[sid] = {
                "state": s.state, "public_state": s.public_state(), "system": s.system, "tools": s.tools,
                "client_tools": s.client_tools, "max_tokens": s.max_tokens, "created": s.created_s,
                "token_hash": s.token_hash, "transcript": s.transcript, "calls": [c.to_dict() for c in s.calls],
                "usage": s.usage, "last_end_reason": s.last_end_reason, "announce_restore": s.announce_restore,
                "partial": s.partial, "pending_call": s.pending.call.call_id if s.pending else None,
                "context": es.history, "engine_session": es.opened_with,
            }
        return out
    finally:
        await store.close()


async def main(out_dir: Path) -> None:
    tmp = Path(tempfile.mkdtemp())
    cfg = tiny_config("infercept", num_kv_blocks=200, max_model_len=2048, max_num_seqs=8)
    gw = Gateway(cfg, gateway_config(state_path=str(tmp / "state" / "sessions.db")))
    roles: dict[str, str] = {}
    async with running_gateway(gw, api_key=API_KEY) as served:
        c = served.client
        done = await c.create_session(tools=["calculator"], max_tokens=48)
        await c.send_message(done, "What is 2 plus 3?", tool_choice={"name": "Calculator"})
        await c.send_message(done, "Thanks. And 4 times 5?", tool_choice="none")
        human = await c.create_session(tools=["human"], max_tokens=48)
        await c.send_message(human, "Book a table", tool_choice={"name": "AskHuman"})
        client = await c.create_session(tools=[], max_tokens=48, client_tools=[
            {"name": "lookup", "description": "find a record", "type": "qa", "expected_s": 2.0}])
        await c.send_message(client, "Find order 12", tool_choice={"name": "lookup"})
        busy = await c.create_session(tools=[], max_tokens=400, system="You tell long stories.")
        roles = {done.id: "done", human.id: "human", client.id: "client", busy.id: "busy"}
        tokens = 0
        async for ev in c.stream_message(busy, "Tell me a long story"):
            tokens += ev.name == "token"
            if tokens == 12:
                break_at = tokens
                # Committed batches only: the copy is what a kill -9 now would leave.
                await asyncio.sleep(0.5)
                src = sqlite3.connect(gw.store.path)
                dst = sqlite3.connect(out_dir / "store_v1.sqlite")
                src.backup(dst)
                dst.execute("PRAGMA journal_mode=DELETE")
                dst.execute("VACUUM")
                dst.close()
                src.close()
                assert break_at == 12
            if tokens > 12:
                break
        model_path = str(gw.engine.model_path)
    # Read back from a copy: a restore commits (the interrupted turn's marks), and the data must stay as
    # the server left it.
    shutil.copyfile(out_dir / "store_v1.sqlite", tmp / "read_back.sqlite")
    expected = await read_back(tmp / "read_back.sqlite", model_path)
    assert {roles[sid] for sid in expected} == {"done", "human", "client", "busy"}
    assert expected[busy.id]["transcript"][-1].get("interrupted") is True
    (out_dir / "store_v1.expected.json").write_text(json.dumps(
        {"model_path": model_path, "roles": roles, "sessions": expected}, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
