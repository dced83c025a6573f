"""Private names of other projects are reached in one place each: vLLM's in the vLLM port
(`engine_adapter/vllm_port.py`, whose docstring lists them), a third party's unavoidable one in a named
function that says why. An AST scan of our packages: an attribute (or a `getattr`-family string, or an
imported name) that starts with one underscore and is defined nowhere in our own code is someone else's
private, and must be in `vllm_port.py` or in `ALLOWED`.

What it cannot see: a foreign private that happens to share its name with one of ours (overriding a
vLLM hook, e.g. `_free_request`, makes that name ours), and vLLM internals without an underscore (those
are listed in the docstrings of the modules that use them)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("engine_adapter", "gateway", "augmentations", "infercept", "benchmarks")
PORT = "engine_adapter/vllm_port.py"
# (file, private name): third-party privates, each wrapped in one function that gives the reason.
ALLOWED = {
    ("augmentations/bark_tts.py", "_load_model"),  # load_bark_checkpoint
    ("augmentations/bark_tts.py", "_grab_best_device"),  # bark_device
    ("augmentations/bark_tts.py", "_core"),  # numpy._core.multiarray.scalar (NumPy 2), checkpoint_globals
    ("augmentations/workers.py", "_processes"),  # ProcessPoolExecutor's processes, pool_processes
    ("infercept/serve.py", "_exit"),  # os._exit: public, documented, underscored
    # torch's allocator settings at run time (exact_pinned_above_mb: no public setter after start)
    ("engine_adapter/kv_copy.py", "_C"),
    ("engine_adapter/kv_copy.py", "_accelerator_getAllocatorSettings"),
    ("engine_adapter/kv_copy.py", "_accelerator_setAllocatorSettings"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _sources() -> dict[str, ast.Module]:
    files = sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))
    return {str(p.relative_to(REPO)): ast.parse(p.read_text(), filename=str(p)) for p in files}


def _own_names(trees: dict[str, ast.Module]) -> set[str]:
    """Every underscore name our code defines: module-level functions and classes, methods, arguments,
    assigned names, attributes assigned on `self`, import aliases, our own modules. A nested function, or
    an attribute set on some other object, is not a definition of ours (the plugin's `_sample` replaces
    vLLM's)."""
    own: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef)):
                own.update(d.name for d in node.body
                           if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"):
                own.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                own.add(node.asname)
    own.update(p.stem for pkg in PACKAGES for p in (REPO / pkg).rglob("_*.py"))
    return {n for n in own if _private(n)}


def _foreign_privates(path: str, tree: ast.Module, own: set[str]) -> list[tuple[str, int, str]]:
    found: list[tuple[str, int, str]] = []
    ours = PACKAGES + ("tests",)
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            names = [node.attr]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            names = [node.args[1].value]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and not node.module.startswith(ours):
            names = node.module.split(".") + [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [part for a in node.names if not a.name.startswith(ours) for part in a.name.split(".")]
        found += [(path, node.lineno, n) for n in names if _private(n) and n not in own]
    return found


def test_private_names_of_other_projects_are_reached_only_through_the_port_or_one_named_wrapper() -> None:
    trees = _sources()
    own = _own_names(trees)
    leaks = [(path, line, name) for path, tree in trees.items() if path != PORT
             for path, line, name in _foreign_privates(path, tree, own) if (path, name) not in ALLOWED]
    assert leaks == [], "private names of vLLM (or another project) outside engine_adapter/vllm_port.py"


def test_the_scan_finds_what_the_port_wraps() -> None:
    # The port itself reaches vLLM's privates: the scan must see them there (else it sees nothing at all).
    trees = _sources()
    found = {name for _, _, name in _foreign_privates(PORT, trees[PORT], _own_names(trees))}
    assert {"_call_utility_async", "_create_grammar", "_get_connector_metadata", "_free_request_blocks",
            "_sample", "_bookkeeping_sync"} <= found
