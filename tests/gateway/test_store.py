"""The session store on its own (no engine): the interface, group commits, durability across a real
`kill -9`, the log folded back, token hashes, and artifacts kept on disk across a restart."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from augmentations.base import Artifact
from gateway.artifacts import ArtifactStore
from gateway.durable import fold, hash_token, token_matches
from gateway.store import MEMORY, SessionStore, SqliteStore, StoreError, _Job
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


async def check_round_trip(store: SessionStore) -> None:
    """The interface's promise, for every store (tests/gateway/test_store_pg.py runs it on PostgreSQL)."""
    await store.put("a", "h1", {"state": "idle", "n": 1})
    await store.put("b", "h2", {"state": "idle"})
    await store.append_event("a", [{"k": "msg", "role": "user", "content": "hi"}], {"state": "generating", "n": 2})
    await store.append_event("a", [{"k": "ids", "ids": [1, 2, 3]}, {"k": "text", "text": "é"}])
    got = await store.get("a")
    assert got is not None and got.token_hash == "h1" and got.head == {"state": "generating", "n": 2}
    assert got.events == [{"k": "msg", "role": "user", "content": "hi"}, {"k": "ids", "ids": [1, 2, 3]}, {"k": "text", "text": "é"}]
    assert await store.list() == ["a", "b"]
    await store.put("a", "h1", {"state": "idle"})  # the head is replaced, the log kept, its place in the list too
    assert (await store.get("a")).events == got.events  # type: ignore[union-attr]
    assert await store.list() == ["a", "b"]
    await store.delete("a")
    assert await store.get("a") is None and await store.list() == ["b"]
    # A late commit of a deleted session (its reader was still flushing) adds nothing.
    await store.append_event("a", [{"k": "msg"}], {"state": "idle"})
    assert await store.get("a") is None
    # Sessions that left memory while idle: not among the awake ones; listed for expiry by last activity.
    await store.put("c", "h3", {"state": "idle", "hibernated": True, "last_active": 100.0})
    await store.put("d", "h4", {"state": "idle", "hibernated": True, "last_active": 200.0})
    await store.put("e", "h5", {"state": "idle", "hibernated": False, "last_active": 50.0})
    assert await store.list() == ["b", "c", "d", "e"] and await store.list(awake_only=True) == ["b", "e"]
    assert await store.hibernated_before(150.0) == ["c"] and await store.hibernated_before(300.0) == ["c", "d"]


async def test_put_get_list_delete_and_append(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state" / "sessions.db")
    try:
        await check_round_trip(store)
        db = sqlite3.connect(store.path)
        assert db.execute("SELECT COUNT(*) FROM events WHERE session_id = 'a'").fetchone() == (0,)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        db.close()
    finally:
        await store.close()


async def blocked_writer(store: SqliteStore, gate: threading.Event) -> asyncio.Future[object]:
    """A job that holds the writer thread inside its transaction until `gate` is set; returned once the
    thread runs it (nothing else is queued then)."""
    running = threading.Event()

    def hold(db: sqlite3.Connection) -> bool:
        running.set()
        return gate.wait(10)

    blocker = asyncio.ensure_future(store._submit(hold))
    assert await asyncio.to_thread(running.wait, 10), "the writer thread never ran the blocking job"
    assert store._jobs.qsize() == 0
    return blocker


def queue_writes(store: SessionStore, n: int = 100) -> list[asyncio.Future[None]]:
    """`n` writes to session "s", each appending one event and replacing the head."""
    return [asyncio.ensure_future(store.append_event("s", [{"k": "text", "text": str(i)}], {"i": i})) for i in range(n)]


async def check_one_commit_for_the_queue(store: SessionStore, blocker: asyncio.Future[object],
                                         writes: list[asyncio.Future[None]], release: Callable[[], None]) -> None:
    """The group commit, for every store (tests/gateway/test_store_pg.py runs it on PostgreSQL): `writes`,
    queued while `blocker` held the writer in its transaction, commit together in the next one, in order."""
    before = store.commits
    release()
    await asyncio.gather(blocker, *writes)
    assert store.commits - before == 2  # the blocked one, then all of the queue in one transaction
    got = await store.get("s")
    assert got is not None and got.head == {"i": len(writes) - 1}
    assert [e["text"] for e in got.events] == [str(i) for i in range(len(writes))]


async def test_writes_queued_during_a_transaction_share_the_next_one() -> None:
    store = SqliteStore(MEMORY)
    try:
        await store.put("s", "h", {})
        gate = threading.Event()
        blocker = await blocked_writer(store, gate)
        writes = queue_writes(store)
        await wait_until(lambda: store._jobs.qsize() == 100, 10, "100 writes queued behind the blocked transaction")
        await check_one_commit_for_the_queue(store, blocker, writes, gate.set)
    finally:
        await store.close()


async def test_writes_queued_after_close_fail_instead_of_hanging() -> None:
    store = SqliteStore(MEMORY)
    gate = threading.Event()
    blocker = await blocked_writer(store, gate)
    closing = asyncio.ensure_future(store.close())
    await wait_until(lambda: store._jobs.qsize() == 1, 10, "the close's sentinel queued behind the blocked transaction")
    late = asyncio.ensure_future(store.put("s", "h", {}))
    await wait_until(lambda: store._jobs.qsize() == 2, 10, "a write queued behind the close")
    gate.set()
    await asyncio.wait_for(closing, 5)
    assert await blocker is True
    with pytest.raises(StoreError):
        await asyncio.wait_for(late, 5)  # settled, not awaited forever
    with pytest.raises(StoreError):
        await store.put("s", "h", {})


def test_a_write_whose_loop_closed_does_not_kill_the_writer() -> None:
    store = SqliteStore(MEMORY)
    gone = asyncio.new_event_loop()
    fut = gone.create_future()
    gone.close()  # its caller went away with its loop before the write was done
    store._jobs.put(_Job(lambda db: None, gone, fut))

    async def later() -> list[str]:
        await store.put("s", "h", {})
        return await store.list()

    assert asyncio.run(later()) == ["s"]
    assert store._thread.is_alive()
    asyncio.run(store.close())


WRITER = """
import asyncio, sys
from gateway.store import SqliteStore

async def main():
    store = SqliteStore(sys.argv[1])
    await store.put("s", "h", {"n": 0})
    for i in range(1, 100000):
        await store.append_event("s", [{"k": "text", "text": str(i)}], {"n": i})
        print(i, flush=True)  # only after the commit returned

asyncio.run(main())
"""


def test_a_commit_survives_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen = int(line)
        if seen >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    async def read() -> tuple[dict, list]:
        store = SqliteStore(db)
        got = await store.get("s")
        await store.close()
        assert got is not None
        return got.head, got.events

    head, events = asyncio.run(read())
    assert head["n"] >= seen  # every commit acknowledged before the kill is there
    assert [int(e["text"]) for e in events] == list(range(1, head["n"] + 1))  # and nothing half-written


def test_fold_rebuilds_transcript_calls_context_and_the_unfinished_turn() -> None:
    head = {"id": "s", "state": "generating"}
    rows = [
        {"k": "ids", "ids": [1, 2]},
        {"k": "msg", "role": "user", "content": "q"},
        {"k": "text", "text": "Thought: x"},
        {"k": "msg", "role": "assistant", "content": "Thought: x", "call_id": "c1"},
        {"k": "call", "call_id": "c1", "tool": "T", "result": None},
        {"k": "ids", "ids": [3]},
        {"k": "call", "call_id": "c1", "tool": "T", "result": "42"},
        {"k": "msg", "role": "tool", "call_id": "c1", "content": "42"},
        {"k": "text", "text": "Ans"},
        {"k": "text", "text": "wer"},
        {"k": "ids", "ids": [4, 5]},
    ]
    f = fold(head, rows)
    assert [m["role"] for m in f.transcript] == ["user", "assistant", "tool"]
    assert f.calls == [{"call_id": "c1", "tool": "T", "result": "42"}]
    assert f.context == [1, 2, 3, 4, 5]
    assert f.unreported_text == "Answer"


def test_tokens_are_stored_as_hashes() -> None:
    h = hash_token("secret-token")
    assert h != "secret-token" and len(h) == 64
    assert token_matches("secret-token", h) and not token_matches("secret-tokeN", h) and not token_matches("", h)


async def test_artifacts_of_live_sessions_survive_a_restart_within_the_bound(tmp_path: Path) -> None:
    folder = tmp_path / "artifacts"
    store = ArtifactStore(250, folder)
    a = await store.put(Artifact("image", "image/png", b"a" * 100), "sess-live")
    b = await store.put(Artifact("audio", "audio/wav", b"b" * 100), "sess-gone")
    c = await store.put(Artifact("image", "image/png", b"c" * 100), "sess-live")  # over the bound: the oldest (a) goes
    aid = lambda url: url.rsplit("/", 1)[1]  # noqa: E731
    assert store.get(aid(a)) is None and not (folder / "sess-live" / aid(a)).exists()
    assert store.bytes == 200

    again = ArtifactStore(250, folder)  # a restart: sess-gone is not live any more
    assert await again.load(["sess-live"]) == 1
    item = again.get(aid(c))
    assert item is not None and await again.read(item) == b"c" * 100 and item.mime == "image/png" and item.session_id == "sess-live"
    assert again.get(aid(b)) is None and not (folder / "sess-gone").exists()


@pytest.mark.parametrize("on_disk", [True, False])
async def test_a_deleted_sessions_artifacts_are_removed(tmp_path: Path, on_disk: bool) -> None:
    folder = tmp_path / "artifacts" if on_disk else None
    store = ArtifactStore(10_000, folder)
    aid = lambda url: url.rsplit("/", 1)[1]
    mine = [aid(await store.put(Artifact("image", "image/png", b"m" * 10), "sess-a")) for _ in range(3)]
    other = aid(await store.put(Artifact("image", "image/png", b"o" * 10), "sess-b"))
    assert await store.drop_session("sess-a") == 3
    assert all(store.get(m) is None for m in mine) and store.bytes == 10 and len(store) == 1
    item = store.get(other)
    assert item is not None and await store.read(item) == b"o" * 10  # another session's are kept
    if folder is not None:
        assert not (folder / "sess-a").exists() and (folder / "sess-b" / other).exists()


async def test_artifact_file_io_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.artifacts as artifacts_mod

    loop_thread, seen = threading.get_ident(), []

    def spy(fn):  # type: ignore[no-untyped-def]
        def wrapped(*a, **kw):  # type: ignore[no-untyped-def]
            seen.append((fn.__name__, threading.get_ident() != loop_thread))
            return fn(*a, **kw)
        return wrapped

    for name in ("_write", "_unlink_all", "_scan"):
        monkeypatch.setattr(artifacts_mod, name, spy(getattr(artifacts_mod, name)))
    monkeypatch.setattr(artifacts_mod.Stored, "read", spy(artifacts_mod.Stored.read))
    store = ArtifactStore(150, tmp_path / "artifacts")
    await store.put(Artifact("image", "image/png", b"a" * 100), "sess-a")
    url = await store.put(Artifact("image", "image/png", b"b" * 100), "sess-a")  # evicts the first: an unlink
    item = store.get(url.rsplit("/", 1)[1])
    assert item is not None and await store.read(item) == b"b" * 100
    await ArtifactStore(150, tmp_path / "artifacts").load(["sess-a"])
    assert {name for name, _ in seen} == {"_write", "_unlink_all", "read", "_scan"}
    assert all(off for _, off in seen), seen


def test_the_store_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    db.commit()
    db.close()
    with pytest.raises(RuntimeError, match="schema version 99"):
        SqliteStore(path)
