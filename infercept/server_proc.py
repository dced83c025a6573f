"""An `infercept serve` process run by another program (the load test, the crash tests): started with a
config file, waited on until ready, signalled, killed with SIGKILL like a crash, and never left behind
(its whole process group goes when the owner is done)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import yaml

from gateway.client import AsyncClient

REPO = Path(__file__).resolve().parent.parent


def write_config(path: Path, *, port: int, state_path: str, engine: dict[str, Any] | None = None,
                 server: dict[str, Any] | None = None, augmentations: dict[str, Any] | None = None) -> Path:
    """A config for a tiny-model server on `port` with its own session store."""
    doc = {
        "engine": {"model": "tiny", "policy": "infercept", "dtype": "float32", "max_model_len": 2048, "max_num_seqs": 16,
                   "num_kv_blocks": 400, "block_size": 32, **(engine or {})},
        "server": {"host": "127.0.0.1", "port": port, "state_path": state_path, "max_tokens": 16, **(server or {})},
        "augmentations": augmentations if augmentations is not None else {"calculator": {}, "human": {}},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


class ServerProcess:
    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config, self.port, self.log = config, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        exe = Path(sys.executable).parent / "infercept"
        cmd = [str(exe), "serve", "--config", str(self.config)] if exe.exists() else \
            [sys.executable, "-m", "infercept", "serve", "--config", str(self.config)]
        with open(self.log, "ab") as out:
            # Its own process group (the owner can always take the server and its engine down together) but
            # not its own session: with the kernel's autogroup scheduling (sched_autogroup_enabled=1, the
            # default) a new session is a new scheduling group, and on this 2-core machine a client process
            # in the owner's group was seen runnable yet unscheduled for up to 13 s (its /proc schedstat
            # run delay) while the server's engine decoded, which a timed client (the drain test, the
            # load test) reads as a slow server.
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, process_group=0,
                                         env={**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"})
        return self

    @property
    def command(self) -> str:
        return f"infercept serve --config {self.config}"

    async def wait_ready(self, timeout_s: float = 600.0) -> dict[str, Any]:
        async with AsyncClient(self.url) as c:
            try:
                return await c.wait_ready(timeout_s)
            except Exception as e:
                raise RuntimeError(f"{self.command} not ready: {e}; log tail:\n{self.log_tail()}") from e

    def log_text(self) -> str:
        """Everything the server has logged so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]

    def engine_pids(self) -> list[int]:
        """The server's descendants (vLLM's engine core and its worker, the resource tracker)."""
        assert self.proc is not None
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill9(self) -> None:
        """A crash of the server process alone (its children live on, as after a real `kill -9`)."""
        self.signal(signal.SIGKILL)
        self.wait(60)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    async def wait_exit(self, timeout_s: float) -> int:
        return await asyncio.to_thread(self.wait, timeout_s)

    def stop(self) -> None:
        """Take down whatever is left of the process group."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(pids: list[int], settle_s: float = 10.0) -> list[int]:
    """Those of `pids` still running once killed ones had `settle_s` to finish dying (a process with a
    large memory map takes a moment to go; a zombie counts as gone)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    if settle_s > 0:
        psutil.wait_procs(procs, timeout=settle_s)
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out
