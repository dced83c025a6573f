"""The gateway's settings: the `server:` and `augmentations:` sections of the YAML config (the
`engine:` section is `engine_adapter.config`). Validated at load; unknown keys and bad types are
errors that name the key."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from augmentations.factory import validate_settings
from engine_adapter.config import read_config_doc
from engine_adapter.paths import infercept_home
from gateway.store_pg import is_postgres_url, redact

DEFAULT_AUGMENTATIONS: dict[str, dict[str, Any]] = {
    "calculator": {"timeout_s": 5},
    "wikipedia": {"timeout_s": 30},
    "alfworld": {"timeout_s": 60},
    "image": {"timeout_s": 300},
    "tts": {"timeout_s": 120},
    "human": {},
}


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # when set, every /v1 route needs "Authorization: Bearer KEY"
    max_sessions: int = 256  # sessions in memory at once; idle ones hibernate to make room (429 when all are busy)
    session_idle_s: float = 1800.0  # a session idle this long is closed and its KV freed
    # A session waiting for its user (or a client tool) this long leaves memory: committed, its engine
    # request and KV freed; its next request reads it back from the store (its context recomputed).
    hibernate_s: float = 600.0
    max_message_chars: int = 16000
    max_tokens: int = 256  # per generation step (one model turn between tool calls)
    max_tool_calls: int = 8  # per user message; then the model is told to answer
    max_reprompts: int = 1  # per message: re-prompts after the model began an observation itself
    max_observation_chars: int = 1500  # a tool result longer than this is cut for the model
    tool_timeout_s: float = 60.0  # default per-call timeout (augmentations.<name>.timeout_s wins)
    artifact_store_mb: int = 256  # images and audio kept in memory (oldest dropped first)
    model_name: str | None = None  # the name /v1/models reports (default: the engine's model)
    # The durable session store (SQLite): default $INFERCEPT_HOME/state/sessions.db; ":memory:" keeps
    # nothing across restarts. Artifacts of live sessions are kept in the folder beside it.
    state_path: str | None = None
    # Where sessions are stored: unset, the SQLite file above; a PostgreSQL URL
    # ("postgresql://user@host:5432/db"; the password from PGPASSWORD or ~/.pgpass rather than the file),
    # a database several replicas share (gateway/store_pg.py). The state folder still holds the lock.
    store: str | None = None
    # One of several replicas sharing `store` (PostgreSQL): its id (stable across its restarts), the URL
    # other replicas forward its sessions' requests to (default http://host:port), and its lease: a
    # replica silent for `lease_s` loses its sessions to the first replica that gets a request for one.
    replica_id: str | None = None
    advertise_url: str | None = None
    lease_s: float = 10.0
    # A replica behind HAProxy: a TCP port where the balancer's agent check reads this server's load (its
    # free KV share and room under max_sessions, or weight 0 while it drains), so that new sessions go where there is room
    # (gateway/lb_agent.py). Unset: no agent; `infercept cluster` sets it for each replica.
    agent_port: int | None = None
    drain_s: float = 30.0  # on SIGTERM: how long running turns may finish before the server stops
    max_queued_turns: int = 1024  # turns in progress at once (generating or in a server tool); 503 beyond
    sse_ping_s: float = 15.0  # an SSE comment this often while a stream is quiet (proxies keep it open)
    backlog: int = 4096  # the listening socket's accept queue (the kernel caps it at net.core.somaxconn)
    restart_engine: bool = True  # when the engine-core process dies: start a new one, restore the sessions

    def resolved_state_path(self) -> str:
        if self.state_path:
            return self.state_path
        return str(infercept_home() / "state" / "sessions.db")


@dataclass(frozen=True)
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    augmentations: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: dict(DEFAULT_AUGMENTATIONS))
    # `augmentations.max_result_chars`: a tool result longer than this is cut, with a note saying so, before
    # the model, the client or the store see it (default: server.max_observation_chars).
    max_result_chars: int | None = None

    @property
    def result_limit(self) -> int:
        return self.max_result_chars or self.server.max_observation_chars


_TYPES: dict[str, tuple[type, ...]] = {
    "host": (str,), "port": (int,), "api_key": (str, type(None)), "max_sessions": (int,),
    "session_idle_s": (int, float), "hibernate_s": (int, float), "max_message_chars": (int,), "max_tokens": (int,), "max_tool_calls": (int,), "max_reprompts": (int,),
    "max_observation_chars": (int,), "tool_timeout_s": (int, float), "artifact_store_mb": (int,),
    "model_name": (str, type(None)), "state_path": (str, type(None)), "store": (str, type(None)), "drain_s": (int, float),
    "max_queued_turns": (int,), "sse_ping_s": (int, float), "backlog": (int,), "restart_engine": (bool,),
    "replica_id": (str, type(None)), "advertise_url": (str, type(None)), "lease_s": (int, float),
    "agent_port": (int, type(None)),
}


_ZERO_OK = {"max_reprompts", "drain_s"}


def server_config(data: Mapping[str, Any]) -> ServerConfig:
    known = {f.name for f in dataclasses.fields(ServerConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"server: unknown setting(s) {', '.join(unknown)}")
    for key, value in data.items():
        if not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and bool not in _TYPES[key]):
            raise ValueError(f"server.{key}: expected {' or '.join(t.__name__ for t in _TYPES[key])}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "port" and (value < 0 if key in _ZERO_OK else value <= 0):
            raise ValueError(f"server.{key} must be {'>= 0' if key in _ZERO_OK else 'positive'}")
    if "port" in data and not 0 <= data["port"] < 65536:
        raise ValueError("server.port must be in 0..65535")
    agent_port = data.get("agent_port")  # a positive int by now, if set
    if agent_port is not None and agent_port >= 65536:
        raise ValueError("server.agent_port must be in 1..65535")
    if agent_port is not None and agent_port == data.get("port", ServerConfig.port):
        raise ValueError("server.agent_port: the balancer's agent needs a port of its own, not server.port")
    if data.get("store") is not None and not is_postgres_url(data["store"]):
        raise ValueError(f"server.store: expected a postgresql:// URL, got {redact(data['store'])!r} "
                         "(leave it unset for SQLite at server.state_path)")
    if data.get("replica_id") is not None and data.get("store") is None:
        raise ValueError("server.replica_id: replicas share a PostgreSQL store; set server.store to its URL")
    if data.get("advertise_url") is not None and data.get("replica_id") is None:
        raise ValueError("server.advertise_url: only a replica (server.replica_id) advertises a URL")
    return ServerConfig(**data)


def load_gateway_config(path: str | None, **server_overrides: Any) -> GatewayConfig:
    doc = read_config_doc(path)
    unknown = sorted(set(doc) - {"engine", "server", "augmentations"})
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {', '.join(unknown)}")
    server = dict(doc.get("server") or {})
    server.update({k: v for k, v in server_overrides.items() if v is not None})
    augs = doc.get("augmentations")
    augs = DEFAULT_AUGMENTATIONS if augs is None else augs
    if not isinstance(augs, Mapping):
        raise ValueError("augmentations: expected a mapping of tool name to settings")
    augs = dict(augs)
    limit = augs.pop("max_result_chars", None)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError("augmentations.max_result_chars must be a positive integer")
    return GatewayConfig(server=server_config(server), augmentations=validate_settings(augs), max_result_chars=limit)
