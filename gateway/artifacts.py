"""Images and audio the augmentations produce, served at /v1/artifacts/{id}.

Ids are unguessable (128 random bits): knowing the URL is the capability to read it, so an <img> or
<audio> tag can load it. The store is bounded in bytes; the oldest artifacts go first.

With a folder (the state folder's `artifacts/`, beside the session store) each artifact is a file,
`<folder>/<session id>/<artifact id>`, written before the event that names it is sent (a small write into
the page cache: it survives the process like the store's commits do). A restart keeps the files of the
sessions that are still live (`load`), within the bound, oldest dropped first, and removes the rest.
Without a folder they live in memory and end with the process.

With a shared store (several replicas over PostgreSQL: `shared`), every artifact is also written there,
committed before the event naming it is sent, and one this replica does not hold (made on another, or
before a takeover) is read from there (`fetch`); a session's artifacts leave it with the session.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from augmentations.base import Artifact

log = logging.getLogger("infercept.gateway")
EXT = {"image/png": "png", "audio/wav": "wav", "image/jpeg": "jpg"}
MIME = {ext: mime for mime, ext in EXT.items()}
NO_SESSION = "_"


@dataclass(frozen=True)
class Stored:
    mime: str
    size: int
    session_id: str | None
    created_s: float
    data: bytes | None = None  # in memory
    path: Path | None = None  # on disk

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.path is not None
        return self.path.read_bytes()


class SharedArtifacts(Protocol):
    """Where replicas keep the artifacts each of them reads (`store_pg.PostgresStore`)."""

    async def put_artifact(self, aid: str, sid: str, mime: str, data: bytes) -> None: ...

    async def get_artifact(self, aid: str) -> tuple[str, str, bytes] | None: ...

    async def delete_artifacts(self, sid: str) -> None: ...


class ArtifactStore:
    """The index lives on the event loop; every file write, read, scan and removal runs in a thread
    (`asyncio.to_thread`), so a slow disk never stalls the server."""

    def __init__(self, max_bytes: int, folder: Path | None = None, prefix: str = "/v1/artifacts/",
                 shared: SharedArtifacts | None = None) -> None:
        self.max_bytes, self.folder, self.prefix, self.shared = max_bytes, folder, prefix, shared
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    async def put(self, artifact: Artifact, session_id: str | None = None) -> str:
        """Store and return the artifact's URL path."""
        size = len(artifact.data)
        if size > self.max_bytes:
            raise ValueError(f"artifact of {size} bytes exceeds the store ({self.max_bytes})")
        aid = secrets.token_urlsafe(16) + "." + EXT.get(artifact.mime, "bin")
        if self.shared is not None:
            await self.shared.put_artifact(aid, session_id or NO_SESSION, artifact.mime, artifact.data)
        if self.folder is not None:
            path = self.folder / (session_id or NO_SESSION) / aid
            await asyncio.to_thread(_write, path, artifact.data)
            item = Stored(artifact.mime, size, session_id, time.time(), path=path)
        else:
            item = Stored(artifact.mime, size, session_id, time.time(), data=artifact.data)
        await self._unlink(self._add(aid, item))
        return self.prefix + aid

    def get(self, aid: str) -> Stored | None:
        return self._items.get(aid)

    async def fetch(self, aid: str) -> Stored | None:
        """This replica's copy, else the shared store's (not kept here: it stays the other replica's to
        bound)."""
        item = self._items.get(aid)
        if item is not None or self.shared is None:
            return item
        row = await self.shared.get_artifact(aid)
        if row is None:
            return None
        sid, mime, data = row
        return Stored(mime, len(data), None if sid == NO_SESSION else sid, time.time(), data=data)

    async def read(self, item: Stored) -> bytes:
        return item.data if item.data is not None else await asyncio.to_thread(item.read)

    async def load(self, live_sessions: Iterable[str]) -> int:
        """After a restart: index the files of live sessions (oldest first, within the bound) and remove
        the others. Returns how many were kept."""
        if self.folder is None:
            return 0
        found = await asyncio.to_thread(_scan, self.folder, set(live_sessions))
        evicted: list[Path] = []
        for mtime, size, sid, f in sorted(found):
            evicted += self._add(f.name, Stored(MIME.get(f.suffix.lstrip("."), "application/octet-stream"), size, sid, mtime, path=f))
        await self._unlink(evicted)
        return len(self._items)

    async def drop_session(self, session_id: str) -> int:
        """Remove the artifacts of a session that ended for good (DELETE, expiry): each artifact belongs
        to the one session whose tool made it. Returns how many were indexed."""
        gone = [aid for aid, item in self._items.items() if item.session_id == session_id]
        paths = [p for p in (self._remove(aid) for aid in gone) if p is not None]
        if self.folder is not None:
            await asyncio.to_thread(shutil.rmtree, self.folder / session_id, True)
        else:
            await self._unlink(paths)
        if self.shared is not None:
            await self.shared.delete_artifacts(session_id)
        return len(gone)

    def _add(self, aid: str, item: Stored) -> list[Path]:
        """Index an item; the files of the items evicted to stay within the bound (to unlink)."""
        self._items[aid] = item
        self._bytes += item.size
        evicted: list[Path] = []
        while self._bytes > self.max_bytes:
            path = self._remove(next(iter(self._items)))
            if path is not None:
                evicted.append(path)
        return evicted

    def _remove(self, aid: str) -> Path | None:
        item = self._items.pop(aid)
        self._bytes -= item.size
        return item.path

    @staticmethod
    async def _unlink(paths: list[Path]) -> None:
        if paths:
            await asyncio.to_thread(_unlink_all, paths)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)


def _unlink_all(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def _scan(folder: Path, live: set[str]) -> list[tuple[float, int, str, Path]]:
    """The files of live sessions' folders (mtime, size, session, path); every other entry removed."""
    found: list[tuple[float, int, str, Path]] = []
    for sub in folder.iterdir():
        if not sub.is_dir() or sub.name not in live:
            shutil.rmtree(sub, ignore_errors=True) if sub.is_dir() else sub.unlink(missing_ok=True)
            continue
        for f in sub.iterdir():
            st = f.stat()
            found.append((st.st_mtime, st.st_size, sub.name, f))
    return found
