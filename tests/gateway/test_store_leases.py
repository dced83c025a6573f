"""Ownership of sessions among replicas sharing one PostgreSQL store (`PostgresStore.join`): leases held
by heartbeats on the database's clock, claims the database decides, and fencing: a replica whose lease
lapsed and whose session was claimed cannot write over the new owner, even after it wakes up. Against a
real PostgreSQL server the tests start (tests/pg.py); skipped, with the reason, where none can run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.store import Fenced, StoreError
from gateway.store_pg import PostgresStore
from tests.gateway.test_store_pg import db_url, pg  # noqa: F401  (fixtures)

LEASE_S = 30.0  # long: a lease lapses in these tests only by `leave`, or where a test shortens it


@pytest_asyncio.fixture
async def stores(db_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:  # noqa: F811
    """Two replicas' stores on one database, joined as "a" and "b"."""
    a, b = await PostgresStore.open(db_url), await PostgresStore.open(db_url)
    try:
        await a.join("a", "http://127.0.0.1:1", LEASE_S)
        await b.join("b", "http://127.0.0.1:2", LEASE_S)
        yield a, b
    finally:
        await a.close()
        await b.close()


async def log_of(store: PostgresStore, sid: str) -> list[dict[str, object]]:
    stored = await store.get(sid)
    assert stored is not None
    return stored.events


async def test_each_join_is_a_new_epoch_and_an_old_incarnation_loses_its_heartbeat(db_url: str) -> None:  # noqa: F811
    first, second = await PostgresStore.open(db_url), await PostgresStore.open(db_url)
    try:
        assert await first.join("r", "http://x:1", LEASE_S) == 1
        assert await first.heartbeat()
        assert await second.join("r", "http://x:2", LEASE_S) == 2  # the same replica, restarted
        assert not await first.heartbeat() and await second.heartbeat()
        with pytest.raises(ValueError):
            await second.join("", "http://x", LEASE_S)
    finally:
        await first.close()
        await second.close()


async def test_a_live_owner_keeps_its_session_and_its_writes(stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = stores
    await a.put("s", "h", {"v": 1})
    owner = await b.owner("s")
    assert owner is not None and (owner.replica_id, owner.url, owner.epoch, owner.alive) == ("a", "http://127.0.0.1:1", 1, True)
    assert not await b.claim("s")
    with pytest.raises(Fenced):
        await b.append_event("s", [{"t": "b"}], {"v": 2})
    with pytest.raises(Fenced):
        await b.delete("s")
    await a.append_event("s", [{"t": "a"}])  # no head: the owner's check alone
    stored = await a.get("s")
    assert stored is not None and stored.head == {"v": 1} and stored.events == [{"t": "a"}]
    assert await b.owner("missing") is None and not await b.claim("missing")


async def test_a_lapsed_owner_is_fenced_after_a_takeover_even_when_it_wakes_up(stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = stores
    await a.put("s", "h", {"v": 1})
    await a.append_event("s", [{"t": "a1"}])
    await a.leave()  # as if its heartbeats had stopped for a whole lease
    owner = await b.owner("s")
    assert owner is not None and not owner.alive
    assert await b.claim("s")
    await b.append_event("s", [{"t": "b1"}], {"v": 2})
    # "a" wakes up (a pause, a partition healed): its lease renews, but the session is not its any more.
    assert await a.heartbeat()
    for write in (a.append_event("s", [{"t": "a2"}], {"v": 3}), a.append_event("s", [{"t": "a3"}]),
                  a.put("s", "h", {"v": 4}), a.delete("s")):
        with pytest.raises(Fenced) as err:
            await write
        assert err.value.sid == "s"
    assert not await a.claim("s")  # "b" holds it, alive
    stored = await b.get("s")
    assert stored is not None and stored.head == {"v": 2} and stored.events == [{"t": "a1"}, {"t": "b1"}]
    await b.delete("s")
    assert await b.get("s") is None


async def test_a_lease_lapses_by_itself_when_the_heartbeats_stop(db_url: str) -> None:  # noqa: F811
    a, b = await PostgresStore.open(db_url), await PostgresStore.open(db_url)
    try:
        await a.join("a", "http://a", 0.2)
        await b.join("b", "http://b", 0.2)
        await a.put("s", "h", {})
        assert not await b.claim("s")
        for _ in range(100):  # no heartbeat from "a" from now on
            await asyncio.sleep(0.05)
            await b.heartbeat()
            owner = await b.owner("s")
            if owner is not None and not owner.alive:
                break
        assert owner is not None and not owner.alive
        assert await b.claim("s")
    finally:
        await a.close()
        await b.close()


async def test_two_replicas_claiming_one_orphan_at_once_one_wins(stores: tuple[PostgresStore, PostgresStore], db_url: str) -> None:  # noqa: F811
    a, b = stores
    c = await PostgresStore.open(db_url)
    try:
        await c.join("c", "http://c", LEASE_S)
        for i in range(20):
            await c.put(f"s{i}", "h", {})
        await c.leave()
        results = await asyncio.gather(*(store.claim(f"s{i}") for i in range(20) for store in (a, b)))
        assert all(x != y for x, y in zip(results[::2], results[1::2]))  # exactly one of each pair
        owners = [await a.owner(f"s{i}") for i in range(20)]
        assert all(o is not None and o.replica_id == ("a" if won else "b") for o, won in zip(owners, results[::2]))
    finally:
        await c.close()


async def test_a_restarted_replica_finds_and_reclaims_its_own_sessions(stores: tuple[PostgresStore, PostgresStore], db_url: str) -> None:  # noqa: F811
    a, b = stores
    await a.put("s1", "h", {})
    await b.put("s2", "h", {})
    await a.put("s3", "h", {})
    again = await PostgresStore.open(db_url)
    try:
        assert await again.join("a", "http://127.0.0.1:1", LEASE_S) == 2
        assert await again.owned() == ["s1", "s3"]
        with pytest.raises(Fenced):  # its earlier incarnation's epoch is not its own
            await again.append_event("s1", [{"t": "x"}])
        assert await again.claim("s1")  # an earlier incarnation of itself: no wait for the lease
        await again.append_event("s1", [{"t": "x"}])
        with pytest.raises(Fenced):  # and the earlier incarnation, should it still run, is fenced
            await a.append_event("s1", [{"t": "y"}])
        assert not await again.claim("s2")
        assert await log_of(again, "s1") == [{"t": "x"}]
    finally:
        await again.close()


async def test_a_store_that_did_not_join_writes_as_a_single_server_does(db_url: str) -> None:  # noqa: F811
    store = await PostgresStore.open(db_url)
    try:
        await store.put("s", "h", {"v": 1})
        await store.append_event("s", [{"t": 1}], {"v": 2})
        assert await store.owner("s") is None
        with pytest.raises(StoreError, match="join"):
            await store.claim("s")
        await store.delete("s")
        assert await store.list() == []
    finally:
        await store.close()


def test_replica_settings_need_a_shared_store_and_a_positive_lease() -> None:
    from gateway.config import server_config

    url = "postgresql://u@db:5432/infercept"
    cfg = server_config({"store": url, "replica_id": "r1", "advertise_url": "http://10.0.0.5:8000", "lease_s": 5})
    assert (cfg.replica_id, cfg.advertise_url, cfg.lease_s) == ("r1", "http://10.0.0.5:8000", 5)
    with pytest.raises(ValueError, match="server.replica_id: replicas share a PostgreSQL store"):
        server_config({"replica_id": "r1"})
    with pytest.raises(ValueError, match="server.advertise_url: only a replica"):
        server_config({"store": url, "advertise_url": "http://x"})
    with pytest.raises(ValueError, match="server.lease_s must be positive"):
        server_config({"store": url, "replica_id": "r1", "lease_s": 0})


async def test_opening_a_store_on_existing_tables_takes_no_table_lock(db_url: str) -> None:  # noqa: F811
    """A replica (re)starting while another writes: opening must not wait for, or deadlock with, the
    other's transactions (an ALTER TABLE would take an exclusive lock even when it changes nothing)."""
    import asyncpg

    first = await PostgresStore.open(db_url)
    holder = await asyncpg.connect(db_url)
    try:
        await first.put("s", "h", {})
        tx = holder.transaction()
        await tx.start()
        await holder.execute("UPDATE infercept_sessions SET updated = 0 WHERE id = 's'")  # a writer mid-transaction
        second = await asyncio.wait_for(PostgresStore.open(db_url), 10)
        await second.close()
        await tx.rollback()
    finally:
        await holder.close()
        await first.close()


async def test_replicas_read_each_others_artifacts_from_the_shared_store(db_url: str, tmp_path: Path) -> None:  # noqa: F811
    """An image made on one replica is served by another (after a takeover, or through the balancer),
    and leaves the shared store with its session."""
    from augmentations.base import Artifact
    from gateway.artifacts import ArtifactStore

    a, b = await PostgresStore.open(db_url), await PostgresStore.open(db_url)
    try:
        mine = ArtifactStore(2**20, tmp_path / "a", shared=a)
        theirs = ArtifactStore(2**20, None, shared=b)
        url = await mine.put(Artifact("image", "image/png", b"\x89PNG fake"), "sess-1")
        aid = url.rsplit("/", 1)[1]
        got = await theirs.fetch(aid)
        assert got is not None and (got.mime, got.session_id, await theirs.read(got)) == ("image/png", "sess-1", b"\x89PNG fake")
        assert len(theirs) == 0  # read through, not kept: the maker bounds its own
        assert await theirs.fetch("nope.png") is None
        await theirs.drop_session("sess-1")  # the session ended on the other replica
        assert await theirs.fetch(aid) is None and await b.get_artifact(aid) is None
        assert (await mine.fetch(aid)) is not None  # the maker's own copy until its session ends there
    finally:
        await a.close()
        await b.close()
