"""The PostgreSQL session store (`gateway/store_pg.py`) against a real PostgreSQL server the tests start
themselves (tests/pg.py): the SQLite store's interface and promise (each write committed when its await
returns, group commits, late writes after a close fail, a deleted session takes no late appends), two
stores on one database as two replicas would open it, a lost connection reopened, the gateway opening
it from `server.store`. Skipped, with the reason, where PostgreSQL cannot run."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.config import GatewayConfig, ServerConfig, server_config
from gateway.store import SCHEMA_VERSION, StoreError
from gateway.store_pg import PostgresStore, redact
from tests.gateway.test_store import check_one_commit_for_the_queue, check_round_trip, queue_writes
from tests.pg import PgServer

REPO = Path(__file__).resolve().parents[2]
_names = itertools.count()


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    server, why = PgServer.find()
    if server is None:
        pytest.skip(f"no PostgreSQL server here: {why}")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def db_url(pg: PgServer) -> AsyncIterator[str]:
    """A fresh database of its own for each test."""
    import asyncpg

    name = f"t{os.getpid()}_{next(_names)}"
    admin = await asyncpg.connect(pg.url("postgres"))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield pg.url(name)


async def test_put_get_list_delete_and_append(db_url: str) -> None:
    store = await PostgresStore.open(db_url)
    try:
        await check_round_trip(store)
        async with store._pool.acquire() as db:
            assert await db.fetchval("SELECT COUNT(*) FROM infercept_events WHERE session_id = 'a'") == 0
        assert store.commits >= 7 and store.writes >= 7 and store.persistent
    finally:
        await store.close()


async def _held(store: PostgresStore) -> tuple[asyncio.Future[object], asyncio.Event]:
    """A job that holds the writer inside its transaction until the returned event is set; returned
    once the writer runs it (nothing else is queued then)."""
    running, gate = asyncio.Event(), asyncio.Event()

    async def hold(db: object) -> bool:
        running.set()
        await gate.wait()
        return True

    blocker = asyncio.ensure_future(store._submit(hold))
    await asyncio.wait_for(running.wait(), 10)
    assert store._jobs.qsize() == 0
    return blocker, gate


async def test_writes_queued_during_a_transaction_share_the_next_one(db_url: str) -> None:
    store = await PostgresStore.open(db_url)
    try:
        await store.put("s", "h", {})
        blocker, gate = await _held(store)
        writes = queue_writes(store)
        await asyncio.sleep(0)
        assert store._jobs.qsize() == 100
        await check_one_commit_for_the_queue(store, blocker, writes, gate.set)
    finally:
        await store.close()


async def test_one_bad_write_fails_its_caller_only(db_url: str) -> None:
    store = await PostgresStore.open(db_url)
    try:
        blocker, gate = await _held(store)

        async def bad(db: object) -> None:
            await db.execute("SELECT no_such_column FROM infercept_sessions")  # type: ignore[attr-defined]

        failing = asyncio.ensure_future(store._submit(bad))
        good = asyncio.ensure_future(store.put("s", "h", {"ok": True}))
        await asyncio.sleep(0)
        gate.set()
        await blocker
        with pytest.raises(StoreError, match="no_such_column"):
            await failing
        await good
        assert (await store.get("s")).head == {"ok": True}  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_writes_queued_after_close_fail_instead_of_hanging(db_url: str) -> None:
    store = await PostgresStore.open(db_url)
    blocker, gate = await _held(store)
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)
    late = asyncio.ensure_future(store.put("s", "h", {}))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(closing, 10)
    assert await blocker is True
    with pytest.raises(StoreError):
        await asyncio.wait_for(late, 5)  # settled, not awaited forever
    with pytest.raises(StoreError, match="closed"):
        await store.put("s", "h", {})


async def test_two_replicas_open_one_database_at_once_and_read_each_others_writes(db_url: str) -> None:
    a, b = await asyncio.gather(PostgresStore.open(db_url), PostgresStore.open(db_url))  # one creates the schema
    try:
        await a.put("s", "h", {"owner": "a"})
        await a.append_event("s", [{"k": "msg", "content": "from a"}])
        got = await b.get("s")
        assert got is not None and got.head == {"owner": "a"} and got.events == [{"k": "msg", "content": "from a"}]
        await b.append_event("s", [{"k": "msg", "content": "from b"}], {"owner": "b"})
        got = await a.get("s")
        assert got is not None and got.head == {"owner": "b"} and [e["content"] for e in got.events] == ["from a", "from b"]
    finally:
        await asyncio.gather(a.close(), b.close())


async def test_a_lost_writer_connection_is_reopened_and_no_acknowledged_write_is_lost(db_url: str) -> None:
    """The server ends the writer's connection (a restart, a failover). A write either commits (asyncpg
    noticed first and the writer reconnected before its batch) or fails its caller with StoreError (its
    batch raced the loss); never a hang, and every write that returned is in the log."""
    store = await PostgresStore.open(db_url)
    try:
        await store.put("s", "h", {"n": 0})
        pid = store._writer.get_server_pid()
        async with store._pool.acquire() as db:
            assert await db.fetchval("SELECT pg_terminate_backend($1)", pid)
        acked = []
        for i in range(20):
            try:
                await asyncio.wait_for(store.append_event("s", [{"k": "text", "text": str(i)}], {"n": i}), 10)
                acked.append(str(i))
            except StoreError:
                pass
        await store.append_event("s", [{"k": "text", "text": "after"}], {"n": "after"})  # reopened
        assert store._writer.get_server_pid() != pid and acked
        got = await store.get("s")
        assert got is not None and got.head == {"n": "after"}
        assert [e["text"] for e in got.events] == [*acked, "after"]
    finally:
        await store.close()


WRITER = """
import asyncio, sys
from gateway.store_pg import PostgresStore

async def main():
    store = await PostgresStore.open(sys.argv[1])
    await store.put("s", "h", {"n": 0})
    for i in range(1, 100000):
        await store.append_event("s", [{"k": "text", "text": str(i)}], {"n": i})
        print(i, flush=True)  # only after the commit returned

asyncio.run(main())
"""


async def test_a_commit_survives_kill_9_of_the_replica(db_url: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, db_url], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen = int(line)
        if seen >= 200:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = await PostgresStore.open(db_url)
    try:
        got = await store.get("s")
        assert got is not None and got.head["n"] >= seen
        assert [int(e["text"]) for e in got.events] == list(range(1, got.head["n"] + 1))  # head and log agree
    finally:
        await store.close()


async def test_the_store_refuses_a_newer_schema_and_names_an_unreachable_url_without_its_password(db_url: str, pg: PgServer) -> None:
    store = await PostgresStore.open(db_url)
    async with store._pool.acquire() as db:
        await db.execute("UPDATE infercept_meta SET value = $1 WHERE key = 'schema_version'", str(SCHEMA_VERSION + 1))
    await store.close()
    with pytest.raises(StoreError, match="schema version"):
        await PostgresStore.open(db_url)
    bad = f"postgresql://someone:s3cret@127.0.0.1:{pg.port}/no_such_db"
    with pytest.raises(StoreError) as err:
        await PostgresStore.open(bad, connect_timeout_s=5)
    assert "s3cret" not in str(err.value) and "someone:***@" in str(err.value)
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"


def test_server_store_takes_a_postgresql_url_and_refuses_anything_else() -> None:
    assert server_config({"store": "postgresql://u@db:5432/infercept"}).store == "postgresql://u@db:5432/infercept"
    assert server_config({}).store is None  # SQLite at server.state_path
    with pytest.raises(ValueError, match="server.store: expected a postgresql:// URL"):
        server_config({"store": "mysql://u:pw@h/db"})
    with pytest.raises(ValueError, match=r"\*\*\*"):  # the password is not echoed
        server_config({"store": "redis://u:pw@h/db"})


async def test_the_gateway_opens_its_store_from_server_store(db_url: str, tmp_path: Path) -> None:
    from engine_adapter.config import EngineConfig
    from gateway.gateway import Gateway

    cfg = GatewayConfig(server=ServerConfig(store=db_url, state_path=str(tmp_path / "state" / "sessions.db")),
                        augmentations={"calculator": {}})
    gw = Gateway(EngineConfig(model="tiny", policy="infercept"), cfg)
    await gw.open()
    try:
        assert isinstance(gw.store, PostgresStore) and gw.store.path == db_url
        assert not (tmp_path / "state" / "sessions.db").exists()  # no SQLite file beside it
        await gw.store.put("s", "h", {})
        assert await gw.store.list() == ["s"]
    finally:
        await gw.close()
