"""`infercept cluster`: several gateway replicas behind HAProxy over one PostgreSQL store, on this machine,
started with one command (docs/reliability.md, Replicas).

    infercept cluster [--replicas 2] [--port 8000] [--config FILE] [--store postgresql://...] [--dir DIR]

* PostgreSQL: `--store URL`, or a local durable server under DIR/postgres (Debian's `postgresql`
  binaries; its data kept across runs, so sessions survive a restart of the whole cluster).
* N replicas: `infercept serve` processes on ports PORT+1..PORT+N, each with its own engine and state
  folder (DIR/r1, ...), all from the same config file with `server.store`, `server.replica_id` (r1, ...)
  and `server.advertise_url` set.
* HAProxy on PORT (infercept/balancer.py: a new session to the least loaded replica, each session's
  requests to its owner, health checks on /healthz).

Ctrl-C or SIGTERM stops it all: the replicas first (each drains its running turns and gives its lease
up), then the balancer and PostgreSQL. A replica that dies meanwhile is reported; its sessions are taken
over by the others once its lease lapses. `--once` stops as soon as everything answered (a smoke test).
"""

from __future__ import annotations

import asyncio
import copy
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from engine_adapter.config import read_config_doc
from engine_adapter.paths import infercept_home
from infercept.balancer import Backend, haproxy_config
from infercept.pg_local import LocalPostgres, free_port
from infercept.server_proc import ServerProcess

DATABASE = "infercept"
SYSTEM_PG_DIR = Path("/var/lib/infercept/postgres")


class Cluster:
    def __init__(self, config: str, *, replicas: int, port: int, folder: Path, store: str | None,
                 lease_s: float | None, host: str = "127.0.0.1") -> None:
        if replicas < 1:
            raise ValueError("--replicas must be at least 1")
        self.base = dict(read_config_doc(config))
        self.n, self.port, self.host, self.dir = replicas, port, host, folder
        self.store, self.lease_s = store, lease_s
        self.pg: LocalPostgres | None = None
        self.servers: list[ServerProcess] = []
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.url = f"http://{host}:{port}"

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
        if haproxy is None:
            raise ValueError("HAProxy is not installed (Debian: apt install haproxy)")
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.store is None:
            pg, why = LocalPostgres.find(self.dir / "postgres")
            if pg is None:
                raise ValueError(f"no --store URL given, and no local PostgreSQL can run: {why}")
            if not pg.reachable():
                # Run as root, PostgreSQL runs as `postgres`, which cannot enter root's home.
                pg, _ = LocalPostgres.find(SYSTEM_PG_DIR)
                assert pg is not None
                print(f"PostgreSQL's data goes to {SYSTEM_PG_DIR}: the `postgres` user cannot reach {self.dir}",
                      flush=True)
            self.pg = pg
            pg.start()
            self.store = asyncio.run(pg.create_database(DATABASE))
            print(f"PostgreSQL at {self.store} (data in {pg.data})", flush=True)
        backends = []
        for i in range(1, self.n + 1):
            name, port, agent_port = f"r{i}", self.port + i, free_port()
            cfg = self._replica_config(name, port, agent_port)
            server = ServerProcess(cfg, port, self.dir / f"{name}.log")
            server.start()
            self.servers.append(server)
            backends.append(Backend(name, "127.0.0.1", port, agent_port))
            print(f"replica {name}: {server.url} (log {server.log})", flush=True)
        cfg_path = self.dir / "haproxy.cfg"
        # HAProxy needs two descriptors per connection (client and server side) and refuses to start
        # with a maxconn its descriptor limit cannot hold.
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        maxconn = max(256, min(20000, (nofile - 200) // 2)) if nofile != resource.RLIM_INFINITY else 20000
        self.stats_port = free_port()
        cfg_path.write_text(haproxy_config(backends, bind_host=self.host, bind_port=self.port, maxconn=maxconn,
                                           stats_port=self.stats_port))
        check = subprocess.run([haproxy, "-c", "-q", "-f", str(cfg_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"HAProxy refused {cfg_path}: {check.stderr or check.stdout}")
        with open(self.dir / "haproxy.log", "ab") as out:
            self.haproxy = subprocess.Popen([haproxy, "-db", "-f", str(cfg_path)], stdout=out, stderr=subprocess.STDOUT,
                                            process_group=0)  # not a new session: see ServerProcess.start
        print(f"HAProxy: {self.url} (config {cfg_path})", flush=True)

    def _replica_config(self, name: str, port: int, agent_port: int) -> Path:
        doc: dict[str, Any] = copy.deepcopy(self.base)
        server = dict(doc.get("server") or {})
        server.update(host="127.0.0.1", port=port, store=self.store, replica_id=name, agent_port=agent_port,
                      advertise_url=f"http://127.0.0.1:{port}", state_path=str(self.dir / name / "sessions.db"))
        if self.lease_s is not None:
            server["lease_s"] = self.lease_s
        doc["server"] = server
        path = self.dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        os.chmod(path, 0o600)  # it may hold the store's URL and an API key
        return path

    async def wait_ready(self, timeout_s: float = 900.0) -> None:
        await asyncio.gather(*(s.wait_ready(timeout_s) for s in self.servers))
        deadline = time.monotonic() + 60
        stats = f"http://{self.host}:{self.stats_port}/;csv"
        async with httpx.AsyncClient(timeout=5) as c:
            while True:  # the balancer's health checks see every replica up, in every backend
                try:
                    if servers_up((await c.get(stats)).text) == 2 * len(self.servers):
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or (self.haproxy is not None and self.haproxy.poll() is not None):
                    log = (self.dir / "haproxy.log").read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"HAProxy at {self.url} does not answer; its log:\n{log}")
                await asyncio.sleep(0.25)

    # ------------------------------------------------------------------ run, stop
    def watch(self, stop: list[bool]) -> None:
        """Until SIGINT/SIGTERM: report a replica or the balancer that exits."""
        reported: set[int] = set()
        while not stop:
            for i, s in enumerate(self.servers):
                if s.proc is not None and s.proc.poll() is not None and i not in reported:
                    reported.add(i)
                    print(f"replica r{i + 1} exited ({s.proc.returncode}); its sessions go to the others once its "
                          f"lease lapses. Log: {s.log}", file=sys.stderr, flush=True)
            if self.haproxy is not None and self.haproxy.poll() is not None:
                print(f"HAProxy exited ({self.haproxy.returncode}); see {self.dir / 'haproxy.log'}", file=sys.stderr, flush=True)
                return
            time.sleep(0.5)

    def stop(self, drain_s: float = 60.0) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.signal(signal.SIGTERM)  # drain, commit, give the lease up
        for s in self.servers:
            try:
                if s.proc is not None:
                    s.wait(drain_s)
            except subprocess.TimeoutExpired:
                pass
            s.stop()  # whatever is left of its process group
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
        if self.pg is not None:
            self.pg.stop()


def _server_rows(csv: str) -> list[dict[str, str]]:
    """The server rows (not FRONTEND or BACKEND) of HAProxy's statistics (CSV), by column name."""
    lines = csv.lstrip("# ").splitlines()
    if not lines:
        return []
    cols = lines[0].split(",")
    rows = (dict(zip(cols, ln.split(","))) for ln in lines[1:])
    return [r for r in rows if r.get("svname") not in (None, "FRONTEND", "BACKEND")]


def servers_up(csv: str) -> int:
    """Servers HAProxy's statistics (CSV) report UP, over all backends."""
    return sum(1 for r in _server_rows(csv) if r.get("status") == "UP")


def server_weights(csv: str, backend: str = "new_sessions") -> dict[str, int]:
    """The current weight of each server of one backend in HAProxy's statistics (CSV): what the replicas'
    load agents last reported, as a share of the configured weight."""
    return {r["svname"]: int(r["weight"]) for r in _server_rows(csv) if r.get("pxname") == backend and r.get("weight")}


def run(args: Any) -> int:
    folder = Path(args.dir) if args.dir else infercept_home() / "cluster"
    cluster = Cluster(args.config, replicas=args.replicas, port=args.port, folder=folder, store=args.store,
                      lease_s=args.lease_s)
    stop: list[bool] = []

    def on_signal(signum: int, frame: Any) -> None:
        stop.append(True)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        t0 = time.perf_counter()
        cluster.start()
        asyncio.run(cluster.wait_ready())
        print(f"infercept cluster ready in {time.perf_counter() - t0:.1f} s: {cluster.url} "
              f"({args.replicas} replicas behind HAProxy, store {cluster.store})", flush=True)
        if not args.once:
            cluster.watch(stop)
        return 0
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        cluster.stop()


__all__ = ["Cluster", "run"]
