"""The gateway's open sessions: the table of live `AgentSession`s and its mirror in the session store.
(`gateway.agent` is one session; `engine_adapter.session` is its request on the engine.)

Every durable session is in the store from the moment it is created (before its id and token are
returned) until it is deleted or expires; in between, each session commits its own changes
(`AgentSession.commit`). After a restart, or after the engine was restarted, `restore_all` reads every
stored session back onto the (new) engine. Sessions of one OpenAI completion (`chatcmpl-…`) end with
their request and are never stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from engine_adapter.hints import ToolHint
from gateway.agent import AgentSession
from gateway.context import AgentContext
from gateway.durable import check_format, fold, token_matches
from gateway.http import ApiError
from gateway.store import Fenced, SessionStore, StoredSession, StoreError
from gateway.store_pg import PostgresStore

log = logging.getLogger("infercept.gateway")
RETRY_STORE_S = 2  # a failing store (a full disk, a locked file) may recover within seconds
RETRY_SESSIONS_S = 5  # every session in memory busy: one ends a turn within seconds
EPHEMERAL_PREFIX = "chatcmpl-"  # sessions of one OpenAI completion: not stored, not counted against max_sessions


class SessionTable:
    def __init__(self, store: SessionStore, on_removed: Callable[[str], Awaitable[object]] | None = None) -> None:
        self.store = store
        self.live: dict[str, AgentSession] = {}
        self.on_removed = on_removed  # called with the id of each session removed for good (its artifacts go)
        self.skipped = 0  # stored sessions the last restore_all could not read back
        self._background: set[asyncio.Future[None]] = set()
        # Sessions being read back (one restore each): the lock and how many requests use it.
        self._taking: dict[str, tuple[asyncio.Lock, int]] = {}
        self._leaving: set[str] = set()  # sessions on their way out of memory (`_hibernate`)

    @property
    def replica(self) -> PostgresStore | None:
        """The shared store this server joined as a replica (None: it owns every stored session)."""
        st = self.store
        return st if isinstance(st, PostgresStore) and st.replica_id is not None else None

    def __len__(self) -> int:
        return len(self.live)

    def durable_count(self) -> int:
        return sum(1 for sid in self.live if not sid.startswith(EPHEMERAL_PREFIX))

    def busy_count(self) -> int:
        """Turns in progress on the server: generating, or in a server tool."""
        return sum(1 for s in self.live.values() if s.busy)

    def states(self) -> list[str]:
        return [s.public_state() for s in self.live.values()]

    async def open(self, ctx: AgentContext, *, system: str | None, tools: list[str], client_tools: dict[str, dict[str, Any]],
                   max_tokens: int, temperature: float, seed: int | None, ephemeral: bool = False,
                   ignore_eos: bool = False) -> AgentSession:
        hints: dict[str, ToolHint] = ctx.registry.hints(tools)
        for name, spec in client_tools.items():
            hints[name] = ToolHint(str(spec.get("type") or "default"), spec.get("expected_s"))
        sid = (EPHEMERAL_PREFIX if ephemeral else "sess-") + secrets.token_hex(12)
        es = ctx.engine.open_session(session_id=sid, tools=hints, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                     ignore_eos=ignore_eos)
        s = AgentSession(ctx, es, system=system, tools=tools, client_tools=client_tools, max_tokens=max_tokens,
                         store=None if ephemeral else self.store)
        self.live[sid] = s
        s.on_fenced = self._forget
        if not ephemeral:
            # In the store before the client learns the id: a crash after this answer loses nothing.
            put = asyncio.ensure_future(self.store.put(sid, s.token_hash, s.head()))
            try:
                await asyncio.shield(put)  # a cancelled request cannot cut the write in half ...
            except BaseException as e:
                self.live.pop(sid, None)
                # ... and what it wrote is removed again: nobody got the id, so the row would be an orphan
                # that every restart reads back. Cancelled: the removal runs on without the request.
                undo = asyncio.ensure_future(self._undo_open(s, put))
                self._background.add(undo)
                undo.add_done_callback(self._background.discard)
                if not isinstance(e, asyncio.CancelledError):
                    await undo
                if isinstance(e, StoreError):
                    raise store_unavailable(e) from e
                raise
        return s

    async def _undo_open(self, s: AgentSession, put: asyncio.Future[None]) -> None:
        with contextlib.suppress(BaseException):
            await put  # the delete must follow the put
        try:
            await s.close()
        except Exception:
            log.exception("closing session %s after its creation failed", s.id)
        try:
            await self.store.delete(s.id)
        except Exception:
            log.exception("removing the stored row of session %s after its creation failed", s.id)

    def get(self, sid: str, token: str) -> AgentSession:
        """The session, if `token` is its token (hashes compared in constant time)."""
        s = self.live.get(sid)
        if s is None:
            raise ApiError(404, "not_found", f"no session {sid!r}")
        if not token_matches(token, s.token_hash):
            raise ApiError(403, "forbidden", "missing or wrong X-Session-Token for this session")
        return s

    def serving(self, sid: str) -> bool:
        """In memory and staying there (not on its way out)."""
        return sid in self.live and sid not in self._leaving

    def _forget(self, sid: str) -> None:
        """A session another replica took over: no longer served here; its row is the new owner's."""
        self.live.pop(sid, None)

    async def find(self, ctx: AgentContext, sid: str, token: str, max_live: int | None = None) -> AgentSession:
        """The session, read back from the store if it is not in memory: one that hibernated here, or
        (replicas) one whose owner's lease lapsed, which this replica claims first (its next turn rebuilds
        the KV: `restored_by: recompute`). A live owner elsewhere keeps its session: 503 with Retry-After
        (the balancer or the forwarding reaches it). `max_live`: sessions in memory at most; idle ones
        hibernate to make room (429 when none can)."""
        while sid in self._leaving:  # on its way out of memory: read it back once it is out
            await asyncio.sleep(0.005)
        if sid in self.live:
            return self.get(sid, token)
        if sid.startswith(EPHEMERAL_PREFIX):
            raise ApiError(404, "not_found", f"no session {sid!r}")
        replica = self.replica
        lock, users = self._taking.get(sid, (asyncio.Lock(), 0))
        self._taking[sid] = (lock, users + 1)  # dropped when its last user is done, not when it is free
        try:
            async with lock:
                if sid in self.live:
                    return self.get(sid, token)
                try:
                    stored = await self.store.get(sid)
                    if stored is None:
                        raise ApiError(404, "not_found", f"no session {sid!r}")
                    if not token_matches(token, stored.token_hash):
                        raise ApiError(403, "forbidden", "missing or wrong X-Session-Token for this session")
                    after = "hibernation"
                    if replica is not None:
                        owner = await replica.owner(sid)
                        if owner is not None and owner.replica_id != replica.replica_id:
                            after = "takeover"
                        if not await replica.claim(sid):
                            raise ApiError(503, "session_elsewhere", f"session {sid} is served by another replica; retry",
                                           retry_after=RETRY_STORE_S)
                    elif not stored.head.get("hibernated"):
                        after = "restart"  # stored, not hibernated, not in memory: its restore was skipped
                    if max_live is not None:
                        await self.make_room(max_live)
                    # Without replicas the row just read is current (this server is its only writer); a
                    # replica reads it again after its claim, which fenced the previous owner's writes.
                    if not await self._restore_one(ctx, sid, after, touch=True, stored=stored if replica is None else None):
                        raise ApiError(404, "not_found", f"session {sid!r} cannot be served by this server's model")
                except StoreError as e:
                    raise store_unavailable(e) from e
                if after == "takeover":
                    ctx.metrics.sessions_taken_over.inc()
                    assert replica is not None
                    log.info("session %s taken over by replica %s (epoch %d)", sid, replica.replica_id, replica.epoch)
                else:
                    ctx.metrics.sessions_rehydrated.inc()
                return self.get(sid, token)
        finally:
            lock, users = self._taking[sid]
            if users <= 1:
                del self._taking[sid]
            else:
                self._taking[sid] = (lock, users - 1)

    async def make_room(self, max_live: int) -> None:
        """Hibernate the least recently active idle sessions until fewer than `max_live` are in memory;
        429 when every one in memory is busy."""
        # Concurrent requests share the work: sessions already on their way out count as gone, and each
        # request sends out sessions no other one has picked.
        while self.durable_count() - len(self._leaving) >= max_live:
            idle = sorted((s for s in self.live.values() if not s.id.startswith(EPHEMERAL_PREFIX) and s.id not in self._leaving
                           and s.waiting_for_outside and not s.busy), key=lambda s: s.last_active_s)
            for s in idle:
                if await self._hibernate(s):
                    break
            else:
                raise ApiError(429, "too_many_sessions", f"the server holds its limit of {max_live} active sessions, "
                               "none of them idle; retry shortly", retry_after=RETRY_SESSIONS_S)

    async def hibernate_idle(self, idle_s: float) -> int:
        """Sessions waiting for the outside for `idle_s` leave memory; how many did."""
        now, n = time.monotonic(), 0
        for s in list(self.live.values()):
            if not s.id.startswith(EPHEMERAL_PREFIX) and s.waiting_for_outside and now - s.last_active_s > idle_s:
                n += await self._hibernate(s)
        return n

    async def _hibernate(self, s: AgentSession) -> bool:
        if s.id in self._leaving:
            return False
        self._leaving.add(s.id)
        try:
            if not await s.hibernate():
                return False
        finally:
            self._leaving.discard(s.id)
        self.live.pop(s.id, None)
        s.ctx.metrics.sessions_hibernated.inc()
        return True

    async def expire_hibernated(self, ctx: AgentContext, idle_s: float) -> int:
        """Hibernated sessions idle past `idle_s` are removed from the store (their tools' state and
        artifacts too), as live ones are by `expire_idle`."""
        n = 0
        for sid in await self.store.hibernated_before(time.time() - idle_s):
            if sid in self.live or sid in self._taking:  # back in memory, or on its way
                continue
            try:
                replica = self.replica
                if replica is not None and not await replica.claim(sid):
                    continue
                await self._remove(sid)
                for name in ctx.registry.names():
                    end = getattr(ctx.registry.get(name), "end_session", None)
                    if end is not None:
                        await end(sid)
                n += 1
            except Exception:
                log.exception("expiring hibernated session %s failed; the next round tries again", sid)
        return n

    async def close(self, sid: str) -> None:
        """End a session and remove it from the store (and its artifacts). The removal happens whatever
        ending the live session did: if that raised, or the request was cancelled, a session left in the
        store would come back at the next restart."""
        s = self.live.pop(sid, None)
        try:
            if s is not None:
                await s.close()
        except Exception:
            log.exception("ending session %s failed; removing it all the same", sid)
        finally:
            if not sid.startswith(EPHEMERAL_PREFIX):
                await asyncio.shield(self._remove(sid))

    async def _remove(self, sid: str) -> None:
        fenced = False
        try:
            await self.store.delete(sid)
        except Fenced:
            fenced = True  # another replica owns the session now: its artifacts are not this replica's
            raise
        except StoreError as e:
            raise store_unavailable(e) from e
        finally:
            if self.on_removed is not None and not fenced:
                try:
                    await self.on_removed(sid)
                except Exception:
                    log.exception("removing what session %s left behind (its artifacts) failed", sid)

    async def expire_idle(self, idle_s: float) -> int:
        now, n = time.monotonic(), 0
        for s in list(self.live.values()):
            if s.waiting_for_outside and now - s.last_active_s > idle_s:
                try:
                    await self.close(s.id)
                except Exception:  # its row stays (the store failed): the next start or round tries again
                    log.exception("expiring session %s failed", s.id)
                n += 1
        return n

    async def detach_all(self, kind: str, message: str) -> None:
        """Stop serving every session without ending any (shutdown, engine death): turns in progress are
        marked interrupted and committed, readers get an `error` event; ephemeral sessions just close."""
        for s in list(self.live.values()):
            if s.id.startswith(EPHEMERAL_PREFIX):
                await s.close()
                continue
            try:
                await s.detach(kind, message)
            except Fenced:  # another replica owns it now: nothing of it is this replica's to write
                log.warning("session %s was taken over by another replica: detached without a write", s.id)
        self.live.clear()

    async def restore_all(self, ctx: AgentContext) -> int:
        """Read every stored session back, each on a new engine session over its exact context tokens. A
        session that cannot be read back (a malformed row) is logged, left stored and skipped
        (`self.skipped`): one bad row must not keep the server from serving the others."""
        restored, self.skipped = 0, 0
        replica = self.replica
        # A replica reads back the sessions it owned (in any earlier incarnation); the others' are theirs,
        # or are taken over one by one when a request for one arrives (`find`).
        for sid in await (replica.owned(awake_only=True) if replica is not None else self.store.list(awake_only=True)):
            if sid in self.live:
                continue
            try:
                if replica is not None and not await replica.claim(sid):
                    continue  # taken over by another replica while this one was away
                restored += await self._restore_one(ctx, sid)
            except StoreError:
                raise  # the store itself is failing: not one row's fault
            except Exception:
                self.skipped += 1
                log.exception("session %s could not be read back from the store: skipped (left stored)", sid)
        return restored

    async def _restore_one(self, ctx: AgentContext, sid: str, after: str = "restart", touch: bool = False,
                           stored: StoredSession | None = None) -> int:
        """Read `sid` back into memory (`stored`: its row, if the caller holds a current one)."""
        stored = stored or await self.store.get(sid)
        if stored is None:
            return 0
        check_format(stored.head)
        folded = fold(stored.head, stored.events)
        model = folded.head.get("model")
        if model != ctx.engine.model_path:
            # Token ids mean nothing to another tokenizer: leave it stored for a server with its model.
            log.warning("session %s was made with model %s, not %s: not restored", sid, model, ctx.engine.model_path)
            return 0
        settings = folded.head["settings"]
        hints: dict[str, ToolHint] = ctx.registry.hints([t for t in settings["tools"] if t in ctx.registry])
        for name, spec in settings["client_tools"].items():
            hints[name] = ToolHint(str(spec.get("type") or "default"), spec.get("expected_s"))
        es = ctx.engine.open_session(session_id=sid, tools=hints, max_tokens=int(settings["max_tokens"]),
                                     temperature=float(settings["temperature"]), seed=settings["seed"],
                                     ignore_eos=bool(settings.get("ignore_eos", False)), history=folded.context)
        try:
            s = AgentSession.restored(ctx, es, folded, stored.token_hash, self.store, after)
        except BaseException:
            await es.close()  # the engine session opened for it is not left behind
            raise
        if touch:
            s.touch()  # read back for a request: in use now, not the first to leave memory again
        self.live[sid] = s
        s.on_fenced = self._forget
        with contextlib.suppress(Exception):
            await s.commit()  # the interrupted marks, if any
        return 1


def store_unavailable(e: StoreError) -> ApiError:
    return ApiError(503, "store_unavailable", f"the session store failed ({e}); retry shortly", retry_after=RETRY_STORE_S)
