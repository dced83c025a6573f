"""A benchmark's measured points on disk, so that a long run survives the end of its process.

Every finished point (one policy at one token budget, seed and rate, or one SLO reference) is written to
`OUT/points/<key>.json` the moment it completes. The plan that produced them is kept in `OUT/plan.json`:
running the same command again continues where it stopped and skips what is there; a different plan
or different code (`runner.code_digest`: commits to docs or tests do not count) in the same folder is
refused (mixing them would compare policies measured on different code or settings).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


class PlanMismatch(ValueError):
    pass


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=1, sort_keys=True, default=lambda o: None if o == float("inf") else str(o))


class PointStore:
    def __init__(self, out: Path, plan: dict[str, Any]) -> None:
        self.dir = out / "points"
        self.dir.mkdir(parents=True, exist_ok=True)
        path = out / "plan.json"
        if path.is_file():
            old = json.loads(path.read_text())
            diff = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
            if diff:
                raise PlanMismatch(f"{out} holds points of another plan (differs in {', '.join(diff)}: "
                                   f"{ {k: old.get(k) for k in diff} } vs { {k: plan.get(k) for k in diff} }); "
                                   "finish that one with its own command, or choose another --out")
        else:
            path.write_text(_dump(plan))
        self.resumed = len(list(self.dir.glob("*.json")))

    @staticmethod
    def key(*parts: object) -> str:
        return "__".join(str(p).replace("/", "-").replace(" ", "") for p in parts)

    def machines(self) -> list[dict[str, Any]]:
        """The distinct machines the points on disk were measured on (points record theirs)."""
        seen = {_dump(m): m for path in sorted(self.dir.glob("*.json"))
                if (m := json.loads(path.read_text()).get("machine"))}
        return list(seen.values())

    def get(self, key: str) -> Any | None:
        return _read(self.dir, key)

    def put(self, key: str, value: Any) -> None:
        # Written aside and renamed, so that a process killed mid-write leaves no half point behind.
        path = self.dir / f"{key}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(_dump(value))
        os.replace(tmp, path)


def repeat_pairs(get: Callable[[str], Any], budgets: Mapping[str, str], seed: int,
                 rates: Iterable[float]) -> list[tuple[str, Any, Any]]:
    """(policy, pilot point, sweep point) for every policy whose budget pilot ran at a rate the sweep's
    first round ran too, at the budget the pilot chose (`budgets`: policy -> budget key), on the pilot's
    seed: the same point measured twice, some minutes apart (`metrics.repeatability`)."""
    out = []
    for label, budget in budgets.items():
        for r in rates:
            a = get(PointStore.key("pilot", label, budget, seed, f"{r:g}"))
            b = get(PointStore.key("round0", label, budget, seed, f"{r:g}"))
            if a is not None and b is not None:
                out.append((label, a, b))
    return out


def reader(points_dir: Path) -> Callable[[str], Any]:
    """`PointStore.get` over a finished run's points folder, without a plan (for reports)."""
    return lambda key: _read(points_dir, key)


def _read(points_dir: Path, key: str) -> Any | None:
    path = points_dir / f"{key}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def budget_key(b: int | None) -> str:
    """A token budget as point keys and reports name it."""
    return "vllm-default" if b is None else str(b)
