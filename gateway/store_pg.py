"""`SessionStore` on PostgreSQL (asyncpg): the store several gateway replicas share.

The same schema and the same promise as `SqliteStore` (gateway/store.py): a session is a head rewritten
at each commit plus an append-only log of events, and every write is committed when its await returns.
Writes go through one writer task on one connection that commits group-wise, as the SQLite writer
thread does: every write queued while the previous transaction ran goes into the next one, each in a
savepoint of its own (one bad write fails its caller, not the others), so a server streaming thousands
of sessions costs a handful of commits per scheduling round. Writes of one session are queued in the
order they were made, so they commit in that order. Reads take a pooled connection of their own.

Replicas may open the same database at once: the schema is created under an advisory lock. The tables
are prefixed (`infercept_`), so the database can be shared with other applications.

Ownership (`join`): a replica that joins holds a lease, a row in `infercept_replicas` with a heartbeat
(the database's clock, so that replicas' clocks need not agree) and an epoch, its fencing number, which
grows at every join. Every session it creates or claims records it as owner (`owner`, `owner_epoch`), and
from then on each of its writes to the session carries both: a write whose owner and epoch no longer
match (another replica claimed the session after this one's lease lapsed) changes nothing and raises
`Fenced`. A session can be claimed only when it has no owner, is already the claimant's, or its owner's
lease has lapsed (no heartbeat for `lease_s`) or belongs to an earlier incarnation (another epoch). The
database decides each claim in one statement, so two replicas never both win one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gateway.store import SCHEMA_VERSION, Fenced, StoredSession, StoreError, _dump, take_batch

log = logging.getLogger("infercept.store")

SCHEMES = ("postgresql", "postgres")
_SCHEMA_LOCK = 0x1AFE_C0DE  # pg_advisory_xact_lock key: replicas create the schema one at a time
_SCHEMA = """
CREATE TABLE IF NOT EXISTS infercept_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS infercept_sessions (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL,
    head TEXT NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    created BIGSERIAL
);
CREATE TABLE IF NOT EXISTS infercept_events (
    seq BIGSERIAL PRIMARY KEY,
    session_id TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS infercept_events_by_session ON infercept_events (session_id, seq);
CREATE TABLE IF NOT EXISTS infercept_replicas (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    lease_s DOUBLE PRECISION NOT NULL,
    heartbeat DOUBLE PRECISION NOT NULL
);
ALTER TABLE infercept_sessions ADD COLUMN IF NOT EXISTS owner TEXT;
ALTER TABLE infercept_sessions ADD COLUMN IF NOT EXISTS owner_epoch BIGINT;
CREATE TABLE IF NOT EXISTS infercept_artifacts (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    mime TEXT NOT NULL,
    data BYTEA NOT NULL,
    created DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS infercept_artifacts_by_session ON infercept_artifacts (session_id);
"""
# The tables' shape within one schema version (2: replicas and session owners; 3: artifacts; each added
# to version 1's tables without changing what version 1 servers read).
_REVISION = "3"


async def _revision(db: Any) -> str | None:
    """The tables' revision, None when they do not exist yet."""
    if not await db.fetchval("SELECT to_regclass('infercept_meta') IS NOT NULL"):
        return None
    return await db.fetchval("SELECT value FROM infercept_meta WHERE key = 'schema_revision'")


# Not a session that left memory while idle (`AgentSession.hibernate`).
_AWAKE = " AND (head::jsonb ->> 'hibernated') IS DISTINCT FROM 'true'"
# The database's clock, in seconds: every lease is judged by one clock.
_NOW = "extract(epoch from clock_timestamp())"
# A session's owner still holds its lease (the replica row of that epoch has a fresh heartbeat).
_OWNER_ALIVE = (f"EXISTS (SELECT 1 FROM infercept_replicas r WHERE r.id = s.owner AND r.epoch = s.owner_epoch "
                f"AND r.heartbeat > {_NOW} - r.lease_s)")

Conn = Any  # asyncpg.Connection (asyncpg ships no type hints)


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and urlsplit(str(url)).scheme in SCHEMES


def redact(url: str) -> str:
    """The URL without its password (for logs, /admin and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class Owner:
    replica_id: str
    url: str  # where the replica serves (its advertised URL)
    epoch: int
    alive: bool  # its lease holds


@dataclass
class _Job:
    fn: Callable[[Conn], Awaitable[Any]]
    future: asyncio.Future[Any]


class PostgresStore:
    """`SessionStore` on PostgreSQL. Open it with `await PostgresStore.open(url)`."""

    persistent = True

    def __init__(self, url: str, pool: Any, writer: Conn) -> None:
        self._url = url
        self.path = redact(url)  # what /admin reports (the SQLite store's file path)
        self._pool, self._writer = pool, writer
        self._jobs: asyncio.Queue[_Job | None] = asyncio.Queue()
        self._closed = False
        self.commits = 0  # transactions committed
        self.writes = 0  # writes they carried
        self._task = asyncio.get_running_loop().create_task(self._run(), name="session-store-pg")
        # Set by `join`: this replica's id and fencing number; None: a single server, nothing fenced.
        self.replica_id: str | None = None
        self.epoch = 0

    @classmethod
    async def open(cls, url: str, *, pool_size: int = 4, connect_timeout_s: float = 10.0) -> PostgresStore:
        if not is_postgres_url(url):
            raise StoreError(f"not a PostgreSQL URL: {redact(url)!r} (postgresql://user:password@host:port/db)")
        try:
            import asyncpg
        except ImportError as e:
            raise StoreError("a PostgreSQL session store needs asyncpg: pip install 'infercept[postgres]'") from e
        pool = writer = None
        try:
            pool = await asyncpg.create_pool(url, min_size=1, max_size=pool_size, timeout=connect_timeout_s)
            writer = await asyncpg.connect(url, timeout=connect_timeout_s)
            async with writer.transaction():
                # DDL only when the tables are missing or older than this code: an ALTER TABLE takes an
                # exclusive lock on its table even when it changes nothing, and deadlocked with another
                # replica's writes when a replica restarted under load.
                if await _revision(writer) != _REVISION:
                    await writer.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                    await writer.execute(_SCHEMA)
                    await writer.execute("INSERT INTO infercept_meta (key, value) VALUES ('schema_version', $1) "
                                         "ON CONFLICT (key) DO NOTHING", str(SCHEMA_VERSION))
                    await writer.execute("INSERT INTO infercept_meta (key, value) VALUES ('schema_revision', $1) "
                                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value", _REVISION)
                version = await writer.fetchval("SELECT value FROM infercept_meta WHERE key = 'schema_version'")
            if int(version) != SCHEMA_VERSION:
                raise StoreError(f"schema version {version}, this server reads {SCHEMA_VERSION}")
        except BaseException as e:
            if writer is not None:
                await writer.close()
            if pool is not None:
                await pool.close()
            if isinstance(e, StoreError):
                raise
            if isinstance(e, Exception):
                raise StoreError(f"cannot open the session store {redact(url)}: {e}") from e
            raise
        return cls(url, pool, writer)

    # ------------------------------------------------------------------ ownership
    async def join(self, replica_id: str, url: str, lease_s: float) -> int:
        """Take this replica's lease (a new incarnation: a new epoch, so that sessions of the last one
        can be claimed again); returns the epoch, the fencing number every later write carries."""
        if not replica_id or lease_s <= 0:
            raise ValueError("a replica needs an id and a positive lease")
        self._check_open()
        async with self._pool.acquire() as db:
            epoch = await db.fetchval(
                f"INSERT INTO infercept_replicas (id, url, epoch, lease_s, heartbeat) VALUES ($1, $2, 1, $3, {_NOW}) "
                f"ON CONFLICT (id) DO UPDATE SET url = excluded.url, epoch = infercept_replicas.epoch + 1, "
                f"lease_s = excluded.lease_s, heartbeat = excluded.heartbeat RETURNING epoch", replica_id, url, float(lease_s))
        self.replica_id, self.epoch = replica_id, int(epoch)
        return self.epoch

    async def heartbeat(self) -> bool:
        """Renew the lease. False: this incarnation's row is gone or was replaced (the same id joined
        again elsewhere)."""
        self._check_open()
        async with self._pool.acquire() as db:
            status = await db.execute(f"UPDATE infercept_replicas SET heartbeat = {_NOW} WHERE id = $1 AND epoch = $2",
                                      self.replica_id, self.epoch)
        return not status.endswith(" 0")

    async def leave(self) -> None:
        """Give the lease up now (a clean shutdown): other replicas may claim its sessions at once."""
        if self.replica_id is None:
            return
        self._check_open()
        async with self._pool.acquire() as db:
            await db.execute("UPDATE infercept_replicas SET heartbeat = 0 WHERE id = $1 AND epoch = $2",
                             self.replica_id, self.epoch)

    async def claim(self, sid: str) -> bool:
        """Become the session's owner, if it has none, is this replica's already, or its owner's lease
        lapsed. False: it is not stored, or a live replica owns it."""
        self._require_joined()

        async def fn(db: Conn) -> bool:
            status = await db.execute(
                f"UPDATE infercept_sessions s SET owner = $2, owner_epoch = $3 WHERE s.id = $1 AND (s.owner IS NULL "
                f"OR (s.owner = $2 AND s.owner_epoch = $3) OR NOT {_OWNER_ALIVE})", sid, self.replica_id, self.epoch)
            return not status.endswith(" 0")

        return bool(await self._submit(fn))

    async def owner(self, sid: str) -> Owner | None:
        """Who owns a stored session (None: not stored, or no owner)."""
        self._check_open()
        async with self._pool.acquire() as db:
            row = await db.fetchrow(
                f"SELECT s.owner, s.owner_epoch, r.url, {_OWNER_ALIVE} AS alive FROM infercept_sessions s "
                f"LEFT JOIN infercept_replicas r ON r.id = s.owner WHERE s.id = $1", sid)
        if row is None or row["owner"] is None:
            return None
        return Owner(row["owner"], row["url"] or "", int(row["owner_epoch"]), bool(row["alive"]))

    async def owned(self, awake_only: bool = False) -> list[str]:
        """Sessions this replica id owned in any incarnation (the ones to read back at a start), oldest
        first (`awake_only`: not the hibernated ones)."""
        self._require_joined()
        async with self._pool.acquire() as db:
            rows = await db.fetch("SELECT id FROM infercept_sessions WHERE owner = $1" + (_AWAKE if awake_only else "")
                                  + " ORDER BY created", self.replica_id)
        return [r["id"] for r in rows]

    # ------------------------------------------------------------------ artifacts every replica reads
    async def put_artifact(self, aid: str, sid: str, mime: str, data: bytes) -> None:
        """Keep an artifact (committed when the await returns, before the event naming it is sent)."""
        async def fn(db: Conn) -> None:
            await db.execute("INSERT INTO infercept_artifacts (id, session_id, mime, data, created) VALUES ($1, $2, $3, $4, $5) "
                             "ON CONFLICT (id) DO NOTHING", aid, sid, mime, data, time.time())

        await self._submit(fn)

    async def get_artifact(self, aid: str) -> tuple[str, str, bytes] | None:
        """(session id, mime, bytes), or None."""
        self._check_open()
        async with self._pool.acquire() as db:
            row = await db.fetchrow("SELECT session_id, mime, data FROM infercept_artifacts WHERE id = $1", aid)
        return None if row is None else (row["session_id"], row["mime"], bytes(row["data"]))

    async def delete_artifacts(self, sid: str) -> None:
        async def fn(db: Conn) -> None:
            await db.execute("DELETE FROM infercept_artifacts WHERE session_id = $1", sid)

        await self._submit(fn)

    def _require_joined(self) -> None:
        if self.replica_id is None:
            raise StoreError("this store has not joined as a replica (join first)")

    def _fence(self, first: int) -> tuple[str, tuple[Any, ...]]:
        """The condition a joined replica's write carries (parameters from `$first`), or none."""
        if self.replica_id is None:
            return "", ()
        return f" AND owner = ${first} AND owner_epoch = ${first + 1}", (self.replica_id, self.epoch)

    # ------------------------------------------------------------------ the interface
    async def put(self, sid: str, token_hash: str, head: Mapping[str, Any]) -> None:
        body = _dump(head)
        owner = (self.replica_id, self.epoch if self.replica_id is not None else None)
        fence, args = self._fence(7)

        async def fn(db: Conn) -> None:
            # A new session is this replica's; an existing one is replaced only by its owner.
            status = await db.execute(
                "INSERT INTO infercept_sessions AS s (id, token_hash, head, updated, owner, owner_epoch) "
                "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO UPDATE SET token_hash = excluded.token_hash, "
                "head = excluded.head, updated = excluded.updated WHERE TRUE" + fence.replace("owner", "s.owner"),
                sid, token_hash, body, time.time(), *owner, *args)
            if status.endswith(" 0"):
                raise Fenced(sid)

        await self._submit(fn)

    async def append_event(self, sid: str, events: Sequence[Mapping[str, Any]], head: Mapping[str, Any] | None = None) -> None:
        rows = [(sid, _dump(e)) for e in events]
        body = _dump(head) if head is not None else None
        fence, args = self._fence(4)

        async def fn(db: Conn) -> None:
            if body is not None or fence:
                # The owner's check and the head's update in one statement (the head kept if none is given).
                status = await db.execute("UPDATE infercept_sessions SET head = COALESCE($1, head), updated = $2 "
                                          "WHERE id = $3" + fence, body, time.time(), sid, *args)
                if status.endswith(" 0"):
                    if fence and await db.fetchval("SELECT 1 FROM infercept_sessions WHERE id = $1", sid):
                        raise Fenced(sid)
                    return  # deleted meanwhile: nothing to append to
            if rows:
                await db.executemany("INSERT INTO infercept_events (session_id, body) VALUES ($1, $2)", rows)

        await self._submit(fn)

    async def get(self, sid: str) -> StoredSession | None:
        self._check_open()
        async with self._pool.acquire() as db, db.transaction(isolation="repeatable_read", readonly=True):
            row = await db.fetchrow("SELECT token_hash, head FROM infercept_sessions WHERE id = $1", sid)
            if row is None:
                return None
            bodies = await db.fetch("SELECT body FROM infercept_events WHERE session_id = $1 ORDER BY seq", sid)
        return StoredSession(sid, row["token_hash"], json.loads(row["head"]), [json.loads(r["body"]) for r in bodies])

    async def list(self, awake_only: bool = False) -> list[str]:
        self._check_open()
        where = " WHERE TRUE" + _AWAKE if awake_only else ""
        async with self._pool.acquire() as db:
            return [r["id"] for r in await db.fetch(f"SELECT id FROM infercept_sessions{where} ORDER BY created")]

    async def hibernated_before(self, last_active: float) -> list[str]:
        """Hibernated sessions last active before `last_active`; a replica's own, or ones whose owner's
        lease lapsed (expiry claims them before it deletes them)."""
        self._check_open()
        mine = (f" AND (s.owner IS NULL OR s.owner = $2 OR NOT {_OWNER_ALIVE})" if self.replica_id is not None else "")
        args = (last_active, self.replica_id) if self.replica_id is not None else (last_active,)
        async with self._pool.acquire() as db:
            rows = await db.fetch("SELECT s.id FROM infercept_sessions s WHERE (s.head::jsonb ->> 'hibernated') = 'true' "
                                  "AND (s.head::jsonb ->> 'last_active')::float8 < $1" + mine + " ORDER BY s.created", *args)
        return [r["id"] for r in rows]

    async def delete(self, sid: str) -> None:
        fence, args = self._fence(2)

        async def fn(db: Conn) -> None:
            status = await db.execute("DELETE FROM infercept_sessions WHERE id = $1" + fence, sid, *args)
            if status.endswith(" 0") and fence and await db.fetchval("SELECT 1 FROM infercept_sessions WHERE id = $1", sid):
                raise Fenced(sid)
            await db.execute("DELETE FROM infercept_events WHERE session_id = $1", sid)

        await self._submit(fn)

    async def close(self) -> None:
        """Finish the queued writes, then close the connections."""
        if not self._task.done():
            self._jobs.put_nowait(None)
            await asyncio.shield(self._task)
        self._closed = True
        await self._writer.close()
        await self._pool.close()

    # ------------------------------------------------------------------ the writer task
    def _check_open(self) -> None:
        if self._closed or self._task.done():
            raise StoreError("the session store is closed")

    async def _submit(self, fn: Callable[[Conn], Awaitable[Any]]) -> Any:
        self._check_open()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait(_Job(fn, fut))  # queued synchronously: one session's writes commit in order
        # The write happens even if the caller is cancelled meanwhile (as in the SQLite store).
        return await asyncio.shield(fut)

    async def _run(self) -> None:
        stop = False
        try:
            while not stop:
                first = await self._jobs.get()
                if first is None:
                    break
                batch, stop = take_batch(first, self._jobs.get_nowait, asyncio.QueueEmpty)
                await self._run_batch(batch)
        finally:
            self._closed = True
            while not self._jobs.empty():  # writes queued behind the close fail their callers
                job = self._jobs.get_nowait()
                if job is not None and not job.future.done():
                    job.future.set_exception(StoreError("the session store is closed"))

    async def _reconnect(self) -> None:
        """A lost writer connection (the server restarted, the network failed over) is opened again for
        the next batch; until it opens, each batch fails its callers and tries again."""
        import asyncpg

        try:
            self._writer = await asyncpg.connect(self._url, timeout=10.0)
            log.warning("session store: writer connection to %s reopened", self.path)
        except Exception as e:
            log.error("session store: cannot reopen %s: %s", self.path, e)

    async def _run_batch(self, batch: list[_Job]) -> None:
        db = self._writer
        if db.is_closed():
            await self._reconnect()
            db = self._writer
        results: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            async with db.transaction():
                for job in batch:
                    try:
                        async with db.transaction():  # a savepoint: one bad write fails only its caller
                            results.append((job, await job.fn(db), None))
                    except Exception as e:
                        results.append((job, None, e))
            self.commits += 1
            self.writes += len(batch)
        except Exception as e:  # the transaction failed (the connection, the server): every caller learns so
            log.exception("session store transaction failed")
            results = [(job, None, e) for job in batch]
            if db.is_closed():
                await self._reconnect()
        for job, value, err in results:
            if job.future.done():
                continue
            if err is not None:
                job.future.set_exception(err if isinstance(err, StoreError) else StoreError(str(err)))
            else:
                job.future.set_result(value)


__all__ = ["Owner", "PostgresStore", "is_postgres_url", "redact"]
