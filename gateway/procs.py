"""The state folder's guards against a server that did not end cleanly.

* `StateLock`: one server per state folder (an exclusive `flock` on `<state>/lock`, released by the
  kernel however the process ends), so two servers never restore and write the same sessions.
* Engine processes: vLLM's engine core is a child process that does not notice its parent's death; after
  a `kill -9` of the server it lives on, holding its KV cache memory. The server records its child
  processes (`record_engine`) and the next start reaps those whose server is gone (`reap_orphans`),
  matching each pid's start time so a recycled pid is never touched.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path

import psutil

log = logging.getLogger("infercept.gateway")


class StateLock:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "lock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            raise RuntimeError(f"the state folder {folder} is in use by another infercept server (pid {holder}); "
                               "give this one its own server.state_path") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def _identity(pid: int) -> dict[str, float | int] | None:
    try:
        return {"pid": pid, "started": psutil.Process(pid).create_time()}
    except psutil.Error:
        return None


def record_engine(folder: Path) -> None:
    """Remember this server and its child processes (vLLM's engine core, its worker, the multiprocessing
    resource tracker): none of them ends when the server is killed."""
    children = psutil.Process().children(recursive=True)
    entry = {"server": _identity(os.getpid()), "engine": [i for i in (_identity(c.pid) for c in children) if i is not None]}
    (folder / "engine.json").write_text(json.dumps(entry))


def _same(ident: dict[str, float | int] | None) -> psutil.Process | None:
    if not ident:
        return None
    try:
        p = psutil.Process(int(ident["pid"]))
        return p if abs(p.create_time() - float(ident["started"])) < 0.01 else None
    except psutil.Error:
        return None


def reap_orphans(folder: Path) -> list[int]:
    """Kill the recorded engine processes of a server that is gone; the pids killed."""
    path = folder / "engine.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if _same(entry.get("server")) is not None:
        return []  # that server still runs (the state lock keeps a second one from getting here)
    killed: list[psutil.Process] = []
    for ident in entry.get("engine", []):
        p = _same(ident)
        if p is not None:
            try:
                p.kill()
                killed.append(p)
            except psutil.Error:
                pass
    psutil.wait_procs(killed, timeout=10)  # their memory is free before a new engine claims it
    if killed:
        log.warning("killed %d engine process(es) left behind by a server that did not shut down: %s",
                    len(killed), [p.pid for p in killed])
    path.unlink(missing_ok=True)
    return [p.pid for p in killed]
