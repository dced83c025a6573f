"""The session table's fault paths on fakes (no engine, no server): a session store that fails answers
503 or an `error` event, never a 500 or a cut stream; a request cancelled in the middle of a write never
leaves an orphan row or a session that comes back after a restart; one malformed stored session does not
keep the others from coming back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.agent import AgentSession
from gateway.http import ApiError
from gateway.schemas import TokenEvent
from gateway.session_table import SessionTable
from gateway.store import StoredSession, StoreError
from tests.gateway.standins import stand_in_ctx
from tests.waiting import wait_until

MODEL = "tiny-model-path"


class FakeStore:
    """The store interface in a dict; `fail` makes every write raise StoreError, `gate` holds puts."""

    def __init__(self) -> None:
        self.rows: dict[str, StoredSession] = {}
        self.fail = False
        self.gate: asyncio.Event | None = None
        self.put_started = asyncio.Event()  # a put is under way (waiting at the gate, if there is one)
        self.deletes: list[str] = []

    async def put(self, sid: str, token_hash: str, head: dict[str, Any]) -> None:
        async def write() -> None:
            self.put_started.set()
            if self.gate is not None:
                await self.gate.wait()
            if self.fail:
                raise StoreError("disk I/O error")
            self.rows[sid] = StoredSession(sid, token_hash, dict(head), self.rows[sid].events if sid in self.rows else [])

        # As SQLite's writer thread does: a queued write happens even if its caller stops waiting.
        await asyncio.shield(asyncio.ensure_future(write()))

    async def append_event(self, sid: str, events: list[dict[str, Any]], head: dict[str, Any] | None = None) -> None:
        if self.fail:
            raise StoreError("disk I/O error")

    async def get(self, sid: str) -> StoredSession | None:
        return self.rows.get(sid)

    async def list(self, awake_only: bool = False) -> list[str]:
        return [sid for sid, row in self.rows.items() if not (awake_only and row.head.get("hibernated"))]

    async def hibernated_before(self, last_active: float) -> list[str]:
        return [sid for sid, row in self.rows.items() if row.head.get("hibernated") and row.head["last_active"] < last_active]

    async def delete(self, sid: str) -> None:
        self.deletes.append(sid)
        self.rows.pop(sid, None)


def fake_ctx() -> Any:
    return stand_in_ctx(MODEL)


async def open_one(table: SessionTable, ctx: Any) -> AgentSession:
    return await table.open(ctx, system=None, tools=[], client_tools={}, max_tokens=16, temperature=0.0, seed=None)


async def test_a_create_whose_store_write_fails_is_503_and_leaves_nothing() -> None:
    store, ctx = FakeStore(), fake_ctx()
    table = SessionTable(store)  # type: ignore[arg-type]
    store.fail = True
    with pytest.raises(ApiError) as e:
        await open_one(table, ctx)
    assert e.value.status == 503 and e.value.kind == "store_unavailable" and e.value.extra["retry_after"] > 0
    assert not table.live and not store.rows and len(store.deletes) == 1
    assert ctx.engine.opened[0].closed  # its engine session freed


async def test_a_create_cancelled_during_its_write_leaves_no_orphan_row() -> None:
    store, ctx = FakeStore(), fake_ctx()
    table = SessionTable(store)  # type: ignore[arg-type]
    store.gate = asyncio.Event()
    task = asyncio.ensure_future(open_one(table, ctx))
    await asyncio.wait_for(store.put_started.wait(), 5)  # the put is under way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    store.gate.set()  # the write lands after the request is gone ...
    await wait_until(lambda: store.deletes, 5, "the orphan row's removal")
    assert not store.rows and not table.live  # ... and is removed again: nobody has its id
    assert ctx.engine.opened[0].closed


async def test_delete_removes_the_row_even_when_ending_the_session_fails_or_is_cancelled() -> None:
    store, ctx = FakeStore(), fake_ctx()
    removed: list[str] = []

    async def on_removed(sid: str) -> None:
        removed.append(sid)

    table = SessionTable(store, on_removed=on_removed)  # type: ignore[arg-type]
    broken = await open_one(table, ctx)

    async def boom() -> None:
        raise RuntimeError("end_session failed")

    broken.close = boom  # type: ignore[method-assign]
    await table.close(broken.id)
    assert broken.id not in store.rows and removed == [broken.id]

    slow = await open_one(table, ctx)
    started = asyncio.Event()

    async def hang() -> None:
        started.set()
        await asyncio.sleep(3600)

    slow.close = hang  # type: ignore[method-assign]
    task = asyncio.ensure_future(table.close(slow.id))
    await started.wait()
    task.cancel()  # the DELETE request's handler is cancelled (its client went away)
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: removed[-1] == slow.id, 5, "the shielded removal of the row")
    assert slow.id not in store.rows and slow.id not in table.live and removed[-1] == slow.id


def stored_head(sid: str, **over: Any) -> dict[str, Any]:
    head = {"v": 1, "id": sid, "created": time.time(), "last_active": time.time(), "model": MODEL,
            "settings": {"system": None, "tools": [], "client_tools": {}, "max_tokens": 16, "temperature": 0.0, "seed": None},
            "state": "awaiting_user", "pending_call_id": None, "usage": {"prompt_tokens": 0, "completion_tokens": 0},
            "last_end_reason": "stop"}
    head.update(over)
    return head


async def test_one_malformed_stored_session_is_skipped_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    store, ctx = FakeStore(), fake_ctx()
    store.rows["sess-good"] = StoredSession("sess-good", "h", stored_head("sess-good"), [{"k": "ids", "ids": [1, 2]}])
    store.rows["sess-bad"] = StoredSession("sess-bad", "h", stored_head("sess-bad", settings="garbage"), [])
    store.rows["sess-bad2"] = StoredSession("sess-bad2", "h", stored_head("sess-bad2", created=None), [])
    store.rows["sess-good2"] = StoredSession("sess-good2", "h", stored_head("sess-good2", state="generating"), [])
    table = SessionTable(store)  # type: ignore[arg-type]
    assert await table.restore_all(ctx) == 2
    assert table.skipped == 2 and set(table.live) == {"sess-good", "sess-good2"}
    assert set(store.rows) == {"sess-good", "sess-bad", "sess-bad2", "sess-good2"}  # left stored, not deleted
    assert table.live["sess-good2"].transcript[-1]["interrupted"] is True
    assert "sess-bad" in caplog.text and "sess-bad2" in caplog.text
    # The engine session opened for the row that failed after it is closed again.
    assert [es.closed for es in ctx.engine.opened if es.id == "sess-bad2"] == [True]


async def test_a_batch_the_store_cannot_commit_becomes_a_store_unavailable_error() -> None:
    store, ctx = FakeStore(), fake_ctx()
    table = SessionTable(store)  # type: ignore[arg-type]
    s = await open_one(table, ctx)
    s.generating()
    s.wrote("Thought: ")
    store.fail = True
    s.emit(TokenEvent(text="Thought: "))
    batches = [b async for b in s.events()]
    assert batches == [[], [("error", {"type": "store_unavailable", "message": batches[1][0][1]["message"]})]]
    assert "disk I/O error" in batches[1][0][1]["message"]
    # The turn is interrupted for the store, not counted as a client disconnect; the session stays usable.
    assert s.state == "idle" and s.transcript[-1] == {"role": "assistant", "content": "Thought: ", "interrupted": True,
                                                      "reason": "store_unavailable"}
    ctx.metrics.disconnects.inc.assert_not_called()


def test_the_intercept_event_carries_a_ttl_policys_ttl() -> None:
    """A TTL policy (continuum) sets how long the KV stays at the pause; the client's event shows it."""
    from engine_adapter.intercept.records import InterceptRecord
    from gateway.records import CallRecord
    from gateway.schemas import InterceptEvent

    call = CallRecord(call_id="call_1", tool="Calculator", arguments="1+1", kind="server")
    rec = InterceptRecord(intercept_id=1, session_id="s", request_id="r", aug_type="math", trigger="Calculator",
                          tool="Calculator", policy="continuum", context_tokens=40, paused_at_s=0.0, ttl_s=2.5)
    call.paused(rec)
    ev = InterceptEvent.of(call, rec)
    assert ev.ttl_s == 2.5 and ev.engine_policy == "continuum"
    assert InterceptEvent.of(call, None).ttl_s is None
