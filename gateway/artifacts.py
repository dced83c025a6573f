"""Images and audio the augmentations produce, kept in memory and served at /v1/artifacts/{id}.

Ids are unguessable (128 random bits): knowing the URL is the capability to read it, so an <img> or
<audio> tag can load it. The store is bounded in bytes; the oldest artifacts go first.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from augmentations.base import Artifact

EXT = {"image/png": "png", "audio/wav": "wav", "image/jpeg": "jpg"}


@dataclass(frozen=True)
class Stored:
    artifact: Artifact
    session_id: str | None
    created_s: float


class ArtifactStore:
    def __init__(self, max_bytes: int, prefix: str = "/v1/artifacts/") -> None:
        self.max_bytes, self.prefix = max_bytes, prefix
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0

    def put(self, artifact: Artifact, session_id: str | None = None) -> str:
        """Store and return the artifact's URL path."""
        if len(artifact.data) > self.max_bytes:
            raise ValueError(f"artifact of {len(artifact.data)} bytes exceeds the store ({self.max_bytes})")
        aid = secrets.token_urlsafe(16) + "." + EXT.get(artifact.mime, "bin")
        self._items[aid] = Stored(artifact, session_id, time.time())
        self._bytes += len(artifact.data)
        while self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= len(old.artifact.data)
        return self.prefix + aid

    def get(self, aid: str) -> Stored | None:
        return self._items.get(aid)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes
