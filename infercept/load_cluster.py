"""`infercept loadtest`'s phases over replicas (`--phases balanced,failover,rolling`): two `infercept serve`
replicas behind HAProxy over one PostgreSQL server, as `infercept cluster` runs them (a throwaway
PostgreSQL in the run's folder). Every request goes through the balancer.

* balanced: N clients connect at once, each opens a session and sends a message that must call a tool;
  no 5xx; then every session deleted and each replica's KV checked free.
* failover: N sessions, half of them mid-turn, when the replica holding most of the mid-turn ones is
  `kill -9`ed. Measured: how long until every session answers through the balancer again (the takeover,
  bounded by the lease), sessions lost, finished transcripts identical, turns cut mid-stream marked
  interrupted with what their clients saw, the next message answered, and every status seen meanwhile
  (503s must carry Retry-After; nothing else may be 5xx).
* rolling: N clients keep sending messages while each replica in turn gets SIGTERM (it drains), exits
  and is started again. Measured: sessions lost, turns completed, and every status the clients saw (503
  with Retry-After, which they honour, is the only 5xx allowed).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gateway.store_pg import PostgresStore
from infercept.cluster import Cluster
from infercept.load_clients import TIMEOUT, MidTurnClient, Outcome, percentiles, session_client, sse, tool_sessions
from infercept.pg_local import LocalPostgres
from infercept.server_proc import ServerProcess

RETRY_DEADLINE_S = 180.0
TURNS_PER_SESSION = 6  # rolling: messages per session (16 tokens each keep a session within the tiny model's context)


@dataclass
class Seen:
    """Every HTTP status the clients got through the balancer, and whether each 503 said when to retry."""

    statuses: Counter[int] = field(default_factory=Counter)
    unhinted_503: int = 0

    def add(self, status: int, retry_after: str | None) -> None:
        self.statuses[status] += 1
        if status == 503 and retry_after is None:
            self.unhinted_503 += 1

    def report(self) -> dict[str, Any]:
        return {"by_status": {str(k): v for k, v in sorted(self.statuses.items())},
                "http_5xx_not_503": sum(v for k, v in self.statuses.items() if k >= 500 and k != 503),
                "http_503_without_retry_after": self.unhinted_503}


class ClusterUnderTest:
    """PostgreSQL (throwaway), two replicas from `config`, HAProxy on `port`."""

    def __init__(self, config: Path, port: int, work: Path, lease_s: float) -> None:
        self.pg, why = LocalPostgres.find()
        if self.pg is None:
            raise RuntimeError(f"the replica phases need PostgreSQL: {why}")
        self.config, self.port, self.work, self.lease_s = config, port, work, lease_s
        self.cluster: Cluster | None = None

    async def start(self) -> Cluster:
        assert self.pg is not None
        self.pg.start()
        store = await self.pg.create_database("infercept")
        self.cluster = Cluster(str(self.config), replicas=2, port=self.port, folder=self.work / "cluster", store=store,
                               lease_s=self.lease_s)
        self.cluster.start()
        await self.cluster.wait_ready()
        return self.cluster

    async def restart(self, i: int, tag: str) -> float:
        """Start replica i again (same config and port) after it exited; seconds until the balancer sees
        it up."""
        assert self.cluster is not None
        old = self.cluster.servers[i]
        t0 = time.perf_counter()
        self.cluster.servers[i] = ServerProcess(old.config, old.port, self.work / f"r{i + 1}-{tag}.log").start()
        await self.cluster.wait_ready()
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop(drain_s=30)
        if self.pg is not None:
            self.pg.stop()


async def _request(http: aiohttp.ClientSession, method: str, url: str, seen: Seen, *, retry: bool = True,
                   deadline_s: float = RETRY_DEADLINE_S, **kw: Any) -> tuple[int, Any]:
    """One JSON request, retried on 503 (after its Retry-After) and on refused connections until
    `deadline_s`; (status, body)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            async with http.request(method, url, **kw) as r:
                seen.add(r.status, r.headers.get("Retry-After"))
                body = await r.json() if r.content_type == "application/json" else await r.text()
                if r.status == 503 and retry and time.monotonic() < end:
                    await asyncio.sleep(min(float(r.headers.get("Retry-After") or 1), 2.0))
                    continue
                return r.status, body
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
            if not retry or time.monotonic() >= end:
                raise
            await asyncio.sleep(0.5)


async def _turn(http: aiohttp.ClientSession, url: str, sid: str, token: str, content: str, seen: Seen,
                deadline_s: float = RETRY_DEADLINE_S) -> str:
    """One message streamed to its end through the balancer, resent after a 503 (Retry-After) or a cut
    connection; its terminal event ("done", "error:<type>") or "http:<status>"."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            async with http.post(f"{url}/v1/sessions/{sid}/messages", json={"content": content, "tool_choice": "none"},
                                 headers={"X-Session-Token": token}) as r:
                seen.add(r.status, r.headers.get("Retry-After"))
                if r.status == 503 and time.monotonic() < end:
                    await asyncio.sleep(min(float(r.headers.get("Retry-After") or 1), 2.0))
                    continue
                if r.status != 200:
                    return f"http:{r.status}"
                async for name, data in sse(r):
                    if name == "done":
                        return "done"
                    if name == "error":
                        kind = data.get("type")
                        # The replica went away under the turn (drained past its limit, taken over): resend.
                        if kind in ("shutting_down", "session_moved", "engine_died") and time.monotonic() < end:
                            break
                        return f"error:{kind}"
                else:
                    if time.monotonic() >= end:
                        return "cut"
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError):
            if time.monotonic() >= end:
                return "cut"
        await asyncio.sleep(0.5)


async def _open(http: aiohttp.ClientSession, url: str, seen: Seen, max_tokens: int) -> tuple[str, str]:
    status, body = await _request(http, "POST", f"{url}/v1/sessions", seen, json={"tools": [], "max_tokens": max_tokens})
    if status != 201:
        raise RuntimeError(f"opening a session through the balancer: {status} {body}")
    return body["id"], body["token"]


async def replicas_after_delete(cluster: Cluster, refs: list[tuple[str, str]], key: str) -> dict[str, Any]:
    """Every session deleted through the balancer, then each replica's engine checked: nothing running, every
    block free, the integrity check clean."""
    headers = {"Authorization": f"Bearer {key}"}
    seen = Seen()
    deleted = 0
    async with aiohttp.ClientSession(timeout=TIMEOUT, headers=headers) as http:
        for sid, token in refs:
            status, _ = await _request(http, "DELETE", f"{cluster.url}/v1/sessions/{sid}", seen,
                                       headers={"X-Session-Token": token})
            deleted += status == 204
        per_replica = {}
        for i, server in enumerate(cluster.servers):
            stats: dict[str, Any] = {}
            for _ in range(200):
                _, stats = await _request(http, "GET", f"{server.url}/v1/stats", seen)
                if stats["running"] == 0 and stats["waiting"] == 0 and stats["blocks"]["free"] == stats["blocks"]["total"]:
                    break
                await asyncio.sleep(0.25)
            per_replica[f"r{i + 1}"] = {"blocks": stats["blocks"], "integrity": stats["integrity"], "running": stats["running"],
                                        "waiting": stats["waiting"], "sessions": stats.get("sessions")}
    return {"deleted": deleted, "replicas": per_replica, "statuses": seen.report()}


# ====================================================================== phases
async def phase_balanced(cluster: Cluster, n: int, key: str) -> dict[str, Any]:
    outcomes, out = await tool_sessions(cluster.url, key, n)
    store = await PostgresStore.open(cluster.store or "")
    try:
        owners = Counter([(o.replica_id if (o := await store.owner(x.sid)) else None) for x in outcomes if x.sid])
    finally:
        await store.close()
    out["sessions_by_replica"] = {str(k): v for k, v in sorted(owners.items(), key=str)}
    out["after"] = await replicas_after_delete(cluster, [(o.sid, o.token) for o in outcomes if o.sid], key)
    return out


async def phase_failover(cut: ClusterUnderTest, n: int, key: str, long_tokens: int) -> dict[str, Any]:
    cluster = cut.cluster
    assert cluster is not None
    half = n // 2
    finished = await asyncio.gather(*(session_client(cluster.url, key, i, tool_choice="none", snapshot=True)
                                      for i in range(half)))
    mids = [MidTurnClient(cluster.url, key, i, max_tokens=long_tokens) for i in range(n - half)]
    running = [asyncio.create_task(m.run()) for m in mids]
    while not all(m.settled for m in mids):
        await asyncio.sleep(0.2)
    store = await PostgresStore.open(cluster.store or "")
    try:
        owner_of = {o.sid: (w.replica_id if (w := await store.owner(o.sid)) else None)
                    for o in [*finished, *(m.out for m in mids)] if o.sid}
        on = Counter(owner_of[m.out.sid] for m in mids if m.out.sid and m.out.kind == "unfinished")
        victim_name = max(("r1", "r2"), key=lambda r: on.get(r, 0))
        victim = cluster.servers[int(victim_name[1:]) - 1]
        engine = victim.engine_pids()
        t_kill = time.perf_counter()
        victim.kill9()
        victim.stop()  # its engine too (after a real crash, the replica's supervisor would do the same)
        mid = list(await asyncio.gather(*running))
        seen = Seen()
        lost = intact_done = intact_cut = survived = 0
        cut_mid_stream = [o for o in mid if o.kind.startswith("connection:")]
        answered_s: list[float] = []
        async with aiohttp.ClientSession(timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"}) as http:

            async def read(o: Outcome) -> tuple[Outcome, int, Any]:
                status, info = await _request(http, "GET", f"{cluster.url}/v1/sessions/{o.sid}", seen,
                                              headers={"X-Session-Token": o.token})
                answered_s.append(time.perf_counter() - t_kill)
                return o, status, info

            reads = await asyncio.gather(*(read(o) for o in [*finished, *mid] if o.sid))
            takeover_s = time.perf_counter() - t_kill
            for o, status, info in reads:
                if status != 200:
                    lost += 1
                    continue
                if o in finished:
                    intact_done += o.kind == "done" and info["transcript"] == o.info.get("transcript")
                elif o in cut_mid_stream:
                    last = info["transcript"][-1] if info["transcript"] else {}
                    intact_cut += (info["state"] == "awaiting_user" and last.get("interrupted") is True
                                   and last.get("content", "").startswith(o.seen_text))
                else:  # its turn ended before the kill, or on the surviving replica
                    survived += info["state"] == "awaiting_user"
            nxt = await asyncio.gather(*(_turn(http, cluster.url, o.sid, o.token, "And then?", seen)
                                         for o in [*finished, *mid] if o.sid))
        after_owners = Counter([(w.replica_id if (w := await store.owner(o.sid)) else None) for o in [*finished, *mid] if o.sid])
    finally:
        await store.close()
    from infercept.server_proc import alive

    return {
        "sessions_before": n, "victim": victim_name, "sessions_on_victim": sum(1 for v in owner_of.values() if v == victim_name),
        "finished_before_kill": sum(1 for o in finished if o.kind == "done"), "finished_sessions_intact": intact_done,
        "mid_turn": len(mid), "cut_mid_stream": len(cut_mid_stream), "cut_sessions_intact": intact_cut,
        "mid_turn_not_cut": len(mid) - len(cut_mid_stream), "mid_turn_not_cut_usable": survived,
        "sessions_lost": lost, "lease_s": cut.lease_s,
        "takeover_s": round(takeover_s, 2), "answered_after_kill_s": percentiles(answered_s),
        "statuses": seen.report(), "next_message": dict(Counter(nxt)),
        "next_message_done": sum(1 for x in nxt if x == "done"),
        "owners_after": {str(k): v for k, v in sorted(after_owners.items(), key=str)},
        "engine_processes_left_behind": len(alive(engine)),
    }


async def phase_rolling(cut: ClusterUnderTest, n: int, key: str) -> dict[str, Any]:
    cluster = cut.cluster
    assert cluster is not None
    seen = Seen()
    stop = asyncio.Event()
    turns: Counter[str] = Counter()
    refs: list[tuple[str, str]] = []
    async with aiohttp.ClientSession(timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"}) as http:

        sent: list[int] = []

        async def client(i: int) -> None:
            # A new session every TURNS_PER_SESSION messages, so that contexts stay within the model's.
            while True:
                sid, token = await _open(http, cluster.url, seen, max_tokens=16)
                refs.append((sid, token))
                sent.append(0)
                for k in range(TURNS_PER_SESSION):
                    turns[await _turn(http, cluster.url, sid, token, f"Message {k} of client {i}", seen)] += 1
                    sent[refs.index((sid, token))] += 1
                    if stop.is_set():
                        return
                    await asyncio.sleep(0.2)

        clients = [asyncio.create_task(client(i)) for i in range(n)]
        await asyncio.sleep(5)  # the clients under way
        restarts = []
        for i, server in enumerate(list(cluster.servers)):
            t0 = time.perf_counter()
            server.signal(signal.SIGTERM)
            code = await server.wait_exit(180)
            down_s = time.perf_counter() - t0
            up_s = await cut.restart(i, "rolled")
            restarts.append({"replica": f"r{i + 1}", "exit_code": code, "sigterm_to_exit_s": round(down_s, 1),
                             "start_to_balanced_s": round(up_s, 1)})
            await asyncio.sleep(3)
        stop.set()
        await asyncio.gather(*clients)
        lost = 0
        lengths_ok = 0
        for (sid, token), k in zip(refs, sent):
            status, info = await _request(http, "GET", f"{cluster.url}/v1/sessions/{sid}", seen, headers={"X-Session-Token": token})
            if status != 200:
                lost += 1
                continue
            done = [m for m in info["transcript"] if m["role"] == "assistant" and not m.get("interrupted")]
            lengths_ok += len(done) >= k  # every message was resent until answered
    return {"clients": n, "sessions": len(refs), "restarts": restarts, "turns": dict(turns), "turns_done": turns.get("done", 0),
            "turns_sent": sum(sent), "sessions_lost": lost, "sessions_with_every_turn": lengths_ok,
            "statuses": seen.report()}


__all__ = ["ClusterUnderTest", "phase_balanced", "phase_failover", "phase_rolling"]
