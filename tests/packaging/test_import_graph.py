"""No import cycles between the project's modules at run time, deferred imports inside functions included
(a late import is the same coupling as an early one); imports under `if TYPE_CHECKING:` do not run and do
not count. Read from the source with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Repository folder -> the package it installs as (pyproject.toml).
PACKAGES = {"infercept": "infercept", "gateway": "gateway", "augmentations": "augmentations",
            "engine_adapter": "engine_adapter", "configs": "infercept.configs", "benchmarks": "infercept.benchmarks"}


def modules() -> dict[str, Path]:
    out = {}
    for folder, name in PACKAGES.items():
        for py in (REPO / folder).rglob("*.py"):
            parts = [p for p in py.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([name, *parts])] = py
    return out


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {}
    for mod, py in mods.items():
        deps: set[str] = set()
        for node in _runtime_imports(ast.parse(py.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if py.name == "__init__.py" else mod.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:  # a name imported from a module: the module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    deps.add(t)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_graph_sees_deferred_imports() -> None:
    graph = import_graph()
    # infercept/cli.py imports the gateway's server and the benchmarks only inside its commands.
    assert "infercept.serve" in graph["infercept.cli"] and "infercept.benchmarks.runner" in graph["infercept.cli"]
    # The cycle finder finds a planted cycle.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_at_run_time() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (each list imports itself round): " + "; ".join(" <-> ".join(c) for c in found)


def test_the_gateway_layers_point_one_way() -> None:
    deps = import_graph()
    # The message loop drives its session through its `Host` protocol, never the session's module.
    assert "gateway.agent" not in deps["gateway.react"]
    routes = {"gateway.routes_sessions", "gateway.routes_openai", "gateway.routes_admin"}
    assert routes <= deps["gateway.app"]  # the app imports its routes at the top
    for r in routes:
        assert "gateway.app" not in deps[r], r
    assert not (deps["gateway.gateway"] & (routes | {"gateway.app"}))  # the state object knows no HTTP layer
