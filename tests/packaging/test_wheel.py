"""The package as a user installs it: the built wheel, installed into a folder of its own, run from another
directory with the checkout off the path. Its configs, profiles, Table-1 priors and web client are package
data; a server started from it comes up with the shipped policy and the measured profile, as from the
checkout."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The repository's folders of code and where they install (pyproject.toml's package-dir).
INSTALLED_AS = {"infercept": "infercept", "gateway": "gateway", "augmentations": "augmentations",
                "engine_adapter": "engine_adapter", "configs": "infercept/configs", "benchmarks": "infercept/benchmarks"}
DATA = ["infercept/configs/default.yaml", "infercept/configs/augmentations.yaml", "infercept/configs/profiles/default-cpu.json",
        "gateway/static/index.html", "gateway/static/app.js", "gateway/static/app.css"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the tracked files: setuptools keeps a build/ folder beside the sources, and a
    # module removed from the tree would still be in a stale one. No build isolation: setuptools and wheel
    # are in the venv, and nothing needs to be downloaded.
    src = tmp_path_factory.mktemp("src")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(out)],
                   check=True, capture_output=True, timeout=300, cwd=out)
    (whl,) = out.glob("infercept-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return target


def _env(site: Path) -> dict[str, str]:
    # The wheel's folder first: it shadows the checkout's editable install, whose finder stays behind it.
    return {**os.environ, "PYTHONPATH": str(site), "TOKENIZERS_PARALLELISM": "false"}


def test_the_wheel_holds_every_module_and_the_package_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, dest in INSTALLED_AS.items():
        for py in (REPO / folder).rglob("*.py"):
            rel = py.relative_to(REPO / folder).as_posix()
            assert f"{dest}/{rel}" in names, f"{folder}/{rel} is not in the wheel (add its package to pyproject.toml)"
    for f in DATA:
        assert f in names, f
    # Nothing lands at the top of site-packages under a name another distribution could also use.
    tops = {n.split("/")[0] for n in names if not n.startswith("infercept-")}
    assert tops == {"infercept", "gateway", "augmentations", "engine_adapter"}


def test_installed_modules_and_configs_come_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    code = """
import importlib, pkgutil, sys
from pathlib import Path
site = Path(sys.argv[1]).resolve()
for top in ("infercept", "gateway", "augmentations", "engine_adapter"):
    pkg = importlib.import_module(top)
    for m in pkgutil.walk_packages(pkg.__path__, top + "."):
        if m.ispkg:
            sub = importlib.import_module(m.name)
            assert Path(sub.__file__).resolve().is_relative_to(site), (m.name, sub.__file__)
from engine_adapter.paths import configs_dir, shipped_config
assert configs_dir().resolve().is_relative_to(site), configs_dir()
print(shipped_config("default.yaml"))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(installed)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=_env(installed))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip()) == installed / "infercept" / "configs" / "default.yaml"


def test_serve_once_from_the_wheel_uses_the_shipped_config_and_profile(installed: Path, tmp_path: Path, uses_server: None,
                                                                        uses_default_model: None) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exe = installed / "bin" / "infercept"
    proc = subprocess.run([str(exe), "serve", "--once", "--port", str(port), "--state-path", str(tmp_path / "s.db")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_env(installed))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ready = next(line for line in proc.stdout.splitlines() if line.startswith("infercept ready in"))
    assert " policy=infercept " in ready  # the shipped default.yaml's policy
    profile = installed / "infercept" / "configs" / "profiles" / "default-cpu.json"
    assert f"profile='measured by infercept profile on " in ready and f"{profile}'" in ready, ready  # the measured one, from the wheel
    assert "GET /healthz -> 200" in proc.stdout


def test_a_missing_config_is_an_error_naming_it(installed: Path, tmp_path: Path) -> None:
    exe = installed / "bin" / "infercept"
    missing = tmp_path / "nope.yaml"
    proc = subprocess.run([str(exe), "serve", "--once", "--config", str(missing)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=_env(installed))
    assert proc.returncode == 2
    assert f"config file '{missing}' not found" in proc.stderr
