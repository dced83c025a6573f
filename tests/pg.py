"""A real PostgreSQL server for tests: Debian's `postgresql` binaries (scripts/install.sh installs them
where it can), a throwaway cluster in a temporary folder on a free loopback port, trust authentication,
fsync off (durability against an OS crash is not what the tests check). Run as the `postgres` user when
the tests run as root (PostgreSQL refuses to run as root). `PgServer.find()` says why not, when it
cannot run here, so the tests that need it skip with that reason."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "infercept"


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name) if Path(d).parent.name.isdigit() else 0)
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "initdb").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self, bin_dir: Path, run_as: str | None) -> None:
        self.bin_dir, self.run_as = bin_dir, run_as
        self.dir = Path(tempfile.mkdtemp(prefix="infercept-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.started = False
        if run_as is not None:
            pw = pwd.getpwnam(run_as)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    @staticmethod
    def find() -> tuple[PgServer | None, str]:
        """(a server ready to start, "") or (None, why not)."""
        try:
            import asyncpg  # noqa: F401
        except ImportError:
            return None, "asyncpg is not installed (pip install 'infercept[postgres]')"
        bin_dir = _bin_dir()
        if bin_dir is None:
            return None, "PostgreSQL's server binaries (initdb) are not installed (Debian: apt install postgresql)"
        run_as = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return None, "running as root and there is no `postgres` user to run PostgreSQL as"
            if shutil.which("runuser") is None:
                return None, "running as root and `runuser` is missing"
            run_as = "postgres"
        return PgServer(bin_dir, run_as), ""

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)

    def start(self) -> str:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8", "--no-sync")
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "-t", "60", "start")
        self.started = True
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.started:
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            finally:
                self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)
