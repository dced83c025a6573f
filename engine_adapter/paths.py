"""Where infercept finds what it ships and keeps what it builds: one rule for every layer (models, tool
data, the session store, configs and profiles). Pure stdlib, so tools and the simulator import it
without vLLM or torch.

What ships with the package (the default config, the Table-1 priors, the measured profiles) is package
data of `infercept.configs` (the repository's `configs/` folder), read through `importlib.resources`, so
a wheel installed anywhere finds it; a checkout installed editable finds the same files in `configs/`."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

CONFIGS_PACKAGE = "infercept.configs"


def infercept_home() -> Path:
    """`$INFERCEPT_HOME`, default `~/.cache/infercept`."""
    return Path(os.environ.get("INFERCEPT_HOME") or Path.home() / ".cache" / "infercept")


def configs_dir() -> Path:
    """The folder of the shipped configs (`default.yaml`, `augmentations.yaml`, `profiles/`)."""
    root = resources.files(CONFIGS_PACKAGE)
    if not isinstance(root, Path):  # a zipped install: the engine core needs real paths to pass on
        raise RuntimeError(f"{CONFIGS_PACKAGE} is not on the file system ({root!r}): install infercept unpacked")
    return root


def shipped_config(name: str) -> Path:
    """A file that ships with the package (e.g. `default.yaml`); a missing one is an error naming it,
    never a silent fall back to other settings."""
    path = configs_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"infercept's shipped config {path} is missing: the installation is incomplete")
    return path


def user_profiles_dir() -> Path:
    """Profiles measured on this machine (`infercept profile`); they win over the shipped ones."""
    return infercept_home() / "profiles"


def require_file(path: str | Path, what: str) -> Path:
    """`path` as a Path if it is a readable file, else a clear error naming `what` and the path."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{what} {str(p)!r} not found")
    if not os.access(p, os.R_OK):
        raise PermissionError(f"{what} {str(p)!r} is not readable")
    return p
