"""The persisted session format: a database written by format 1 (the gateway as it was before the
session layer was reworked, `data/make_store_v1.py`) is read back exactly as that code read it; a session
in a format this server does not read, or with a call row it does not know, is refused with an error
that says so and left stored; what this code writes reads back the same."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.agent import AgentSession
from gateway.durable import FORMAT_VERSION, READABLE
from gateway.session_table import SessionTable
from gateway.store import SqliteStore
from tests.gateway.standins import StandInEngineSession, opened_by_id, stand_in_ctx

DATA = Path(__file__).resolve().parent / "data"
EXPECTED = json.loads((DATA / "store_v1.expected.json").read_text())


def as_read(s: AgentSession, es: StandInEngineSession) -> dict[str, Any]:
    """A restored session in the terms of `data/make_store_v1.py` (what format 1's code read back)."""
    return {
        "state": s.state, "public_state": s.public_state(), "system": s.system, "tools": s.tools,
        "client_tools": s.client_tools, "max_tokens": s.max_tokens, "created": s.created_s,
        "token_hash": s.token_hash, "transcript": s.transcript, "calls": [c.dump() for c in s.calls],
        "usage": s.usage, "last_end_reason": s.last_end_reason, "announce_restore": s.announce_restore,
        "partial": s.partial, "pending_call": s.pending_call.call_id if s.pending_call else None,
        # `ignore_eos` came after format 1: its sessions open with it off, and format 1 did not pass it.
        "context": es.history, "engine_session": {k: v for k, v in es.opened_with.items() if k != "ignore_eos"},
        "ignore_eos": es.opened_with.get("ignore_eos"),
    }


@pytest.fixture
def v1_copy(tmp_path: Path) -> Path:
    db = tmp_path / "sessions.db"
    shutil.copyfile(DATA / "store_v1.sqlite", db)
    return db


async def restore(db: Path) -> tuple[SessionTable, Any, SqliteStore]:
    store = SqliteStore(db)
    ctx = stand_in_ctx(EXPECTED["model_path"])
    table = SessionTable(store)  # type: ignore[arg-type]
    await table.restore_all(ctx)
    return table, ctx, store


def test_the_test_data_is_format_1() -> None:
    db = sqlite3.connect(DATA / "store_v1.sqlite")
    try:
        heads = [json.loads(h) for (h,) in db.execute("SELECT head FROM sessions")]
    finally:
        db.close()
    assert len(heads) == 4 and {h["v"] for h in heads} == {1}
    assert FORMAT_VERSION == 1 and 1 in READABLE
    assert sorted(h["state"] for h in heads) == ["awaiting_user", "generating", "idle", "in_tool"]


async def test_a_format_1_database_is_read_back_exactly(v1_copy: Path) -> None:
    table, ctx, store = await restore(v1_copy)
    try:
        assert table.skipped == 0 and set(table.live) == set(EXPECTED["sessions"])
        for sid, want in EXPECTED["sessions"].items():
            assert as_read(table.live[sid], opened_by_id(ctx)[sid]) == want | {"ignore_eos": False}, EXPECTED["roles"][sid]
        roles = {role: table.live[sid] for sid, role in EXPECTED["roles"].items()}
        # What the data holds, spelled out: a finished turn with a tool call and its intercept, two pending
        # calls (a human's answer, a client's result), and a turn cut off mid-generation.
        done = roles["done"]
        assert done.state == "idle" and done.calls[0].tool == "Calculator" and done.calls[0].result is not None
        assert done.calls[0].intercept_id is not None and done.calls[0].restored_by == "preserve"
        assert roles["human"].public_state() == "awaiting_user" and roles["human"].pending_call.kind == "human"  # type: ignore[union-attr]
        assert roles["client"].state == "in_tool" and roles["client"].pending_call.kind == "client"  # type: ignore[union-attr]
        busy = roles["busy"]
        assert busy.transcript[-1]["interrupted"] is True and busy.transcript[-1]["reason"] == "server_restart"
        for s in table.live.values():  # and the API can show each of them
            s.info([])
    finally:
        await store.close()


async def test_what_this_code_writes_reads_back_the_same(v1_copy: Path) -> None:
    table, ctx, store = await restore(v1_copy)  # restoring commits (the interrupted turn's marks)
    try:
        first = {sid: as_read(s, opened_by_id(ctx)[sid]) for sid, s in table.live.items()}
        for s in table.live.values():
            s.touch()
            await s.commit()
    finally:
        await store.close()
    again, ctx2, store2 = await restore(v1_copy)
    try:
        for sid, s in again.live.items():
            got = as_read(s, opened_by_id(ctx2)[sid])
            assert got.pop("announce_restore") == first[sid].pop("announce_restore")
            assert got == first[sid]
        stored = await store2.get(next(iter(again.live)))
        assert stored is not None and stored.head["v"] == FORMAT_VERSION
    finally:
        await store2.close()


def rewrite(db: Path, sid: str, head: dict[str, Any] | None = None, call_row: dict[str, Any] | None = None) -> None:
    con = sqlite3.connect(db)
    try:
        if head is not None:
            con.execute("UPDATE sessions SET head = ? WHERE id = ?", (json.dumps(head), sid))
        if call_row is not None:
            con.execute("INSERT INTO events (session_id, body) VALUES (?, ?)", (sid, json.dumps(call_row)))
        con.commit()
    finally:
        con.close()


async def test_an_unknown_format_or_call_field_is_refused_and_left_stored(v1_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    newer, renamed = sorted(EXPECTED["sessions"])[:2]
    con = sqlite3.connect(v1_copy)
    (head,) = con.execute("SELECT head FROM sessions WHERE id = ?", (newer,)).fetchone()
    con.close()
    rewrite(v1_copy, newer, head={**json.loads(head), "v": 2})
    call = EXPECTED["sessions"][renamed]["calls"][0] if EXPECTED["sessions"][renamed]["calls"] else None
    row = {"k": "call", **({k: v for k, v in call.items() if k != "tool"} if call else {"call_id": "c"}), "tool_name": "T"}
    rewrite(v1_copy, renamed, call_row=row)
    table, _, store = await restore(v1_copy)
    try:
        assert table.skipped == 2 and set(table.live) == set(EXPECTED["sessions"]) - {newer, renamed}
        assert f"session {newer!r} is stored in format 2; this server reads format 1" in caplog.text
        assert "tool_name" in caplog.text and "Extra inputs are not permitted" in caplog.text
        assert set(await store.list()) == set(EXPECTED["sessions"])  # left stored, for a server that reads them
    finally:
        await store.close()
