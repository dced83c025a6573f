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

from gateway.store import SCHEMA_VERSION, StoredSession, StoreError, _dump, take_batch

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
"""

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
                await writer.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                await writer.execute(_SCHEMA)
                await writer.execute("INSERT INTO infercept_meta (key, value) VALUES ('schema_version', $1) "
                                     "ON CONFLICT (key) DO NOTHING", str(SCHEMA_VERSION))
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

    # ------------------------------------------------------------------ the interface
    async def put(self, sid: str, token_hash: str, head: Mapping[str, Any]) -> None:
        body = _dump(head)

        async def fn(db: Conn) -> None:
            await db.execute(
                "INSERT INTO infercept_sessions (id, token_hash, head, updated) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (id) DO UPDATE SET token_hash = excluded.token_hash, head = excluded.head, "
                "updated = excluded.updated", sid, token_hash, body, time.time())

        await self._submit(fn)

    async def append_event(self, sid: str, events: Sequence[Mapping[str, Any]], head: Mapping[str, Any] | None = None) -> None:
        rows = [(sid, _dump(e)) for e in events]
        body = _dump(head) if head is not None else None

        async def fn(db: Conn) -> None:
            if body is not None:
                status = await db.execute("UPDATE infercept_sessions SET head = $1, updated = $2 WHERE id = $3",
                                          body, time.time(), sid)
                if status.endswith(" 0"):
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

    async def list(self) -> list[str]:
        self._check_open()
        async with self._pool.acquire() as db:
            return [r["id"] for r in await db.fetch("SELECT id FROM infercept_sessions ORDER BY created")]

    async def delete(self, sid: str) -> None:
        async def fn(db: Conn) -> None:
            await db.execute("DELETE FROM infercept_events WHERE session_id = $1", sid)
            await db.execute("DELETE FROM infercept_sessions WHERE id = $1", sid)

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
                job.future.set_exception(StoreError(str(err)))
            else:
                job.future.set_result(value)


__all__ = ["PostgresStore", "is_postgres_url", "redact"]
