"""What every agent session shares from the gateway (the engine, the tools, limits, metrics, prompts,
artifacts): built once by `Gateway.start_engine` when the engine is ready, passed in, never imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from augmentations.registry import Registry
from engine_adapter.engine import InterceptEngine
from gateway.artifacts import ArtifactStore
from gateway.call_parser import CallParser
from gateway.config import ServerConfig
from gateway.metrics import GatewayMetrics
from gateway.prompts import PromptBuilder


@dataclass(frozen=True)
class AgentContext:
    """What an agent session needs from the gateway: built once, when the engine is ready."""

    engine: InterceptEngine
    registry: Registry
    limits: ServerConfig
    metrics: GatewayMetrics
    prompts: PromptBuilder
    artifacts: ArtifactStore
    calls: CallParser
    timeouts: Mapping[str, float | None] = field(default_factory=dict)  # per executor name
    result_limit: int = 1500  # characters of a tool result the model, the client and the store see


__all__ = ["AgentContext"]
