"""What the routes share: the engine, the tool registry, the sessions (live and stored), metrics and
artifacts, and their lifecycle; the app key it lives under (`GATEWAY_KEY`) and its accessor (`gw_of`),
which every route module imports from here. The app factory (`gateway.app.create_app`) runs the
lifecycle from aiohttp's `cleanup_ctx`:

* open: the tool registry is built, the state folder locked, the session store opened (`open`); a
  constructed `Gateway` holds nothing yet, so building one (or an app) never touches the disk;
* start: the engine starts in the background (health answers 503 "starting"), then the stored sessions
  are read back onto it and the gateway says ready;
* engine death: a watchdog sees vLLM's engine core gone, health answers 503 "restarting" with the
  reason, open streams end with an `error` event, and a new engine starts and the sessions are read
  back from the store (`server.restart_engine`);
* pressure: beyond `server.max_sessions` 429, beyond `server.max_queued_turns` turns in progress 503,
  while draining 503, each with `Retry-After`;
* drain and shutdown: new work refused, running turns given `server.drain_s`, everything committed,
  and what `open` opened closed again (`close`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

from augmentations.factory import build_registry
from augmentations.registry import Registry
from engine_adapter.config import EngineConfig
from engine_adapter.engine import InterceptEngine
from engine_adapter.events import TurnEnd
from gateway.agent import AgentSession
from gateway.artifacts import ArtifactStore
from gateway.call_parser import CallParser
from gateway.config import GatewayConfig
from gateway.context import AgentContext
from gateway.http import ApiError
from gateway.metrics import GatewayMetrics
from gateway.lb_agent import LoadAgent
from gateway.procs import StateLock, reap_orphans, record_engine
from gateway.replicas import Forwarder
from gateway.prompts import PromptBuilder
from gateway.schemas import Health, HealthStatus
from gateway.session_table import EPHEMERAL_PREFIX, SessionTable
from gateway.store import MEMORY, SessionStore, SqliteStore
from gateway.store_pg import PostgresStore

log = logging.getLogger("infercept.gateway")
RETRY_OVERLOADED_S = 1  # a turn slot frees within seconds
RETRY_NOT_READY_S = 5  # the engine is starting or restarting
WATCH_S = 0.5  # how often the watchdog looks at the engine

__all__ = ["EPHEMERAL_PREFIX", "GATEWAY_KEY", "Gateway", "gw_of"]


class NotOpen(RuntimeError):
    def __init__(self, what: str) -> None:
        super().__init__(f"the gateway's {what} is opened with its app (Gateway.open, from the app's cleanup_ctx)")


class Gateway:
    def __init__(self, engine_config: EngineConfig, config: GatewayConfig, registry: Registry | None = None,
                 timeouts: dict[str, float | None] | None = None) -> None:
        self.engine_config = engine_config
        self.config = config
        self._registry = registry  # None: built from config.augmentations by `open`
        self.timeouts = timeouts or {}
        self.engine = InterceptEngine(engine_config)
        self.metrics = GatewayMetrics()
        path = str(config.server.resolved_state_path())
        self.state_dir = Path(path).parent if path != MEMORY else None
        self._store: SessionStore | None = None
        self._lock: StateLock | None = None
        self._artifacts: ArtifactStore | None = None
        self._table: SessionTable | None = None
        self.forwarder = Forwarder()  # a replica's requests for sessions other replicas own
        self.ctx: AgentContext | None = None  # once the engine is ready
        self.ready = asyncio.Event()
        self.start_error: BaseException | None = None
        self.down_reason: str | None = None  # why the engine is restarting
        self.draining = False
        self.restored = 0  # sessions read back from the store at the last (re)start
        self._artifacts_loaded = False

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            raise NotOpen("tool registry")
        return self._registry

    @property
    def store(self) -> SessionStore:
        if self._store is None:
            raise NotOpen("session store")
        return self._store

    @property
    def artifacts(self) -> ArtifactStore:
        if self._artifacts is None:
            raise NotOpen("artifact store")
        return self._artifacts

    @property
    def table(self) -> SessionTable:
        if self._table is None:
            raise NotOpen("session table")
        return self._table

    @property
    def table_if_open(self) -> SessionTable | None:
        return self._table

    @property
    def sessions(self) -> dict[str, AgentSession]:
        return self.table.live

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        """Build the tool registry, lock the state folder, open the session store and the artifacts. A
        failure (the folder in use by another server, a store that cannot open) raises, and what was
        opened before it is closed again."""
        try:
            if self._registry is None:
                self._registry, self.timeouts = build_registry(self.config.augmentations)
            if self.state_dir is not None:
                self._lock = StateLock(self.state_dir)
            url = self.config.server.store
            self._store = (await PostgresStore.open(url) if url is not None
                           else await asyncio.to_thread(SqliteStore, self.config.server.resolved_state_path()))
            self._artifacts = ArtifactStore(self.config.server.artifact_store_mb * 2**20,
                                            self.state_dir / "artifacts" if self.state_dir is not None else None,
                                            # Replicas read each other's artifacts from the shared store.
                                            shared=self._store if isinstance(self._store, PostgresStore) else None)
            self._table = SessionTable(self._store, on_removed=self._artifacts.drop_session)
            server = self.config.server
            if server.replica_id is not None:
                assert isinstance(self._store, PostgresStore)  # server_config refuses a replica without one
                url = server.advertise_url or f"http://{server.host}:{server.port}"
                epoch = await self._store.join(server.replica_id, url, server.lease_s)
                log.info("replica %s joined the shared store at %s as epoch %d (lease %.1f s, advertised at %s)",
                         server.replica_id, self._store.path, epoch, server.lease_s, url)
        except BaseException:
            await self._release()
            raise

    async def _release(self) -> None:
        """Close what `open` opened (each part once, whatever failed before it)."""
        registry, self._registry = self._registry, None
        store, self._store = self._store, None
        lock, self._lock = self._lock, None
        try:
            if registry is not None:
                await registry.close()
        finally:
            try:
                if store is not None:
                    await store.close()
            finally:
                if self.state_dir is not None:
                    (self.state_dir / "engine.json").unlink(missing_ok=True)
                if lock is not None:
                    lock.release()

    async def start_engine(self) -> None:
        """Start the engine, do one real round trip, read the stored sessions back, then say ready. A
        failure is kept in `start_error` (health checks report it), not raised: the server stays up to
        say so."""
        try:
            t0 = time.perf_counter()
            if self.state_dir is not None:
                await asyncio.to_thread(reap_orphans, self.state_dir)
            await self.engine.start()
            if self.state_dir is not None:
                await asyncio.to_thread(record_engine, self.state_dir)
            self.ctx = AgentContext(
                engine=self.engine, registry=self.registry, limits=self.config.server, metrics=self.metrics,
                prompts=PromptBuilder(self.engine.tokenizer), artifacts=self.artifacts,
                calls=CallParser(self.engine.tokenizer), timeouts=self.timeouts, result_limit=self.config.result_limit,
            )
            s = self.engine.open_session(max_tokens=2)
            async for ev in s.turn("Hello"):
                if isinstance(ev, TurnEnd):
                    pass
            await s.close()
            self.restored = await self.table.restore_all(self.ctx)
            if not self._artifacts_loaded:  # files of sessions that are gone are removed once, at start
                # Hibernated sessions keep theirs: every stored session's files stay.
                await self.artifacts.load(await self.store.list())
                self._artifacts_loaded = True
            self.down_reason = None
            self.ready.set()
            stats = await self.engine.stats()
            log.info("engine ready in %.1f s: model=%s policy=%s kv_blocks=%d block_size=%d tools=%s sessions_restored=%d sessions_skipped=%d",
                     time.perf_counter() - t0, self.engine.model_path, stats.policy, stats.blocks.total,
                     stats.block_size, ",".join(self.registry.names()), self.restored, self.table.skipped)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.start_error = e
            log.exception("engine failed to start")

    async def watch_engine(self) -> None:
        """Restart the engine when its core process dies (vLLM's own monitor marks it dead)."""
        reason: str | None = None  # a restart to (re)try
        failures = 0
        while True:
            await asyncio.sleep(WATCH_S if not failures else min(30.0, WATCH_S * 2 ** failures))
            try:
                if reason is None and self.ready.is_set() and self.engine.dead:
                    reason = self.engine.dead_reason()
                if reason is not None:
                    await self.restart_engine(reason)
                    reason, failures = None, 0
            except asyncio.CancelledError:
                raise
            except Exception:  # one failed restart must not end the watch: it is tried again, backing off
                failures += 1
                log.exception("engine watchdog: restarting the engine failed (attempt %d); trying again", failures)

    async def restart_engine(self, reason: str) -> None:
        self.ready.clear()
        self.down_reason = f"the engine died ({reason})"
        self.metrics.engine_restarts.inc()
        log.error("%s; restarting it", self.down_reason)
        await self.table.detach_all("engine_died", f"{self.down_reason}; the server is restarting it and keeps "
                                    "the session: resend the message when /healthz says ok")
        try:
            await self.engine.shutdown()
        except Exception:  # a dead engine may fail its own shutdown; the new one starts all the same
            log.exception("shutting the dead engine down failed")
        if not self.config.server.restart_engine:
            self.start_error = RuntimeError(f"{self.down_reason}; server.restart_engine is off")
            return
        self.engine = InterceptEngine(self.engine_config)
        await self.start_engine()

    def load_agent(self) -> LoadAgent:
        """What the balancer's agent reports (gateway/lb_agent.py): whether this server drains, its KV
        cache's free share (asked of the engine while it is up) and its sessions in memory."""

        async def blocks() -> tuple[int, int] | None:
            if not self.ready.is_set() or self.engine.dead:
                return None
            b = (await self.engine.stats()).blocks
            return b.free, b.total

        return LoadAgent(lambda: self.draining, blocks, lambda: self.table.durable_count(), self.config.server.max_sessions)

    async def drain(self, timeout_s: float) -> int:
        """Refuse new work, let running turns finish for up to `timeout_s`; the turns still running."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.table.busy_count() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return self.table.busy_count()

    async def close(self) -> None:
        """Detach every session (committed, kept), stop the engine, then close what `open` opened."""
        try:
            if self._table is not None:
                await self._table.detach_all("shutting_down", "the server is shutting down; the session is kept: "
                                             "resend the message when it is back")
                replica = self._table.replica
                if replica is not None:  # its sessions may be taken over at once, not a lease later
                    try:
                        await replica.leave()
                    except Exception:
                        log.exception("giving the replica's lease up failed; it lapses by itself")
            await self.engine.shutdown()
        finally:
            await self.forwarder.close()
            await self._release()

    async def expire_loop(self) -> None:
        idle = min(self.config.server.session_idle_s, self.config.server.hibernate_s)
        while True:
            await asyncio.sleep(min(30.0, max(0.05, idle / 4)))
            try:
                if self.ready.is_set():
                    await self.expire_idle()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed round (a store error, a tool's end_session) must not end expiry
                log.exception("session expiry failed; trying again at the next round")

    async def expire_idle(self) -> int:
        """One round: sessions idle past `session_idle_s` end (in memory or hibernated); sessions waiting
        for the outside past `hibernate_s` leave memory."""
        server = self.config.server
        n = await self.table.expire_idle(server.session_idle_s)
        if self.ctx is not None:
            n += await self.table.expire_hibernated(self.ctx, server.session_idle_s)
        if n:
            self.metrics.sessions_expired.inc(n)
        if server.hibernate_s < server.session_idle_s:
            await self.table.hibernate_idle(server.hibernate_s)
        return n

    # ------------------------------------------------------------------ admission
    def health(self) -> tuple[int, Health]:
        def body(status: HealthStatus, **error: str | None) -> Health:
            return Health(status=status, model=self.engine_config.model, policy=self.engine_config.policy, **error)

        if self.draining:
            return 503, body("draining")
        if self.ready.is_set() and self.engine.dead:  # before the watchdog's next look
            return 503, body("restarting", error=f"the engine died ({self.engine.dead_reason()})")
        if self.ready.is_set():
            return 200, body("ok")
        if self.start_error is not None:
            return 503, body("failed", error=str(self.start_error))
        if self.down_reason is not None:
            return 503, body("restarting", error=self.down_reason)
        return 503, body("starting")

    def require_ready(self) -> AgentContext:
        if self.ready.is_set() and self.engine.dead:
            raise ApiError(503, "not_ready", f"the engine died ({self.engine.dead_reason()}); restarting",
                           retry_after=RETRY_NOT_READY_S)
        if self.ctx is None or not self.ready.is_set():
            if self.start_error is not None:
                raise ApiError(503, "not_ready", f"the engine failed to start: {self.start_error}")
            msg = f"{self.down_reason}; restarting" if self.down_reason else "the engine is starting"
            raise ApiError(503, "not_ready", msg, retry_after=RETRY_NOT_READY_S)
        return self.ctx

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise ApiError(503, "draining", "the server is shutting down and takes no new work; retry when it is back",
                           retry_after=max(1, round(self.config.server.drain_s)) + RETRY_NOT_READY_S)

    def admit_turn(self) -> AgentContext:
        """A new turn may start (a message, a tool result, a completion)."""
        ctx = self.require_ready()
        self._refuse_if_draining()
        limit = self.config.server.max_queued_turns
        if self.table.busy_count() >= limit:
            raise ApiError(503, "overloaded", f"{limit} turns are in progress (server.max_queued_turns); retry shortly",
                           retry_after=RETRY_OVERLOADED_S)
        return ctx

    # ------------------------------------------------------------------ sessions
    def resolve_tools(self, names: Iterable[Any]) -> list[str]:
        out: list[str] = []
        for n in names:
            if not isinstance(n, str):
                raise ApiError(400, "invalid_request", "'tools' must be a list of tool names")
            name = self.registry.resolve(n)
            if name is None:
                raise ApiError(400, "unknown_tool", f"unknown tool {n!r}; available: {', '.join(self.registry.names())}")
            if name not in out:
                out.append(name)
        return out

    async def open_session(self, *, system: str | None, tools: list[str], client_tools: dict[str, dict[str, Any]],
                           max_tokens: int, temperature: float, seed: int | None, ephemeral: bool = False,
                           ignore_eos: bool = False) -> AgentSession:
        ctx = self.require_ready()
        self._refuse_if_draining()
        if not ephemeral:
            # Sessions in memory are bounded, not sessions: idle ones hibernate to make room (429 when
            # every one in memory is busy).
            await self.table.make_room(self.config.server.max_sessions)
        return await self.table.open(ctx, system=system, tools=tools, client_tools=client_tools, max_tokens=max_tokens,
                                     temperature=temperature, seed=seed, ephemeral=ephemeral, ignore_eos=ignore_eos)

    def durable_sessions(self) -> int:
        return self.table.durable_count()

    async def close_session(self, sid: str) -> None:
        await self.table.close(sid)

    async def session(self, sid: str, token: str) -> AgentSession:
        """The session, if `token` is its token. While the engine (re)starts the stored sessions are not
        read back yet: 503, not 404. A replica takes over a stored session it does not serve whose owner's
        lease lapsed (requests for one a live replica owns are forwarded before they get here)."""
        if not self.ready.is_set() or self.engine.dead:
            self.require_ready()
        if self.table.serving(sid):
            return self.table.get(sid, token)
        return await self.table.find(self.require_ready(), sid, token, max_live=self.config.server.max_sessions)

    async def lease_loop(self) -> None:
        """A replica renews its lease every third of it; a failed renewal is retried at the next round (the
        lease lapses only after a whole `lease_s` without one)."""
        replica = self.table.replica
        if replica is None:
            return
        while True:
            await asyncio.sleep(self.config.server.lease_s / 3)
            try:
                if not await replica.heartbeat():
                    log.error("replica %s: another process joined with this id; this one's writes are fenced",
                              replica.replica_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replica %s: renewing the lease failed; retrying", replica.replica_id)

    def session_states(self) -> list[str]:
        return self.table.states()


GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)


def gw_of(request: web.Request) -> Gateway:
    """The gateway of the app serving `request`."""
    return request.app[GATEWAY_KEY]
