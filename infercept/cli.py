"""The `infercept` command.

    infercept model prepare [--name default|tiny] [--force]
    infercept serve [--config FILE] [--model default|tiny|PATH|HUB_ID] [--policy NAME] [--host H] [--port P] [--api-key KEY] [--once]
    infercept bench-overhead [--model ...] [--rounds N] [--requests N] [--out FILE]
    infercept loadtest [--sessions N] [--disconnects N] [--schemathesis N] [--out results/reliability.json]
    infercept simulate [--quick | --validate BENCH_JSON | --paper | --sessions N] [...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from engine_adapter.paths import shipped_config
from engine_adapter.policy import POLICY_NAMES

CONFIG_HELP = "YAML config (default: the shipped default.yaml, infercept.configs)"


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


def _cmd_cluster(args: argparse.Namespace) -> int:
    from infercept.cluster import run

    return run(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from infercept.serve import serve

    return asyncio.run(serve(args))


def _cmd_bench_overhead(args: argparse.Namespace) -> int:
    from engine_adapter.bench_overhead import Workload, run

    w = Workload(requests=args.requests, prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens)
    result = asyncio.run(run(args.model, args.rounds, w, args.dtype, Path(args.out) if args.out else None))
    return 0 if result["ratio_of_medians"] > 0 else 1


def _cmd_profile(args: argparse.Namespace) -> int:
    from engine_adapter.paths import user_profiles_dir
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
        out = profile_path(user_profiles_dir(), args.model, device)
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
    serve.add_argument("--config", help=CONFIG_HELP)
    serve.add_argument("--model", help="default | tiny | a local HF folder | a hub id")
    serve.add_argument("--policy", choices=POLICY_NAMES)
    serve.add_argument("--dtype", help="auto (default) | bfloat16 | float16 | float32")
    serve.add_argument("--kv-cache-gib", type=float)
    serve.add_argument("--max-num-seqs", type=int)
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes (or INFERCEPT_API_KEY)")
    serve.add_argument("--state-path", help="the session store (SQLite file; ':memory:' keeps nothing across restarts)")
    serve.add_argument("--once", action="store_true", help="exit after the readiness check")
    serve.set_defaults(func=_cmd_serve)

    cluster = sub.add_parser("cluster", help="several replicas behind HAProxy over one PostgreSQL store, on this machine")
    cluster.add_argument("--config", help=CONFIG_HELP + "; every replica's")
    cluster.add_argument("--replicas", type=int, default=2)
    cluster.add_argument("--port", type=int, default=8000, help="the balancer's; replicas take the next ports")
    cluster.add_argument("--store", help="a postgresql:// URL (default: a local PostgreSQL under --dir)")
    cluster.add_argument("--dir", help="state of the replicas and the local PostgreSQL (default $INFERCEPT_HOME/cluster)")
    cluster.add_argument("--lease-s", type=float, help="the replicas' lease (server.lease_s)")
    cluster.add_argument("--once", action="store_true", help="exit once every part answered")
    cluster.set_defaults(func=_cmd_cluster)

    prof = sub.add_parser("profile", help="measure T_fwd, S, M and swap bandwidth; write a JSON profile")
    prof.add_argument("--model", default="default")
    prof.add_argument("--dtype", default="auto", help="auto: bfloat16 where the device computes it natively, else float32")
    prof.add_argument("--grid", default="16,32,64,128,256,384,512,768,1024,1536,2048")
    prof.add_argument("--repeats", type=int, default=3)
    prof.add_argument("--out", help="default: $INFERCEPT_HOME/profiles/<model>-<device>.json (the engine loads it first)")
    prof.set_defaults(func=_cmd_profile)

    tools = sub.add_parser("tools", help="list the tools, or run one alone (no model) and print its observation as JSON")
    tsub = tools.add_subparsers(dest="tools_cmd", required=True)
    tlist = tsub.add_parser("list", help="the tools, their types and settings")
    tlist.add_argument("--config", help=CONFIG_HELP)
    trun = tsub.add_parser("run", help="run one tool: infercept tools run calculator '29*13'")
    trun.add_argument("name", help="a tool's name or config key (calculator, Wikipedia, alfworld, image, tts, ...)")
    trun.add_argument("arguments", help="the argument text the model would write between the brackets")
    trun.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one of the tool's settings (repeatable)")
    trun.add_argument("--config", help=CONFIG_HELP)
    trun.add_argument("--session", default="cli", help="session id (tools with per-session state, e.g. ALFWorld)")
    trun.add_argument("--out-dir", default="tool-output", help="where artifacts (images, audio) are written")
    tools.set_defaults(func=_cmd_tools)

    bench = sub.add_parser("bench-overhead", help="stock vLLM vs the intercept engine, no intercepts")
    bench.add_argument("--model", default="default")
    bench.add_argument("--dtype", default="auto", help="auto: bfloat16 where the device computes it natively, else float32")
    bench.add_argument("--rounds", type=int, default=5)
    bench.add_argument("--requests", type=int, default=32)
    bench.add_argument("--prompt-tokens", type=int, default=128)
    bench.add_argument("--output-tokens", type=int, default=64)
    bench.add_argument("--out", default="results/bench_overhead.json")
    bench.set_defaults(func=_cmd_bench_overhead)
    bench = sub.add_parser("bench", help="the paper's evaluation: policies side by side over request rates and seeds")
    bench.add_argument("--workload", default="mixed", choices=("mixed", "qa", "chatbot"))
    bench.add_argument("--policies", help="comma-separated, POLICY or POLICY@PRIORS; the bound unlimited-kv is always added "
                       "(default: discard,vllm-apc,vllm-offload,continuum,preserve,swap,infercept-paper,infercept and infercept's rows with "
                       "the other priors; --quick: discard,vllm-apc,infercept)")
    bench.add_argument("--priors", default="generic", help="duration priors of every estimator: generic (default: the same "
                       "guess for every type, learned online) | table1 (the workload's own: an oracle) | x0.3 | x3 (misspecified)")
    bench.add_argument("--rates", help="the rate grid, requests/s, comma-separated (default 3,6,9,12; --quick 4)")
    bench.add_argument("--refine", type=int, help="bisection rounds per policy and seed after the grid (default 2; --quick 0)")
    bench.add_argument("--rel-tol", type=float, default=0.1, help="bisection stops when knee and first failure are this close")
    bench.add_argument("--seeds", help="workload seeds, comma-separated (default 1,2,3; --quick 1)")
    bench.add_argument("--duration", type=float, help="seconds of arrivals per rate (default 30; --quick 6)")
    bench.add_argument("--time-scale", type=float, help="multiply call durations (default 0.1; --quick 0.02)")
    bench.add_argument("--kv-tokens", type=int, help="KV cache size in tokens (default 24576)")
    bench.add_argument("--link-gbps", type=float, help="emulated swap link GB/s (default 0.25; 0 = off)")
    bench.add_argument("--host-gib", type=float, help="host memory for KV of every policy with a host tier (swap, the "
                       "infercept policies, vllm-offload), GiB (default 1.0)")
    bench.add_argument("--token-budget", type=int, help="S, the budget of every engine not piloted (default: the profile's S)")
    bench.add_argument("--no-pilot", action="store_true", help="skip the budget pilot (every policy at S, 2S, vLLM's default)")
    bench.add_argument("--pilot-rates", help="rates of the budget pilot (default: the middle of the grid)")
    bench.add_argument("--profile", help="the tiny model's profile to use (default: a full run measures one on this machine)")
    bench.add_argument("--ablation", action="store_true", help="also the paper's Fig. 3 ablation, step by step")
    bench.add_argument("--model", help="default: tiny (see benchmarks/runner.py for why)")
    bench.add_argument("--slo-factor", type=float, default=5.0)
    bench.add_argument("--ttft-factor", type=float, default=10.0,
                       help="a rate passes only if new requests' p99 time to first token, and resumed turns' p99 wait "
                       "for their next token, are within this x the unloaded TTFT p90 (0: off)")
    bench.add_argument("--allow-other-machine", action="store_true", help="resume a run whose earlier points ran on "
                       "other hardware (refused without it: the knees would compare the machines)")
    bench.add_argument("--quick", action="store_true", help="a 3-minute smoke run (what CI runs)")
    bench.add_argument("--out", default="results/bench")
    bench.add_argument("--report", metavar="BENCH_JSON", help="print a finished run's headline as the docs' markdown "
                       "table (best peer picked from the data) and exit; measures nothing. Given a run's --out folder: "
                       "what its points say so far (a run under way or stopped)")
    bench.add_argument("--rejudge", action="store_true", help="with --report: judge the run's points by this version's "
                       "SLO rules (a run made before resumed turns were bounded gets the bound its TTFT rule had)")
    bench.set_defaults(func=_cmd_bench)

    load = sub.add_parser("loadtest", help="reliability under load and faults: concurrent sessions, disconnects, "
                          "kill -9, schemathesis; writes results/reliability.json")
    load.add_argument("--sessions", type=int, default=2000, help="sessions, balanced: concurrent sessions, all connecting at once")
    load.add_argument("--disconnects", type=int, default=1000, help="clients that drop their stream mid-turn")
    load.add_argument("--kill-sessions", type=int, default=200, help="kill, failover: sessions when a server is killed -9 (half of them mid-turn)")
    load.add_argument("--schemathesis", type=int, default=1000, help="generated requests at least (0: skip)")
    load.add_argument("--idle-sessions", type=int, default=100000, help="idle: sessions opened and left idle")
    load.add_argument("--rolling-clients", type=int, default=50, help="rolling: clients sending messages through restarts")
    load.add_argument("--lease-s", type=float, default=5.0, help="the replicas' lease (balanced, failover, rolling)")
    load.add_argument("--phases", default="sessions,disconnects,kill,schemathesis",
                      help="any of sessions, disconnects, kill, schemathesis, idle (one server), balanced, failover, rolling "
                           "(two replicas behind HAProxy over PostgreSQL)")
    load.add_argument("--out", default="results/reliability.json")
    load.add_argument("--port", type=int, default=8765)
    load.set_defaults(func=_cmd_loadtest)

    from infercept.benchmarks.sim.cli import add_arguments as add_simulate_arguments

    sim = sub.add_parser("simulate", help="discrete-event simulator on the engine's own policy code (no engine, no GPU)")
    add_simulate_arguments(sim)
    sim.set_defaults(func=_cmd_simulate)
    return p


def _cmd_tools(args: argparse.Namespace) -> int:
    from infercept.tools_cmd import main as tools_main

    return tools_main(args)


def _cmd_loadtest(args: argparse.Namespace) -> int:
    from infercept.loadtest import main as loadtest_main

    return loadtest_main(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.report:
        from infercept.benchmarks.report import main as report_main

        return report_main(args.report, rejudge_points=args.rejudge)
    if args.rejudge:
        print("error: --rejudge goes with --report BENCH_JSON", file=sys.stderr)
        return 2
    from infercept.benchmarks.runner import main as bench_main

    return bench_main(args)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from infercept.benchmarks.sim.cli import main as simulate_main

    return simulate_main(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _engine_env()
    try:
        if getattr(args, "config", "") is None:  # the shipped config; a missing one is an error naming it
            args.config = str(shipped_config("default.yaml"))
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # configuration errors
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
