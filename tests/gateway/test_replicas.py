"""Two gateway replicas as real processes (`infercept serve`, each with its own tiny engine) over one real
PostgreSQL store: a request for a session the other replica owns is forwarded to it; a replica that
stops (SIGSTOP: a pause, a partition) loses its sessions to the first request that reaches the other
replica once its lease lapses (the session read back from the store, its KV recomputed); when it wakes up
its writes to that session are fenced, so it stops serving it and forwards to the new owner; and a
`kill -9` of the owner loses nothing that was finished. Skipped, with the reason, where PostgreSQL cannot
run."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.client import ApiError, AsyncClient, SessionRef
from infercept.server_proc import ServerProcess, free_port, write_config
from tests.gateway.test_store_pg import db_url, pg  # noqa: F401  (fixtures)

LEASE_S = 2.0


@dataclass
class Replica:
    name: str
    server: ServerProcess
    client: AsyncClient

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self.server.proc is not None
        return self.server.proc


def start(name: str, store: str, tmp: Path) -> Replica:
    port = free_port()
    cfg = write_config(tmp / f"{name}.yaml", port=port, state_path=str(tmp / name / "sessions.db"),
                       engine={"max_model_len": 1024, "max_num_seqs": 8, "num_kv_blocks": 200},
                       server={"store": store, "replica_id": name, "lease_s": LEASE_S, "max_tokens": 8, "sse_ping_s": 1},
                       augmentations={"calculator": {}})
    server = ServerProcess(cfg, port, tmp / f"{name}.log").start()
    return Replica(name, server, AsyncClient(server.url))


@pytest_asyncio.fixture
async def replicas(db_url: str, tmp_path: Path, uses_server: None) -> AsyncIterator[tuple[Replica, Replica]]:  # noqa: F811
    a, b = start("a", db_url, tmp_path), start("b", db_url, tmp_path)
    try:
        await asyncio.gather(a.server.wait_ready(300), b.server.wait_ready(300))
        yield a, b
    finally:
        for r in (a, b):
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)
            r.server.stop()  # the whole process group: its engine too
            await r.client.aclose()


async def turn(client: AsyncClient, s: SessionRef, content: str) -> list:  # type: ignore[type-arg]
    return [ev async for ev in client.stream_message(s, content, tool_choice="none")]


async def counter(client: AsyncClient, name: str) -> float:
    """A Prometheus counter's value from a replica's /metrics."""
    for line in (await client.metrics()).splitlines():
        if line.startswith(f"infercept_{name}_total "):
            return float(line.split()[1])
    raise AssertionError(f"no counter infercept_{name}_total")


async def wait_lapsed(owner: Replica) -> None:
    """Until the stopped replica's lease has lapsed (twice the lease: the database's clock decides)."""
    await asyncio.sleep(2 * LEASE_S)


async def test_forwarding_takeover_fencing_and_kill_9(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    # Not stored anywhere: 404 on both; a wrong token: 403, from the replica that does not serve it too;
    # a session ended through the other replica is gone from both.
    gone = await a.client.create_session(tools=[])
    for r in (a, b):
        with pytest.raises(ApiError) as e:
            await r.client.get_session(SessionRef("sess-nope", "x"))
        assert e.value.status == 404
        with pytest.raises(ApiError) as e:
            await r.client.get_session(SessionRef(gone.id, "wrong-token"))
        assert e.value.status == 403
    await b.client.close_session(gone)
    for r in (a, b):
        with pytest.raises(ApiError) as e:
            await r.client.get_session(gone)
        assert e.value.status == 404

    s = await a.client.create_session(tools=[])
    first = await turn(a.client, s, "Hello there")
    assert first[-1].name == "done"

    # Through the other replica: forwarded to the owner, the stream passed through unchanged.
    forwarded = await counter(b.client, "requests_forwarded")
    second = await turn(b.client, s, "Tell me more")
    assert second[-1].name == "done" and not any(ev.name == "resume" and ev.data.get("after") == "restart" for ev in second)
    assert await counter(b.client, "requests_forwarded") == forwarded + 1
    info = await a.client.get_session(s)
    assert [m["role"] for m in info["transcript"]] == ["user", "assistant"] * 2
    assert await b.client.get_session(s) == info  # forwarded too

    # "a" stops answering and heartbeating; once its lease lapses, "b" takes the session over.
    a.proc.send_signal(signal.SIGSTOP)
    await wait_lapsed(a)
    third = await turn(b.client, s, "Still there?")
    resume = next(ev for ev in third if ev.name == "resume")
    assert resume["restored_by"] == "recompute" and third[-1].name == "done"
    taken = await b.client.get_session(s)
    assert taken["transcript"][:4] == info["transcript"] and len(taken["transcript"]) == 6
    assert await counter(b.client, "sessions_taken_over") == 1

    # "a" wakes up still serving its copy: its next write is fenced, it lets the session go, and from
    # then on forwards it to "b". Nothing of its fenced turn reaches the store.
    a.proc.send_signal(signal.SIGCONT)
    stale = await turn(a.client, s, "A stale owner speaks")
    assert stale[-1].name == "error" and stale[-1]["type"] == "session_moved", [ev.name for ev in stale]
    assert await a.client.get_session(s) == taken
    assert await counter(a.client, "sessions_fenced") == 1
    fourth = await turn(a.client, s, "Via a again")  # forwarded to "b"
    assert fourth[-1].name == "done"
    finished = await b.client.get_session(s)
    assert finished["transcript"][:6] == taken["transcript"] and len(finished["transcript"]) == 8

    # kill -9 of the owner: after its lease lapses, "a" serves the session with everything "b" finished.
    b.server.kill9()  # the server process alone, as a crash: its engine is orphaned
    await wait_lapsed(b)
    after = await a.client.get_session(s)
    assert after["transcript"] == finished["transcript"]
    fifth = await turn(a.client, s, "Back on a")
    assert next(ev for ev in fifth if ev.name == "resume")["restored_by"] == "recompute" and fifth[-1].name == "done"

