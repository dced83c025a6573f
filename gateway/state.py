"""What the routes share: the engine, the tool registry, the open sessions, metrics and artifacts, and
their lifecycle (engine start in the background, idle expiry, shutdown). The app factory
(`gateway.app.create_app`) runs the lifecycle from aiohttp's `cleanup_ctx`."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable
from typing import Any

from augmentations.factory import build_registry
from augmentations.registry import Registry
from engine_adapter.config import EngineConfig
from engine_adapter.engine import InterceptEngine
from engine_adapter.events import TurnEnd
from engine_adapter.hints import ToolHint
from gateway.agent import AgentContext, AgentSession
from gateway.artifacts import ArtifactStore
from gateway.config import GatewayConfig
from gateway.http import ApiError
from gateway.metrics import GatewayMetrics
from gateway.prompts import PromptBuilder
from gateway.toolcalls import CallParser

log = logging.getLogger("infercept.gateway")
EPHEMERAL_PREFIX = "chatcmpl-"  # sessions of one OpenAI completion: not counted against max_sessions


class Gateway:
    def __init__(self, engine_config: EngineConfig, config: GatewayConfig, registry: Registry | None = None,
                 timeouts: dict[str, float | None] | None = None) -> None:
        self.engine_config = engine_config
        self.config = config
        if registry is None:
            registry, timeouts = build_registry(config.augmentations)
        self.registry = registry
        self.timeouts = timeouts or {}
        self.engine = InterceptEngine(engine_config)
        self.metrics = GatewayMetrics()
        self.artifacts = ArtifactStore(config.server.artifact_store_mb * 2**20)
        self.sessions: dict[str, AgentSession] = {}
        self.ctx: AgentContext | None = None  # once the engine is ready
        self.ready = asyncio.Event()
        self.start_error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start_engine(self) -> None:
        """Start the engine and do one real round trip before saying ready. A failure is kept in
        `start_error` (health checks report it), not raised: the server stays up to say so."""
        try:
            t0 = time.perf_counter()
            await self.engine.start()
            self.ctx = AgentContext(
                engine=self.engine, registry=self.registry, limits=self.config.server, metrics=self.metrics,
                prompts=PromptBuilder(self.engine.tokenizer), artifacts=self.artifacts,
                calls=CallParser(self.engine.tokenizer), timeouts=self.timeouts,
            )
            s = self.engine.open_session(max_tokens=2)
            async for ev in s.turn("Hello"):
                if isinstance(ev, TurnEnd):
                    pass
            await s.close()
            self.ready.set()
            stats = await self.engine.stats()
            log.info("engine ready in %.1f s: model=%s policy=%s kv_blocks=%d block_size=%d tools=%s",
                     time.perf_counter() - t0, self.engine.model_path, stats.policy, stats.blocks.total,
                     stats.block_size, ",".join(self.registry.names()))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.start_error = e
            log.exception("engine failed to start")

    async def close(self) -> None:
        for s in list(self.sessions.values()):
            await s.close()
        self.sessions.clear()
        await self.registry.close()
        await self.engine.shutdown()

    async def expire_loop(self) -> None:
        idle = self.config.server.session_idle_s
        while True:
            await asyncio.sleep(min(30.0, max(0.05, idle / 4)))
            await self.expire_idle()

    async def expire_idle(self) -> int:
        now, idle, n = time.monotonic(), self.config.server.session_idle_s, 0
        for s in list(self.sessions.values()):
            if s.waiting_for_outside and now - s.last_active_s > idle:
                await self.close_session(s.id)
                self.metrics.sessions_expired.inc()
                n += 1
        return n

    # ------------------------------------------------------------------ sessions
    def require_ready(self) -> AgentContext:
        if self.ctx is None or not self.ready.is_set():
            msg = f"the engine failed to start: {self.start_error}" if self.start_error else "the engine is starting"
            raise ApiError(503, "not_ready", msg)
        return self.ctx

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

    def open_session(self, *, system: str | None, tools: list[str], client_tools: dict[str, dict[str, Any]],
                     max_tokens: int, temperature: float, seed: int | None, ephemeral: bool = False) -> AgentSession:
        ctx = self.require_ready()
        if not ephemeral and self.durable_sessions() >= self.config.server.max_sessions:
            raise ApiError(429, "too_many_sessions", f"the server holds its limit of {self.config.server.max_sessions} sessions; close one")
        hints: dict[str, ToolHint] = self.registry.hints(tools)
        for name, spec in client_tools.items():
            hints[name] = ToolHint(str(spec.get("type") or "default"), spec.get("expected_s"))
        sid = (EPHEMERAL_PREFIX if ephemeral else "sess-") + secrets.token_hex(12)
        es = self.engine.open_session(session_id=sid, tools=hints, max_tokens=max_tokens, temperature=temperature, seed=seed)
        s = AgentSession(ctx, es, system=system, tools=tools, client_tools=client_tools, max_tokens=max_tokens)
        self.sessions[sid] = s
        return s

    def durable_sessions(self) -> int:
        return sum(1 for sid in self.sessions if not sid.startswith(EPHEMERAL_PREFIX))

    async def close_session(self, sid: str) -> None:
        s = self.sessions.pop(sid, None)
        if s is not None:
            await s.close()

    def session(self, sid: str, token: str) -> AgentSession:
        """The session, if `token` is its token (compared in constant time)."""
        s = self.sessions.get(sid)
        if s is None:
            raise ApiError(404, "not_found", f"no session {sid!r}")
        if not secrets.compare_digest(token.encode(), s.token.encode()):
            raise ApiError(403, "forbidden", "missing or wrong X-Session-Token for this session")
        return s

    def session_states(self) -> list[str]:
        return [s.public_state() for s in self.sessions.values()]
