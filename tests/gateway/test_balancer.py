"""Two replicas behind a real HAProxy over one real PostgreSQL store, as `infercept cluster` runs them
(infercept/cluster.py, infercept/balancer.py): new sessions spread over the replicas, every later request
of a session reaches its owner (nothing forwarded), and after `kill -9` of one replica, one of its
sessions cut mid-stream, every session is served through the balancer by the other replica, with
nothing but 503s carrying Retry-After meanwhile: no session lost, every finished transcript identical,
the cut turn marked interrupted. Skipped, with the reason, without HAProxy or PostgreSQL."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.client import ApiError, AsyncClient, SessionRef
from gateway.store_pg import PostgresStore
from infercept.balancer import Backend, haproxy_config
from infercept.cluster import Cluster, server_weights, servers_up
from infercept.pg_local import free_port
from tests.gateway.test_replicas import counter
from tests.gateway.test_store_pg import db_url, pg  # noqa: F401  (fixtures)

LEASE_S = 2.0
N_SESSIONS = 6
REPO = Path(__file__).resolve().parents[2]
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)


def test_the_shipped_example_is_the_generators_output_and_haproxy_accepts_it(tmp_path: Path) -> None:
    example = REPO / "examples" / "replicas" / "haproxy.cfg"
    assert example.read_text() == haproxy_config([Backend("r1", "127.0.0.1", 8001, 9001), Backend("r2", "127.0.0.1", 8002, 9002)],
                                                 bind_port=8000)
    with pytest.raises(ValueError):
        haproxy_config([])
    if HAPROXY is None:
        pytest.skip("HAProxy is not installed (Debian: apt install haproxy): its check of the file is skipped")
    for cfg in (example.read_text(), haproxy_config([Backend("a", "10.0.0.1", 9000)], stats_port=9001, maxconn=500)):
        path = tmp_path / "h.cfg"
        path.write_text(cfg)
        check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_servers_up_reads_haproxys_statistics() -> None:
    csv = ("# pxname,svname,qcur,status,weight,\n"
           "infercept,FRONTEND,,OPEN,,\nsessions,r1,0,UP,1,\nsessions,r2,0,DOWN,1,\nsessions,BACKEND,0,UP,2,\n"
           "new_sessions,r1,0,UP,75,\nnew_sessions,r2,0,UP,100,\nnew_sessions,BACKEND,0,UP,175,\n")
    assert servers_up(csv) == 3 and servers_up("") == 0
    assert server_weights(csv) == {"r1": 75, "r2": 100} and server_weights("") == {}


def cluster_config(tmp: Path) -> str:
    path = tmp / "replica.yaml"
    path.write_text(yaml.safe_dump({
        "engine": {"model": "tiny", "policy": "infercept", "dtype": "float32", "max_model_len": 1024, "max_num_seqs": 8,
                   "num_kv_blocks": 200, "block_size": 32},
        "server": {"max_tokens": 8, "sse_ping_s": 1},
        "augmentations": {"calculator": {}},
    }))
    return str(path)


async def retrying(call, deadline_s: float = 60.0, seen: list[int] | None = None):  # type: ignore[no-untyped-def]
    """`call()` until it answers, honouring each 503's Retry-After; any other error (or a 503 without
    Retry-After) fails."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return await call()
        except ApiError as e:
            if seen is not None:
                seen.append(e.status)
            assert e.status == 503 and e.retry_after is not None, e
            assert time.monotonic() < end, f"still {e} after {deadline_s} s"
            await asyncio.sleep(min(e.retry_after, 0.5))
        except httpx.TransportError:
            assert time.monotonic() < end
            await asyncio.sleep(0.5)


async def test_sessions_stay_with_their_owner_and_survive_kill_9_of_one_replica(db_url: str, tmp_path: Path,  # noqa: F811
                                                                                uses_server: None) -> None:
    if HAPROXY is None:
        pytest.skip("HAProxy is not installed (Debian: apt install haproxy)")
    cluster = Cluster(cluster_config(tmp_path), replicas=2, port=free_port(), folder=tmp_path / "cluster",
                      store=db_url, lease_s=LEASE_S)
    store = await PostgresStore.open(db_url)
    c = AsyncClient(cluster.url)
    replicas: list[AsyncClient] = []
    try:
        cluster.start()
        await cluster.wait_ready(timeout_s=600)
        replicas = [AsyncClient(s.url) for s in cluster.servers]
        sessions = [await c.create_session(tools=[]) for _ in range(N_SESSIONS)]
        owners = {s.id: (await store.owner(s.id)).replica_id for s in sessions}  # type: ignore[union-attr]
        assert set(owners.values()) == {"r1", "r2"}, owners  # spread: the least loaded replica
        # Each replica's load agent reports its room (sessions in memory, free KV), and HAProxy weighs new
        # sessions by it: below the configured 100 once sessions are open (checked every second).
        weights: dict[str, int] = {}
        async with httpx.AsyncClient(timeout=5) as raw:
            for _ in range(40):
                weights = server_weights((await raw.get(f"http://127.0.0.1:{cluster.stats_port}/;csv")).text)
                if set(weights) == {"r1", "r2"} and all(1 <= w < 100 for w in weights.values()):
                    break
                await asyncio.sleep(0.25)
        assert set(weights) == {"r1", "r2"} and all(1 <= w < 100 for w in weights.values()), weights
        for s in sessions:
            events = [ev async for ev in c.stream_message(s, "Hello", tool_choice="none")]
            assert events[-1].name == "done"
        # The stick table sent every session's requests to its owner: nothing was forwarded.
        assert [await counter(r, "requests_forwarded") for r in replicas] == [0.0, 0.0]
        before = {s.id: (await c.get_session(s))["transcript"] for s in sessions}

        # A long turn on a session of r1, cut by kill -9 of r1 after its first tokens.
        victim = cluster.servers[0]
        for _ in range(4):  # the least loaded replica: they alternate
            cut = await c.create_session(tools=[], max_tokens=400, ignore_eos=True)
            if (await store.owner(cut.id)).replica_id == "r1":  # type: ignore[union-attr]
                break
            sessions.append(cut)
            before[cut.id] = (await c.get_session(cut))["transcript"]
        assert (await store.owner(cut.id)).replica_id == "r1"  # type: ignore[union-attr]
        sessions.append(cut)
        before[cut.id] = []
        stream = c.stream_message(cut, "Go on for a while", tool_choice="none")
        first = [ev async for ev in _until_tokens(stream, 2)]
        assert first[-1].name == "token"
        t_kill = time.monotonic()
        victim.kill9()
        victim.stop()  # its engine too
        with pytest.raises((httpx.HTTPError, ApiError)):
            async for _ in stream:
                pass

        # Through the balancer, every session is back (served by r2), with only 503 + Retry-After meanwhile.
        seen: list[int] = []
        after = {s.id: (await retrying(lambda s=s: c.get_session(s), seen=seen))["transcript"] for s in sessions}
        takeover_s = time.monotonic() - t_kill
        print(f"every session served again {takeover_s:.1f} s after kill -9 (lease {LEASE_S} s); statuses meanwhile: {seen}")
        for s in sessions:
            if s.id == cut.id:
                assert after[s.id][:len(before[s.id])] == before[s.id]
                assert after[s.id][-1]["interrupted"] is True and after[s.id][-1]["role"] == "assistant"
            else:
                assert after[s.id] == before[s.id]
            owner = await store.owner(s.id)
            assert owner is not None and owner.replica_id == "r2"
        events = await retrying(lambda: _collect(c.stream_message(cut, "And now?", tool_choice="none")))
        assert events[-1].name == "done" and next(ev for ev in events if ev.name == "resume")["restored_by"] == "recompute"
        assert set(seen) <= {503}
    finally:
        await c.aclose()
        for r in replicas:
            await r.aclose()
        cluster.stop(drain_s=30)
        await store.close()


async def _until_tokens(stream, n: int):  # type: ignore[no-untyped-def]
    got = 0
    async for ev in stream:
        yield ev
        if ev.name == "token":
            got += 1
            if got >= n:
                return
        if ev.terminal:
            return


async def _collect(stream) -> list:  # type: ignore[no-untyped-def,type-arg]
    return [ev async for ev in stream]
