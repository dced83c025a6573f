"""The gateway's modules import one another one way only: no cycle, counting every import in a module
(at the top, inside functions, under TYPE_CHECKING). A late import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def imports_of(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gateway."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "gateway":
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("gateway."))
    return out


def graph() -> dict[str, set[str]]:
    return {p.stem: imports_of(p) - {p.stem} for p in GATEWAY.glob("*.py") if p.stem != "__init__"}


def test_no_import_cycle_between_gateway_modules() -> None:
    deps = graph()
    done: set[str] = set()

    def visit(mod: str, path: list[str]) -> None:
        if mod in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(mod):], mod]))
        if mod in done:
            return
        for dep in sorted(deps.get(mod, ())):
            visit(dep, [*path, mod])
        done.add(mod)

    for mod in sorted(deps):
        visit(mod, [])


def test_the_layers_point_one_way() -> None:
    deps = graph()
    assert "react" not in deps["react"] and "agent" not in deps["react"]  # the loop drives its session through `Host`
    assert {"routes_sessions", "routes_openai", "routes_admin"} <= deps["app"]
    for routes in ("routes_sessions", "routes_openai", "routes_admin"):
        assert "app" not in deps[routes], routes
    assert not any(mod in deps["gateway"] for mod in ("app", "routes_sessions", "routes_openai", "routes_admin"))
