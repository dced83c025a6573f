"""The policy code and the tool registry import with neither vLLM nor torch installed: the simulator and
a tool-only deployment must not need an inference stack. Checked in a fresh interpreter in which any
import of vllm or torch fails as if they were not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "torch"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Block())
"""

MODULES = [
    "engine_adapter.policy", "engine_adapter.policy.table", "engine_adapter.policy.decide",
    "engine_adapter.policy.waste", "engine_adapter.policy.estimator", "engine_adapter.policy.profile",
    "engine_adapter.intercept.core", "engine_adapter.intercept.build", "engine_adapter.intercept.step", "engine_adapter.intercept.reports",
    "engine_adapter.hints", "engine_adapter.config",
    "augmentations.registry", "augmentations.factory", "augmentations.calculator", "augmentations.wikipedia",
    "augmentations.alfworld", "augmentations.image", "augmentations.tts", "augmentations.human",
]


def test_policy_and_augmentations_import_without_vllm_or_torch() -> None:
    code = BLOCKER + "\n".join(f"import {m}" for m in MODULES) + """
from augmentations.factory import build_registry
reg, _ = build_registry({"calculator": {}, "human": {}})
assert reg.hints()["Calculator"].aug_type == "math"
assert not [m for m in sys.modules if m.split(".")[0] in ("vllm", "torch")]
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_blocker_blocks() -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCKER + "import vllm"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "blocked by the test" in proc.stderr
