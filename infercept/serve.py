"""`infercept serve`: the gateway and its embedded engine in one process tree (the engine core is vLLM's
child), and how it ends.

* SIGTERM (or SIGINT): drain. New sessions and new turns get 503 with `Retry-After` (and `/healthz`
  says "draining"), running turns get `server.drain_s` to finish, every session is committed, the
  engine stops, exit 0.
* A second SIGTERM: exit at once (status 143, as a process ended by SIGTERM), killing the engine's
  processes first so none is left behind. Nothing committed is lost: every commit is already in
  SQLite's write-ahead log; a turn in progress is marked interrupted when the sessions are read back.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import signal
import sys
import time

EXIT_FORCED = 128 + signal.SIGTERM


def _raise_open_files_limit() -> None:
    # Thousands of concurrent streams need thousands of sockets; the soft limit is often 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _exit_now() -> None:
    """The second signal: no drain, no cleanup. The engine's processes are killed first (they would
    outlive us otherwise)."""
    import psutil

    print("second signal: exiting now", file=sys.stderr, flush=True)
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(children, timeout=5)  # a process with gigabytes of KV cache takes a moment to go
    os._exit(EXIT_FORCED)


async def serve(args: argparse.Namespace) -> int:
    from aiohttp import ClientSession, web

    from engine_adapter.config import load_engine_config
    from gateway.app import create_app
    from gateway.config import load_gateway_config
    from gateway.gateway import Gateway

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("infercept").setLevel(logging.INFO)
    cfg = load_engine_config(
        args.config, model=args.model, policy=args.policy, dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
    )
    gcfg = load_gateway_config(args.config, host=args.host, port=args.port, api_key=args.api_key or os.environ.get("INFERCEPT_API_KEY"),
                               state_path=args.state_path)
    server = gcfg.server
    _raise_open_files_limit()
    gw = Gateway(cfg, gcfg)
    app = create_app(gw)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the generation.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    try:
        await runner.setup()  # the app's cleanup_ctx opens the gateway: the state folder's lock, the store
    except RuntimeError as e:  # the state folder is in use, or the store cannot open
        print(f"error: {e}", file=sys.stderr)
        return 2
    site = web.TCPSite(runner, server.host, server.port, backlog=server.backlog)
    await site.start()
    url = f"http://{server.host}:{server.port}"
    print(f"infercept gateway listening on {url} (engine starting: model={cfg.model} policy={cfg.policy}; "
          f"sessions in {gw.store.path})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            _exit_now()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    t0 = time.perf_counter()
    ready = asyncio.create_task(gw.ready.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    while gw.start_error is None and not gw.ready.is_set() and not stop.is_set():
        await asyncio.sleep(0.1)
    if gw.start_error is not None:
        print(f"error: the engine failed to start: {gw.start_error}", file=sys.stderr)
        code = 1
    elif gw.ready.is_set():
        stats = await gw.engine.stats()
        print(
            f"infercept ready in {time.perf_counter() - t0:.1f} s: {url} model={gw.engine.model_path} "
            f"policy={stats.policy} kv_blocks={stats.blocks.total} block_size={stats.block_size} "
            f"profile={stats.profile.source!r} "
            f"tools={','.join(gw.registry.names())} sessions_restored={gw.restored}",
            flush=True,
        )
        if args.once:
            async with ClientSession() as http, http.get(f"{url}/healthz") as r:
                print(f"GET /healthz -> {r.status} {await r.text()}", flush=True)
                code = 0 if r.status == 200 else 1
        else:
            await stop.wait()
            print(f"draining: new work refused, running turns get up to {server.drain_s:g} s", flush=True)
            t_drain = time.perf_counter()
            left = await gw.drain(server.drain_s)
            print(f"drained in {time.perf_counter() - t_drain:.1f} s ({left} turn(s) still running, marked "
                  f"interrupted); shutting down", flush=True)
    ready.cancel()
    stopped.cancel()
    # Streams still open end with an `error` event now (their sessions committed), so the server's own
    # shutdown does not wait on them.
    await gw.table.detach_all("shutting_down", "the server is shutting down; the session is kept: resend the "
                              "message when it is back")
    await runner.cleanup()
    print("stopped", flush=True)
    return code
