"""The tools a server offers: name -> executor, plus the duration hints the engine needs.

Names are matched case-insensitively (models write "calculator" as often as "Calculator"). The hints
(augmentation type, expected call duration) come from the executors' types and the Table 1 priors in
`configs/augmentations.yaml`; the engine carries them into vLLM's kv_hints so the scheduler knows a
call's type at the very token that completes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from augmentations.base import Augmentation
from engine_adapter.hints import ToolHint
from engine_adapter.paths import shipped_config
from engine_adapter.policy.estimator import load_priors


def tool_name_key(name: str) -> str:
    """The one rule for matching tool names: case-insensitive, surrounding space ignored (models write
    "calculator" as often as "Calculator")."""
    return name.strip().lower()


def find_tool(name: str, names: Iterable[str]) -> str | None:
    """The entry of `names` that `name` refers to, as spelled there."""
    key = tool_name_key(name)
    return next((n for n in names if tool_name_key(n) == key), None)

PRIORS = shipped_config("augmentations.yaml")  # the paper's Table 1, shipped as package data


class UnknownTool(KeyError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = sorted(known)

    def __str__(self) -> str:
        return f"unknown tool {self.name!r}; available: {', '.join(self.known) or 'none'}"


class Registry:
    def __init__(self, executors: Iterable[Augmentation] = (), priors: Mapping[str, tuple[float, float]] | None = None) -> None:
        self._by_key: dict[str, Augmentation] = {}
        self._aliases: dict[str, str] = {}  # another name (the config key) -> the executor's key
        self._priors = dict(priors) if priors is not None else load_priors(str(PRIORS))
        for ex in executors:
            self.add(ex)

    def add(self, executor: Augmentation, aliases: Iterable[str] = ()) -> None:
        key = tool_name_key(executor.name)
        if key in self._by_key:
            raise ValueError(f"tool {executor.name!r} registered twice")
        self._by_key[key] = executor
        for alias in aliases:
            self._aliases[tool_name_key(alias)] = key

    def remove(self, name: str) -> Augmentation:
        """Take a tool out (and its aliases); the executor is returned, not closed."""
        key = tool_name_key(self.get(name).name)
        self._aliases = {a: k for a, k in self._aliases.items() if k != key}
        return self._by_key.pop(key)

    def resolve(self, name: str) -> str | None:
        """The executor name a tool name or alias refers to (None: no such tool)."""
        key = tool_name_key(name)
        ex = self._by_key.get(self._aliases.get(key, key))
        return ex.name if ex is not None else None

    def get(self, name: str) -> Augmentation:
        resolved = self.resolve(name)
        if resolved is None:
            raise UnknownTool(name, self.names())
        return self._by_key[tool_name_key(resolved)]

    def names(self) -> list[str]:
        return [ex.name for ex in self._by_key.values()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.resolve(name) is not None

    def hints(self, names: Iterable[str] | None = None) -> dict[str, ToolHint]:
        """kv_hints tool table for the given tools (all by default): type and prior mean duration.
        The model may write a name in any case, so every spelling it is likely to use is listed."""
        chosen = [self.get(n) for n in names] if names is not None else list(self._by_key.values())
        out: dict[str, ToolHint] = {}
        for ex in chosen:
            mean = self._priors.get(ex.aug_type, (None, None))[0]
            hint = ToolHint(ex.aug_type, mean)
            for spelling in {ex.name, ex.name.lower(), ex.name.capitalize()}:
                out[spelling] = hint
        return out

    async def close(self) -> None:
        for ex in self._by_key.values():
            await ex.close()
