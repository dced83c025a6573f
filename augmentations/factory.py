"""Build the server's tool registry from the `augmentations:` section of the config.

    augmentations:
      calculator: {}
      wikipedia: {source: offline, max_chars: 400}
      alfworld: {tasks_per_type: 2}      # or data: <ALFWorld data folder>, split, task_types
      image: {model: tiny, steps: 4, size: 64}
      tts: {backend: auto}
      human: {}
      <name>: {enabled: false}        # leave a tool out
      <name>: {timeout_s: 30}         # per-tool timeout (the gateway enforces it)

Keys other than `enabled` and `timeout_s` are the executor's constructor arguments; unknown ones are
reported with the tool's name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from augmentations.alfworld import ALFWorld
from augmentations.base import Augmentation
from augmentations.calculator import Calculator
from augmentations.human import AskHuman
from augmentations.image import ImageGen
from augmentations.registry import Registry
from augmentations.tts import Speech
from augmentations.wikipedia import Wikipedia

# config key -> executor class. The key is also how sessions name tools (as are the executors' names).
EXECUTORS: dict[str, Callable[..., Augmentation]] = {
    "calculator": Calculator,
    "wikipedia": Wikipedia,
    "alfworld": ALFWorld,
    "image": ImageGen,
    "tts": Speech,
    "human": AskHuman,
}
GATEWAY_KEYS = ("enabled", "timeout_s")


def validate_settings(settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        if key not in EXECUTORS:
            raise ValueError(f"augmentations: unknown tool {key!r}; known: {', '.join(EXECUTORS)}")
        value = dict(value or {})
        params = inspect.signature(EXECUTORS[key]).parameters
        bad = sorted(k for k in value if k not in GATEWAY_KEYS and k not in params)
        if bad:
            raise ValueError(f"augmentations.{key}: unknown setting(s) {', '.join(bad)}")
        t = value.get("timeout_s")
        if t is not None and (not isinstance(t, (int, float)) or t <= 0):
            raise ValueError(f"augmentations.{key}.timeout_s must be a positive number")
        out[key] = value
    return out


def build_registry(settings: Mapping[str, Any]) -> tuple[Registry, dict[str, float | None]]:
    """The registry of enabled tools and each tool's timeout (by executor name)."""
    reg = Registry()
    timeouts: dict[str, float | None] = {}
    for key, value in validate_settings(settings).items():
        if not value.get("enabled", True):
            continue
        kwargs = {k: v for k, v in value.items() if k not in GATEWAY_KEYS}
        try:
            ex = EXECUTORS[key](**kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"augmentations.{key}: {e}") from e
        reg.add(ex, aliases=[key])  # sessions may name a tool by its config key ("human" for AskHuman)
        timeouts[ex.name] = value.get("timeout_s")
    return reg, timeouts
