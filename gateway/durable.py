"""How an agent session is kept in the store and read back.

Each session writes a *head* (settings, state, pending call, usage: `AgentSession.head()`) and appends
log rows as it changes:

    {"k": "msg", ...}    a transcript entry (user message, model segment, tool observation, answer)
    {"k": "call", ...}   a call record, whole, each time it changes (the last one per call_id wins)
    {"k": "text", "text"} what the model wrote, as it streamed (runs merged)
    {"k": "ids", "ids"}  context token ids the engine session appended (prompt, observations, samples)

`Journal` collects them between commits; a commit writes them with the head in one transaction, and the
session commits before a batch of its events reaches the client (`AgentSession.events`). `fold` turns
the head and the log back into what a restart needs: the same transcript, the same call records and
exactly the same context tokens (not a re-tokenization of the text).

The format is versioned: every head carries `"v": FORMAT_VERSION`, and a restore reads only the versions
in `READABLE` (`check_format`; anything else is refused with an error naming the version found and the
ones this server reads, and the row is left stored). A call row is a `gateway.records.CallRecord` dump,
validated when it is read back (a field the record does not have is an error, not silently dropped).
Change a row's or the head's shape and you bump FORMAT_VERSION and add a migration here; the database
that tests/gateway/test_stored_format.py restores was written by format 1 and must keep restoring.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.session import Session
from gateway.store import SessionStore

log = logging.getLogger("infercept.gateway")
FORMAT_VERSION = 1  # the head's "v"
READABLE = (1,)  # the stored formats a restore reads


class StoredFormatError(ValueError):
    """A stored session in a format this server does not read."""


def check_format(head: Mapping[str, Any]) -> None:
    """Raise `StoredFormatError` unless `head` is in a format this server reads."""
    found = head.get("v")
    if found not in READABLE:
        readable = ", ".join(str(v) for v in READABLE)
        raise StoredFormatError(f"session {head.get('id')!r} is stored in format {found!r}; this server reads "
                                f"format {readable} (a newer server wrote it, or the row is damaged): left stored")


def hash_token(token: str) -> str:
    """What the store keeps of a session token (the token itself is shown once, at creation)."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, token_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), token_hash)


class Journal:
    """A session's changes since its last commit, and the commit (no store: ephemeral sessions)."""

    def __init__(self, store: SessionStore | None, sid: str, committed_context: int = 0) -> None:
        self.store, self.sid = store, sid
        self._rows: list[dict[str, Any]] = []
        self._context = committed_context  # context tokens already in the store

    def entry(self, entry: Mapping[str, Any]) -> None:
        self._rows.append({"k": "msg", **entry})

    def call(self, record: Mapping[str, Any]) -> None:
        self._rows.append({"k": "call", **record})

    def text(self, text: str) -> None:
        if not text or self.store is None:
            return
        if self._rows and self._rows[-1]["k"] == "text":
            self._rows[-1] = {"k": "text", "text": self._rows[-1]["text"] + text}
        else:
            self._rows.append({"k": "text", "text": text})

    async def commit(self, head: Mapping[str, Any], context: Session) -> None:
        """Write what changed, with `head`, in one transaction. Rows are taken synchronously, so two
        commits of one session reach the store in the order they were made."""
        if self.store is None:
            self._rows.clear()
            return
        rows, self._rows = self._rows, []
        start = self._context
        ids = context.context_since(start)
        if ids:
            rows.append({"k": "ids", "ids": ids})
            self._context += len(ids)
        try:
            await self.store.append_event(self.sid, rows, head)
        except Exception:
            # Not written: keep the rows for the next commit (the events they report are not delivered).
            self._rows[:0] = [r for r in rows if r["k"] != "ids"]
            self._context = start
            raise


@dataclass
class Folded:
    """A stored session read back (`fold`)."""

    head: dict[str, Any]
    transcript: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)  # the last version of each, in call order
    context: list[int] = field(default_factory=list)
    unreported_text: str = ""  # what the model wrote after the last transcript entry (an interrupted turn)


def fold(head: Mapping[str, Any], events: list[dict[str, Any]]) -> Folded:
    out = Folded(dict(head))
    calls: dict[str, dict[str, Any]] = {}
    tail: list[str] = []
    for row in events:
        kind = row.get("k")
        body = {k: v for k, v in row.items() if k != "k"}
        if kind == "msg":
            out.transcript.append(body)
            tail.clear()
        elif kind == "call":
            calls[body["call_id"]] = body  # dicts keep first-insertion order
        elif kind == "text":
            tail.append(body["text"])
        elif kind == "ids":
            out.context.extend(body["ids"])
        else:
            log.warning("session %s: unknown log row %r skipped", head.get("id"), kind)
    out.calls = list(calls.values())
    out.unreported_text = "".join(tail)
    return out


__all__ = ["FORMAT_VERSION", "READABLE", "Folded", "Journal", "StoredFormatError", "check_format", "fold", "hash_token",
           "token_matches"]
