"""A PostgreSQL server run from Debian's `postgresql` binaries (`apt install postgresql`): the shared
session store of `infercept cluster` when no `--store` URL is given, and the real server the store's
tests start. It listens on loopback only, with trust authentication for one user (`infercept`), and runs
as the `postgres` user when started as root (PostgreSQL refuses to run as root). `find()` says why not,
when it cannot run here.

Two uses, one class: a durable server in a folder that outlives it (the cluster's: created once, its
data kept, stopped cleanly), or a throwaway one in a temporary folder (the tests': fsync off, stopped
at once and removed)."""

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


def bin_dir() -> Path | None:
    """Where Debian's PostgreSQL server binaries are (the newest version), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name) if Path(d).parent.name.isdigit() else 0)
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "initdb").exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    def __init__(self, bin_path: Path, run_as: str | None, folder: Path | None = None, port: int | None = None) -> None:
        self.bin_dir, self.run_as = bin_path, run_as
        self.durable = folder is not None
        self.dir = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="infercept-pg-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data = self.dir / "data"
        self.port = port or free_port()
        self.started = False
        if run_as is not None:
            pw = pwd.getpwnam(run_as)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    @staticmethod
    def find(folder: Path | None = None, port: int | None = None) -> tuple[LocalPostgres | None, str]:
        """(a server ready to start, "") or (None, why not)."""
        try:
            import asyncpg  # noqa: F401
        except ImportError:
            return None, "asyncpg is not installed (pip install 'infercept[postgres]')"
        where = bin_dir()
        if where is None:
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
        return LocalPostgres(where, run_as, folder, port), ""

    def reachable(self) -> bool:
        """Whether the user PostgreSQL runs as can write its folder (a folder under root's home is not
        reachable by the `postgres` user)."""
        if self.run_as is None:
            return os.access(self.dir, os.W_OK)
        return subprocess.run(["runuser", "-u", self.run_as, "--", "test", "-w", str(self.dir)]).returncode == 0

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stdout.decode(errors='replace')[-2000:]}")

    def start(self) -> str:
        """Create the cluster (unless a durable one exists already) and start it; the `postgres`
        database's URL."""
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8",
                      *(() if self.durable else ("--no-sync",)))
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.durable:
            opts += " -c fsync=off"  # durability against an OS crash is not what the tests check
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "-t", "60", "start")
        self.started = True
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    async def create_database(self, name: str) -> str:
        """Create `name` unless it exists; its URL."""
        import asyncpg

        admin = await asyncpg.connect(self.url("postgres"))
        try:
            if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        return self.url(name)

    def stop(self) -> None:
        if self.started:
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast" if self.durable else "immediate", "-w", "stop")
            finally:
                self.started = False
        if not self.durable:
            shutil.rmtree(self.dir, ignore_errors=True)


__all__ = ["LocalPostgres", "bin_dir", "free_port"]
