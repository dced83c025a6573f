"""The durable session store: one small interface, SQLite its embedded implementation (PostgreSQL, for
replicas that share it, in `gateway.store_pg`).

A session is a *head* (its settings, state, pending call, usage: small, rewritten at each commit) and
an append-only *log* of events (transcript entries, call-record updates, the context tokens the engine
appended, the model's text as it streamed). A restart folds the log back into a session
(`gateway.durable`).

SQLite runs in WAL mode on one writer thread of its own (never the event loop, never the loop's default
executor, which a hung tool can exhaust). The thread commits group-wise: every write queued while the
previous transaction ran goes into the next one, so thousands of streaming sessions cost a handful of
commits per scheduling round, not one each. `synchronous=NORMAL`: a commit survives the process
(`kill -9`); only an OS crash or power loss can take the last transactions back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

log = logging.getLogger("infercept.store")
MEMORY = ":memory:"
SCHEMA_VERSION = 1
MAX_BATCH = 1024  # writes per transaction at most (bounds the time one commit holds the thread)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL,
    head TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_session ON events (session_id, seq);
"""


@dataclass(frozen=True)
class StoredSession:
    id: str
    token_hash: str
    head: dict[str, Any]
    events: list[dict[str, Any]]  # the log, oldest first


class SessionStore(Protocol):
    """What the gateway needs from a store (`SqliteStore`; `store_pg.PostgresStore`, shared by replicas).
    Every write is committed when its await returns."""

    path: str  # where it is (a file, or a URL without its password)
    commits: int  # transactions committed
    writes: int  # writes they carried

    async def put(self, sid: str, token_hash: str, head: Mapping[str, Any]) -> None:
        """Create or replace a session's head (its log is kept)."""

    async def append_event(self, sid: str, events: Sequence[Mapping[str, Any]], head: Mapping[str, Any] | None = None) -> None:
        """Append to a session's log and, in the same transaction, replace its head."""

    async def get(self, sid: str) -> StoredSession | None: ...

    async def list(self, awake_only: bool = False) -> list[str]:
        """The ids of every stored session, oldest first (`awake_only`: not those that left memory while
        idle, which are read back one by one when asked for)."""

    async def hibernated_before(self, last_active: float) -> list[str]:
        """Hibernated sessions last active before `last_active` (a time.time()): the ones expiry removes."""

    async def delete(self, sid: str) -> None:
        """Remove a session: its head and its log."""

    async def close(self) -> None: ...


class StoreError(RuntimeError):
    pass


class Fenced(StoreError):
    """A write by a replica that no longer owns the session: another replica took it over (this one's
    lease lapsed: a pause, a partition). The write did not happen; this replica must stop serving it."""

    def __init__(self, sid: str) -> None:
        super().__init__(f"session {sid} is owned by another replica now: the write was refused")
        self.sid = sid


@dataclass
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


class SqliteStore:
    """`SessionStore` on SQLite. `path` is a file (its folder is created) or ":memory:" (nothing
    persists: the same code path, for tests and for `server.state_path: ":memory:"`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != MEMORY:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._open_error: BaseException | None = None
        self._closed = False  # the writer thread has stopped taking jobs
        self.commits = 0  # transactions committed (for the commit-cost figures)
        self.writes = 0  # writes they carried
        self._thread = threading.Thread(target=self._run, name="session-store", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._open_error is not None:
            raise StoreError(f"cannot open the session store {self.path}: {self._open_error}") from self._open_error

    @property
    def persistent(self) -> bool:
        return self.path != MEMORY

    # ------------------------------------------------------------------ the interface
    async def put(self, sid: str, token_hash: str, head: Mapping[str, Any]) -> None:
        body = _dump(head)

        def fn(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO sessions (id, token_hash, head, updated) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT (id) DO UPDATE SET token_hash = excluded.token_hash, head = excluded.head, "
                       "updated = excluded.updated", (sid, token_hash, body, time.time()))

        await self._submit(fn)

    async def append_event(self, sid: str, events: Sequence[Mapping[str, Any]], head: Mapping[str, Any] | None = None) -> None:
        # Encoded here, on the caller's thread: the writer thread only runs SQL (which releases the GIL).
        rows = [(sid, _dump(e)) for e in events]
        body = _dump(head) if head is not None else None

        def fn(db: sqlite3.Connection) -> None:
            if body is not None:
                cur = db.execute("UPDATE sessions SET head = ?, updated = ? WHERE id = ?", (body, time.time(), sid))
                if cur.rowcount == 0:
                    return  # deleted meanwhile: nothing to append to
            if rows:
                db.executemany("INSERT INTO events (session_id, body) VALUES (?, ?)", rows)

        await self._submit(fn)

    async def get(self, sid: str) -> StoredSession | None:
        def fn(db: sqlite3.Connection) -> StoredSession | None:
            row = db.execute("SELECT token_hash, head FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                return None
            events = [json.loads(b) for (b,) in db.execute("SELECT body FROM events WHERE session_id = ? ORDER BY seq", (sid,))]
            return StoredSession(sid, row[0], json.loads(row[1]), events)

        return await self._submit(fn)

    async def list(self, awake_only: bool = False) -> list[str]:
        where = " WHERE json_extract(head, '$.hibernated') IS NOT 1" if awake_only else ""
        return await self._submit(lambda db: [r[0] for r in db.execute(f"SELECT id FROM sessions{where} ORDER BY rowid")])

    async def hibernated_before(self, last_active: float) -> list[str]:
        return await self._submit(lambda db: [r[0] for r in db.execute(
            "SELECT id FROM sessions WHERE json_extract(head, '$.hibernated') = 1 "
            "AND json_extract(head, '$.last_active') < ? ORDER BY rowid", (last_active,))])

    async def delete(self, sid: str) -> None:
        def fn(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM events WHERE session_id = ?", (sid,))
            db.execute("DELETE FROM sessions WHERE id = ?", (sid,))

        await self._submit(fn)

    async def close(self) -> None:
        """Finish the queued writes, then close the database."""
        if self._thread.is_alive():
            self._jobs.put(None)
            await asyncio.to_thread(self._thread.join)

    # ------------------------------------------------------------------ the writer thread
    async def _submit(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        if self._closed or not self._thread.is_alive():
            raise StoreError("the session store is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        # Queued synchronously, so writes of one session commit in the order they were made.
        self._jobs.put(_Job(fn, loop, fut))
        if self._closed:  # the writer finished between the check and the put: it may not see this job
            self._drain_closed()
        return await fut

    def _drain_closed(self) -> None:
        """Fail every queued job: the writer thread takes no more."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                _notify(job, None, StoreError("the session store is closed"))

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA)
        db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        (version,) = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if int(version) != SCHEMA_VERSION:
            raise StoreError(f"schema version {version}, this server reads {SCHEMA_VERSION}")
        return db

    def _run(self) -> None:
        try:
            db = self._connect()
        except BaseException as e:
            self._open_error = e
            self._ready.set()
            return
        self._ready.set()
        stop = False
        try:
            while not stop:
                first = self._jobs.get()
                if first is None:
                    break
                batch, stop = take_batch(first, self._jobs.get_nowait, queue.Empty)
                self._run_batch(db, batch)
        finally:
            self._closed = True
            db.close()
            # Writes queued behind the close (or while the thread died) fail their callers instead of
            # leaving them awaiting forever; `_submit` drains again for one that raced this.
            self._drain_closed()

    def _run_batch(self, db: sqlite3.Connection, batch: list[_Job]) -> None:
        results: list[tuple[_Job, Any, BaseException | None]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for job in batch:
                # One bad write fails its own caller, not the others of the transaction.
                db.execute("SAVEPOINT job")
                try:
                    results.append((job, job.fn(db), None))
                    db.execute("RELEASE job")
                except Exception as e:
                    db.execute("ROLLBACK TO job")
                    db.execute("RELEASE job")
                    results.append((job, None, e))
            db.execute("COMMIT")
            self.commits += 1
            self.writes += len(batch)
        except Exception as e:  # the transaction failed: every caller in it learns so
            log.exception("session store transaction failed")
            if db.in_transaction:
                db.execute("ROLLBACK")
            results = [(job, None, e) for job in batch]
        for job, value, err in results:
            _notify(job, value, err)


J = TypeVar("J")


def take_batch(first: J, get_nowait: Callable[[], J | None], empty: type[Exception]) -> tuple[list[J], bool]:
    """A group commit's jobs: `first` and every job queued behind it (up to `MAX_BATCH`), and whether the
    close's sentinel (None) was met among them (the writer stops after this batch)."""
    batch = [first]
    while len(batch) < MAX_BATCH:
        try:
            job = get_nowait()
        except empty:
            break
        if job is None:
            return batch, True
        batch.append(job)
    return batch, False


def _notify(job: _Job, value: Any, err: BaseException | None) -> None:
    """Hand a result to the job's loop; a loop that is closed (its caller is gone) gets nothing, and
    the writer thread lives on for the others."""
    try:
        job.loop.call_soon_threadsafe(_settle, job.future, value, err)
    except RuntimeError:  # "Event loop is closed"
        log.debug("session store: the loop of a finished write is closed")


def _settle(fut: asyncio.Future[Any], value: Any, err: BaseException | None) -> None:
    if fut.done():  # its awaiter was cancelled; the write happened all the same
        return
    if err is not None:
        fut.set_exception(StoreError(str(err)))
    else:
        fut.set_result(value)


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


__all__ = ["MEMORY", "SessionStore", "SqliteStore", "StoreError", "StoredSession"]
