"""`infercept tools list` and `infercept tools run NAME ARGUMENTS [--set key=value ...]`: one tool alone,
no model. Prints JSON: the tools with their types and settings, or one call's observation with the paths
of its artifacts (written to --out-dir). For users wiring their own tools, and for trying each tool from
the command line with the same settings the server would use."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from augmentations.factory import EXECUTORS, build_registry
from gateway.artifacts import EXT
from gateway.calls import run_server_tool
from gateway.config import DEFAULT_AUGMENTATIONS, load_gateway_config


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values read as YAML scalars (numbers, booleans, lists stay typed)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set takes key=value, got {item!r}")
        out[key.strip()] = yaml.safe_load(value) if value else ""
    return out


def tool_settings(config: str | None, name: str, sets: dict[str, Any]) -> tuple[str, dict[str, dict[str, Any]]]:
    """(config key, the augmentations section with only that tool, its settings overridden)."""
    augs = dict(load_gateway_config(config).augmentations) if config else dict(DEFAULT_AUGMENTATIONS)
    low = name.strip().lower()
    key = next((k for k, cls in EXECUTORS.items() if low in (k, str(getattr(cls, "name", "")).lower())), None)
    if key is None:
        raise ValueError(f"unknown tool {name!r}; known: {', '.join(EXECUTORS)}")
    settings = {k: v for k, v in dict(augs.get(key) or {}).items() if k != "enabled"}
    settings.update(sets)
    return key, {key: settings}


def list_tools(config: str | None) -> list[dict[str, Any]]:
    augs = load_gateway_config(config).augmentations if config else DEFAULT_AUGMENTATIONS
    out = []
    for key, cls in EXECUTORS.items():
        settings = dict(augs.get(key) or {}) if key in augs else None
        out.append({"name": getattr(cls, "name", key), "key": key, "type": getattr(cls, "aug_type", None),
                    "description": getattr(cls, "description", ""),
                    "enabled": settings is not None and settings.get("enabled", True), "settings": settings})
    return out


async def run_tool(config: str | None, name: str, arguments: str, sets: dict[str, Any], out_dir: Path,
                   session: str = "cli") -> dict[str, Any]:
    key, section = tool_settings(config, name, sets)
    registry, timeouts = build_registry(section)
    (tool,) = registry.names()
    ex = registry.get(tool)
    timeout = timeouts.get(tool) or 60.0
    t0 = time.perf_counter()
    try:
        result = await run_server_tool(registry, tool, arguments, session, timeout)
    finally:
        end = getattr(ex, "end_session", None)
        if end is not None:
            await end(session)
        await registry.close()
    paths = []
    if result.artifacts:
        out_dir.mkdir(parents=True, exist_ok=True)
        for i, a in enumerate(result.artifacts):
            path = out_dir / f"{tool.lower()}-{int(time.time())}-{i}.{EXT.get(a.mime, 'bin')}"
            path.write_bytes(a.data)
            paths.append(str(path))
    return {"tool": tool, "key": key, "type": ex.aug_type, "arguments": arguments, "content": result.content,
            "error": result.error, "duration_s": round(time.perf_counter() - t0, 4), "artifacts": paths}


def main(args: Any) -> int:
    import logging

    logging.getLogger("infercept.gateway").setLevel(logging.CRITICAL)  # a failed call is in the JSON already
    if args.tools_cmd == "list":
        print(json.dumps({"tools": list_tools(args.config)}, indent=2))
        return 0
    out = asyncio.run(run_tool(args.config, args.name, args.arguments, parse_sets(args.set or []), Path(args.out_dir),
                               session=args.session))
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 1 if out["error"] else 0



