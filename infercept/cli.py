"""The `infercept` command.

    infercept model prepare [--name default|tiny] [--force]
    infercept serve [--config FILE] [--model default|tiny|PATH|HUB_ID] [--policy NAME] [--host H] [--port P] [--api-key KEY] [--once]
    infercept bench-overhead [--model ...] [--rounds N] [--requests N] [--out FILE]
    infercept simulate [--quick | --validate BENCH_JSON | --paper | --sessions N] [...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from engine_adapter.policy import POLICY_NAMES

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def _engine_env() -> None:
    # tokenizers' thread pool fights vLLM's workers for the cores.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from engine_adapter.models import ModelError, prepare

    try:
        t0 = time.perf_counter()
        path = prepare(args.name, force=args.force)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model {args.name!r} ready at {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


async def _serve(args: argparse.Namespace) -> int:
    """The gateway and its embedded engine in one process tree (the engine core is vLLM's child)."""
    import logging

    from aiohttp import ClientSession, web

    from engine_adapter.config import load_engine_config
    from gateway.app import create_app
    from gateway.config import load_gateway_config
    from gateway.state import Gateway

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("infercept").setLevel(logging.INFO)
    cfg = load_engine_config(
        args.config, model=args.model, policy=args.policy, dtype=args.dtype, kv_cache_gib=args.kv_cache_gib,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
    )
    gcfg = load_gateway_config(args.config, host=args.host, port=args.port, api_key=args.api_key or os.environ.get("INFERCEPT_API_KEY"))
    gw = Gateway(cfg, gcfg)
    app = create_app(gw)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts the generation.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, gcfg.server.host, gcfg.server.port)
    await site.start()
    url = f"http://{gcfg.server.host}:{gcfg.server.port}"
    print(f"infercept gateway listening on {url} (engine starting: model={cfg.model} policy={cfg.policy})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
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
            f"tools={','.join(gw.registry.names())}",
            flush=True,
        )
        if args.once:
            async with ClientSession() as http, http.get(f"{url}/healthz") as r:
                print(f"GET /healthz -> {r.status} {await r.text()}", flush=True)
                code = 0 if r.status == 200 else 1
        else:
            await stop.wait()
    ready.cancel()
    stopped.cancel()
    await runner.cleanup()
    return code


def _cmd_bench_overhead(args: argparse.Namespace) -> int:
    from engine_adapter.bench_overhead import Workload, run

    w = Workload(requests=args.requests, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens)
    result = asyncio.run(run(args.model, args.rounds, w, args.dtype, Path(args.out) if args.out else None))
    return 0 if result["ratio_of_medians"] > 0 else 1


def _cmd_profile(args: argparse.Namespace) -> int:
    from engine_adapter.policy.profile import profile_path
    from engine_adapter.profiler import run_profile

    grid = tuple(int(x) for x in args.grid.split(","))
    if not grid or any(n < 1 for n in grid) or list(grid) != sorted(set(grid)):
        print("error: --grid must be increasing positive token counts, e.g. 16,64,256", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None
    if out is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        out = profile_path(DEFAULT_CONFIG.parent / "profiles", args.model, device)
    asyncio.run(run_profile(args.model, args.dtype, grid, args.repeats, out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infercept", description="Serving for tool-using LLM agents (InferCept on vLLM)")
    sub = p.add_subparsers(dest="cmd", required=True)

    model = sub.add_parser("model", help="offline models")
    msub = model.add_subparsers(dest="model_cmd", required=True)
    prep = msub.add_parser("prepare", help="build a built-in model into $INFERCEPT_HOME")
    prep.add_argument("--name", choices=("default", "tiny"), default="default")
    prep.add_argument("--force", action="store_true", help="rebuild even if a verified copy exists")
    prep.set_defaults(func=_cmd_model_prepare)

    serve = sub.add_parser("serve", help="start the HTTP gateway with its embedded engine")
    serve.add_argument("--config", default=str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else None)
    serve.add_argument("--model", help="default | tiny | a local HF folder | a hub id")
    serve.add_argument("--policy", choices=POLICY_NAMES)
    serve.add_argument("--dtype", help="auto (default) | bfloat16 | float16 | float32")
    serve.add_argument("--kv-cache-gib", type=float)
    serve.add_argument("--max-num-seqs", type=int)
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes (or INFERCEPT_API_KEY)")
    serve.add_argument("--once", action="store_true", help="exit after the readiness check")
    serve.set_defaults(func=lambda a: asyncio.run(_serve(a)))

    prof = sub.add_parser("profile", help="measure T_fwd, S, M and swap bandwidth; write a JSON profile")
    prof.add_argument("--model", default="default")
    prof.add_argument("--dtype", default="auto", help="auto: bfloat16 where the device computes it natively, else float32")
    prof.add_argument("--grid", default="16,32,64,128,256,384,512,768,1024,1536,2048")
    prof.add_argument("--repeats", type=int, default=3)
    prof.add_argument("--out", help="default: configs/profiles/<model>-<device>.json (the engine loads it)")
    prof.set_defaults(func=_cmd_profile)

    bench = sub.add_parser("bench-overhead", help="stock vLLM vs the intercept engine, no intercepts")
    bench.add_argument("--model", default="default")
    bench.add_argument("--dtype", default="auto", help="auto: bfloat16 where the device computes it natively, else float32")
    bench.add_argument("--rounds", type=int, default=5)
    bench.add_argument("--requests", type=int, default=32)
    bench.add_argument("--prompt-tokens", type=int, default=128)
    bench.add_argument("--output-tokens", type=int, default=64)
    bench.add_argument("--out", default="results/bench_overhead.json")
    bench.set_defaults(func=_cmd_bench_overhead)
    bench = sub.add_parser("bench", help="the paper's evaluation: policies side by side over request rates")
    bench.add_argument("--workload", default="mixed", choices=("mixed", "qa", "chatbot"))
    bench.add_argument("--policies", help="comma-separated (default: all; --quick: discard,vllm-apc,infercept,no-intercept-limit)")
    bench.add_argument("--rates", help="requests/s, comma-separated (default 3,6,9,12; --quick 4)")
    bench.add_argument("--duration", type=float, help="seconds of arrivals per rate (default 10; --quick 6)")
    bench.add_argument("--time-scale", type=float, help="multiply call durations (default 0.1; --quick 0.02)")
    bench.add_argument("--kv-tokens", type=int, help="KV cache size in tokens (default 24576)")
    bench.add_argument("--link-gbps", type=float, help="emulated swap link GB/s (default 0.25; 0 = off)")
    bench.add_argument("--model", help="default: tiny (see benchmarks/runner.py for why)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--slo-factor", type=float, default=5.0)
    bench.add_argument("--quick", action="store_true", help="a 3-minute smoke run (what CI runs)")
    bench.add_argument("--out", default="results/bench")
    bench.set_defaults(func=_cmd_bench)

    from benchmarks.sim.cli import add_arguments as add_simulate_arguments

    sim = sub.add_parser("simulate", help="discrete-event simulator on the engine's own policy code (no engine, no GPU)")
    add_simulate_arguments(sim)
    sim.set_defaults(func=_cmd_simulate)
    return p


def _cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.runner import main as bench_main

    return bench_main(args)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from benchmarks.sim.cli import main as simulate_main

    return simulate_main(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _engine_env()
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # configuration errors
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
