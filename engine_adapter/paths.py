"""Where infercept keeps what it builds and stores on this machine: one rule for every layer (models,
tool data, the session store). Pure stdlib, so tools import it without vLLM or torch."""

from __future__ import annotations

import os
from pathlib import Path


def infercept_home() -> Path:
    """`$INFERCEPT_HOME`, default `~/.cache/infercept`."""
    return Path(os.environ.get("INFERCEPT_HOME") or Path.home() / ".cache" / "infercept")
