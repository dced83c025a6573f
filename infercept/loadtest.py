"""`infercept loadtest`: how the server holds up under load, hostile clients and crashes, measured on a
real `infercept serve` process (tiny model) and written to `results/reliability.json`.

Phases (`--phases`):
* sessions: N clients connect at once, each opens a session and sends a message that must call a tool
  (`tool_choice: required`), streamed to `done`. Outcomes, latency percentiles, then every session
  deleted and the engine's KV checked free again (its integrity check included).
* disconnects: M clients start a long turn and drop the connection after a few tokens. Then: no
  request left running, every block free, and every session still answers a new message.
* kill: K sessions (half mid-turn) when the server is `kill -9`ed; the same command restarts it. Counted:
  sessions back, transcripts with what the clients saw, next messages answered, engine processes reaped.
* schemathesis: `schemathesis run` against `/openapi.json` (checks not_a_server_error and
  status_code_conformance), requests counted from its HAR report by status.
* balanced, failover, rolling: two replicas behind HAProxy over PostgreSQL (infercept/load_cluster.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from infercept import load_verdict
from infercept.load_clients import (
    MidTurnClient,
    Outcome,
    check_restored,
    disconnecting_client,
    percentiles,
    raw_get,
    session_client,
    summarize,
    tool_sessions,
)
from infercept.server_proc import REPO, ServerProcess, alive, write_config

API_KEY = "loadtest-key"
MAX_MODEL_LEN = 1024
SCHEMATHESIS_TIMEOUT_S = 3600  # a hung schemathesis must not hang the load test


DISCONNECT_TURN_TOKENS = 128  # long enough to be streaming when the client drops after 3 tokens


def long_turn_tokens(max_model_len: int) -> int:
    """max_tokens of a session whose turn must still stream when the server is killed: long, but within the
    model's context, or the session is refused with a 400 and the phase measures nothing."""
    return max_model_len // 2


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


async def settle(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """The engine's accounting once nothing runs: poll /v1/stats until no request runs or waits."""
    stats: dict[str, Any] = {}
    for _ in range(600):
        stats = await raw_get(url, "/v1/stats", headers)
        if stats["running"] == 0 and stats["waiting"] == 0 and stats["turns_in_progress"] == 0:
            break
        await asyncio.sleep(0.5)
    return stats


async def delete_all(url: str, refs: list[tuple[str, str]], key: str = API_KEY) -> int:
    import aiohttp

    deleted = 0
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        for sid, token in refs:
            async with http.delete(f"{url}/v1/sessions/{sid}", headers={"X-Session-Token": token}) as r:
                deleted += r.status == 204
    return deleted


async def blocks_after_delete(url: str, refs: list[tuple[str, str]], key: str = API_KEY) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    deleted = await delete_all(url, refs, key)
    stats = await settle(url, headers)
    for _ in range(100):  # a freed request's blocks return within an engine step or two
        if stats["blocks"]["free"] == stats["blocks"]["total"]:
            break
        await asyncio.sleep(0.2)
        stats = await raw_get(url, "/v1/stats", headers)
    return {"deleted": deleted, "blocks": stats["blocks"], "all_blocks_free": stats["blocks"]["free"] == stats["blocks"]["total"],
            "integrity": stats["integrity"], "running": stats["running"], "waiting": stats["waiting"],
            "store": stats["store"]}


async def phase_sessions(server: ServerProcess, n: int, key: str = API_KEY) -> dict[str, Any]:
    outcomes, out = await tool_sessions(server.url, key, n)
    out["after"] = await blocks_after_delete(server.url, [(o.sid, o.token) for o in outcomes if o.sid], key)
    return out


async def phase_disconnects(server: ServerProcess, n: int, key: str = API_KEY, turn_tokens: int = DISCONNECT_TURN_TOKENS) -> dict[str, Any]:
    """`turn_tokens`: the sessions' max_tokens, for the dropped turn and for the message that shows the
    session still usable (kept moderate: that message runs to its end)."""
    headers = {"Authorization": f"Bearer {key}"}
    before = await raw_get(server.url, "/metrics", headers, text=True)
    outcomes = await asyncio.gather(*(disconnecting_client(server.url, key, i, max_tokens=turn_tokens) for i in range(n)))
    stats = await settle(server.url, headers)
    after = await raw_get(server.url, "/metrics", headers, text=True)
    dropped = sum(1 for o in outcomes if o.kind == "dropped")
    refs = [(o.sid, o.token) for o in outcomes if o.sid]
    # Still usable: every session answers a new message.
    usable = await asyncio.gather(*(session_client(server.url, key, i, existing=(sid, tok), tool_choice="none")
                                    for i, (sid, tok) in enumerate(refs)))
    return {
        "clients": n, "dropped_mid_stream": dropped, "outcomes": dict(Counter(o.kind for o in outcomes)),
        "server_counted_disconnects": _metric(after, "infercept_client_disconnects_total") - _metric(before, "infercept_client_disconnects_total"),
        "after_drop": {"running": stats["running"], "waiting": stats["waiting"], "turns_in_progress": stats["turns_in_progress"],
                       "blocks": stats["blocks"], "leaked_blocks": stats["blocks"]["total"] - stats["blocks"]["free"]},
        "still_usable": summarize(list(usable)),
        "after": await blocks_after_delete(server.url, refs, key),
    }


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


async def phase_kill(server: ServerProcess, n: int, log_dir: Path) -> dict[str, Any]:
    half = n // 2
    finished = await asyncio.gather(*(session_client(server.url, API_KEY, i, tool_choice={"name": "Calculator"}, snapshot=True)
                                      for i in range(half)))
    mids = [MidTurnClient(server.url, API_KEY, i, max_tokens=long_turn_tokens(MAX_MODEL_LEN)) for i in range(n - half)]
    running = [asyncio.create_task(m.run()) for m in mids]
    while not all(m.settled for m in mids):  # every one mid-turn (or already ended)
        await asyncio.sleep(0.2)
    engine = server.engine_pids()
    server.kill9()
    mid = list(await asyncio.gather(*running))
    restarted = ServerProcess(server.config, server.port, log_dir / "restarted.log").start()
    t0 = time.perf_counter()
    try:
        await restarted.wait_ready()
        restart_s = time.perf_counter() - t0
        report = await check_restored(restarted.url, API_KEY, [o for o in finished if o.kind == "done"], mid)
        report.update({"sessions_before": n, "finished_before_kill": sum(1 for o in finished if o.kind == "done"),
                       "mid_turn_at_kill": sum(1 for m in mid if m.seen_text and m.kind.startswith("connection:")),
                       "restart_to_ready_s": round(restart_s, 1), "engine_processes_left_behind": len(alive(engine))})
        return report
    finally:
        restarted.stop()


def _rss_mb(server: ServerProcess) -> float:
    """Resident memory of the server process and its children (the engine core, its worker), in MB."""
    import psutil

    assert server.proc is not None
    procs = [psutil.Process(server.proc.pid)]
    procs += procs[0].children(recursive=True)
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


async def phase_idle(server: ServerProcess, n: int, sample: int = 200, concurrency: int = 64) -> dict[str, Any]:
    """`n` sessions opened and left idle: memory before and after, every session kept in the store. Then
    `sample` of them at random: half answer their next message, one at a time (so that each time is the
    session's own: read back from the store if it hibernated, its context rebuilt, its answer streamed),
    split by whether the session was in memory or hibernated; the other half are read back with a GET.
    Beyond `server.max_sessions` sessions in memory, idle ones hibernate."""
    import random

    import aiohttp

    headers = {"Authorization": f"Bearer {API_KEY}"}
    rss0 = _rss_mb(server)
    refs: list[tuple[str, str]] = []
    failures: Counter[str] = Counter()
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=None)) as http:
        todo = iter(range(n))

        async def opener() -> None:
            for _ in todo:
                async with http.post(f"{server.url}/v1/sessions", json={"tools": [], "max_tokens": 8}) as r:
                    if r.status != 201:
                        failures[f"http:{r.status}"] += 1
                        continue
                    d = await r.json()
                    refs.append((d["id"], d["token"]))

        await asyncio.gather(*(opener() for _ in range(concurrency)))
        open_s = time.perf_counter() - t0
        rss1 = _rss_mb(server)
        stats = await raw_get(server.url, "/v1/stats", headers)
        live = (await raw_get(server.url, "/v1/sessions", headers))["sessions"]  # in memory now
        rng = random.Random(0)
        picked = rng.sample(refs, min(sample, len(refs)))
        answer, read = picked[: len(picked) // 2], picked[len(picked) // 2:]
        # The next message first, before any GET could have brought a session back into memory.
        outcomes: list[Any] = []
        first: dict[str, list[float]] = {"hibernated": [], "in_memory": []}
        whole: dict[str, list[float]] = {"hibernated": [], "in_memory": []}
        async def rehydrated() -> float:
            return _metric(await raw_get(server.url, "/metrics", headers, text=True), "infercept_sessions_rehydrated_total")

        count = await rehydrated()
        for i, ref in enumerate(answer):
            o = await session_client(server.url, API_KEY, i, existing=ref, tool_choice="none")
            outcomes.append(o)
            # One message at a time, so the counter tells whether this session was read back from the store.
            before, count = count, await rehydrated()
            where = "hibernated" if count > before else "in_memory"
            if o.kind == "done":
                whole[where].append(o.seconds)
                if o.first_token_s is not None:
                    first[where].append(o.first_token_s)
        lat: list[float] = []
        bad = 0
        for sid, token in read:
            t = time.perf_counter()
            async with http.get(f"{server.url}/v1/sessions/{sid}", headers={"X-Session-Token": token}) as r:
                bad += r.status != 200
            lat.append(time.perf_counter() - t)
        rss2 = _rss_mb(server)
    metrics = await raw_get(server.url, "/metrics", headers, text=True)
    return {
        "sessions": n, "opened": len(refs), "open_failures": dict(failures), "open_s": round(open_s, 1),
        "opened_per_s": round(len(refs) / open_s, 1) if open_s else None, "in_memory_after_open": live,
        "rss_mb": {"before": round(rss0), "after_open": round(rss1), "after_reads": round(rss2)},
        "rss_growth_mb": round(rss1 - rss0, 1), "bytes_per_session": round((rss1 - rss0) * 2**20 / max(1, len(refs))),
        "store_bytes": stats.get("store", {}).get("bytes") if isinstance(stats.get("store"), dict) else None,
        "read_back": {"sessions": len(read), "not_200": bad, "latency_s": percentiles(lat)},
        "next_message": dict(Counter(o.kind for o in outcomes)), "next_message_done": sum(1 for o in outcomes if o.kind == "done"),
        # One at a time: the time to the answer's first token, and to its end, of a session that was in
        # memory and of one that had hibernated (read back from the store, its context recomputed).
        "next_message_first_token_s": {k: percentiles(v) for k, v in first.items()},
        "next_message_s": {k: percentiles(v) for k, v in whole.items()},
        "hibernated": _metric(metrics, "infercept_sessions_hibernated_total"),
        "rehydrated": _metric(metrics, "infercept_sessions_rehydrated_total"),
    }


def phase_schemathesis(url: str, n: int, out_dir: Path, timeout_s: float = SCHEMATHESIS_TIMEOUT_S) -> dict[str, Any]:
    exe = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    har = out_dir / "schemathesis.har"
    per_op = max(50, n // 10)  # 13 operations: at least n generated requests in all
    # One worker: with two, hypothesis (its lambda-source cache, and CPython 3.11's AST recursion
    # counter under ast.parse) raced between schemathesis's threads now and then ("Runtime Error":
    # KeyError / "AST constructor recursion depth mismatch" while drawing), failing the phase on the
    # tool's own error while every request it sent had passed.
    cmd = [exe, "run", f"{url}/openapi.json", "--checks", "not_a_server_error,status_code_conformance",
           "--max-examples", str(per_op), "--header", f"Authorization: Bearer {API_KEY}", "--seed", "1",
           "--request-timeout", "120", "--workers", "1", "--report", "har", "--report-har-path", str(har),
           "--suppress-health-check", "all"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out_dir, timeout=timeout_s, check=False)
        code, stdout, timed_out = proc.returncode, proc.stdout, False
    except subprocess.TimeoutExpired as e:  # run() kills it; what it wrote so far is still reported
        code, timed_out = None, True
        stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    entries = json.loads(har.read_text())["log"]["entries"] if har.exists() else []
    statuses = Counter(e["response"]["status"] for e in entries)
    by_op = Counter(f"{e['request']['method']} {e['request']['url'].split('?')[0].replace(url, '')}" for e in entries)
    tail = stdout[-2500:]
    return {"command": " ".join(cmd).replace(API_KEY, "<key>"), "exit_code": code, "timed_out": timed_out, "timeout_s": timeout_s,
            "wall_s": round(time.perf_counter() - t0, 1), "required_requests": n,
            "requests": len(entries), "by_status": {str(k): v for k, v in sorted(statuses.items())},
            "http_5xx": sum(v for k, v in statuses.items() if k >= 500), "operations_hit": len(by_op), "summary": tail}


async def run_phase(phase: str, server: ServerProcess, args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], ServerProcess]:
    """One phase's figures, and the server the next phase uses (a fresh one after the kill phase)."""
    if phase == "sessions":
        return await phase_sessions(server, args.sessions), server
    if phase == "disconnects":
        return await phase_disconnects(server, args.disconnects), server
    if phase == "kill":
        out = await phase_kill(server, args.kill_sessions, work)
        server = ServerProcess(server.config, args.port, work / "server2.log").start()  # the phases after run on a fresh one
        await server.wait_ready()
        return out, server
    if phase == "schemathesis":
        return await asyncio.to_thread(phase_schemathesis, server.url, args.schemathesis, work), server
    if phase == "idle":
        return await phase_idle(server, args.idle_sessions), server
    raise ValueError(f"unknown phase {phase!r}")


CLUSTER_PHASES = ("balanced", "failover", "rolling")


async def run_cluster_phases(phases: list[str], cfg: Path, args: argparse.Namespace, work: Path,
                             result: dict[str, Any]) -> None:
    """The replica phases, on one cluster (a replica killed by the failover phase is started again)."""
    from infercept.load_cluster import ClusterUnderTest, phase_balanced, phase_failover, phase_rolling

    cut = ClusterUnderTest(cfg, args.port + 10, work, args.lease_s)
    try:
        await cut.start()
        for phase in phases:
            print(f"[loadtest] {phase} ...", flush=True)
            t0 = time.perf_counter()
            cluster = cut.cluster
            assert cluster is not None
            try:
                if phase == "balanced":
                    out = await phase_balanced(cluster, args.sessions, API_KEY)
                elif phase == "failover":
                    out = await phase_failover(cut, args.kill_sessions, API_KEY, long_turn_tokens(MAX_MODEL_LEN))
                else:
                    out = await phase_rolling(cut, args.rolling_clients, API_KEY)
            except Exception as e:  # noqa: BLE001 (a phase that crashed fails, and the others still run)
                out = {"error": f"{type(e).__name__}: {e}"}
            for i, server in enumerate(cluster.servers):  # the next phase gets both replicas
                if server.proc is None or server.proc.poll() is not None:
                    server.stop()
                    await cut.restart(i, f"after-{phase}")
            record(result, phase, out, t0)
    finally:
        cut.stop()


def record(result: dict[str, Any], phase: str, out: dict[str, Any], t0: float) -> None:
    """A finished phase: its time and verdict, into the result and onto the console."""
    out["phase_s"] = round(time.perf_counter() - t0, 1)
    out["verdict"] = load_verdict.judge(phase, out)
    result["phases"][phase] = out
    print(f"[loadtest] {phase}: {json.dumps(out)[:600]}", flush=True)
    print(load_verdict.line(phase, out["verdict"]), flush=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    all_phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    phases = [p for p in all_phases if p not in CLUSTER_PHASES]
    work = Path(tempfile.mkdtemp(prefix="infercept-load-"))
    n_max = max(args.sessions, args.disconnects, args.kill_sessions) + 64
    cfg = write_config(work / "serve.yaml", port=args.port, state_path=str(work / "state" / "sessions.db"),
                       engine={"max_num_seqs": 64, "max_model_len": MAX_MODEL_LEN, "num_kv_blocks": None, "kv_cache_gib": 2,
                               "block_size": None},
                       server={"api_key": API_KEY, "max_sessions": n_max, "max_queued_turns": n_max, "max_tokens": 16},
                       augmentations={"calculator": {}, "human": {}})
    result: dict[str, Any] = {
        "command": "infercept loadtest " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["loadtest"] else sys.argv[1:]),
        "commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "server_config": yaml.safe_load(cfg.read_text()), "phases": {},
    }
    cluster_phases = [p for p in all_phases if p in CLUSTER_PHASES]
    if cluster_phases:
        await run_cluster_phases(cluster_phases, cfg, args, work, result)
    if not phases:
        return result
    server = ServerProcess(cfg, args.port, work / "server.log").start()
    try:
        await server.wait_ready()
        for i, phase in enumerate(phases):
            print(f"[loadtest] {phase} ...", flush=True)
            t0 = time.perf_counter()
            try:
                out, server = await run_phase(phase, server, args, work)
            except Exception as e:  # noqa: BLE001 (a phase that crashed fails, and the others still run)
                out = {"error": f"{type(e).__name__}: {e}"}
                if server.proc is None or server.proc.poll() is not None:  # the server went down with it
                    server.stop()
                    server = ServerProcess(cfg, args.port, work / f"server-after-{i}-{phase}.log").start()
                    await server.wait_ready()
            record(result, phase, out, t0)
    finally:
        server.stop()
    result["server_log_tail"] = server.log_tail(1500)
    return result


def main(args: argparse.Namespace) -> int:
    result = asyncio.run(run(args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    verdicts = {name: p["verdict"] for name, p in result["phases"].items()}
    for name, v in verdicts.items():
        print(load_verdict.line(name, v))
    ok = bool(verdicts) and all(v["pass"] for v in verdicts.values())
    print(f"[loadtest] {'PASS' if ok else 'FAIL'}: {sum(v['pass'] for v in verdicts.values())} of {len(verdicts)} phases passed")
    return 0 if ok else 1
