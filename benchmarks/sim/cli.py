"""`infercept simulate`: the discrete-event simulator (see benchmarks/sim/__init__.py).

    infercept simulate --quick                                    # < 1 minute: 4 policies, 3 rates, GPT-J on an A100
    infercept simulate --validate results/bench/bench.json        # replay a bench run, compare max rates at the SLO
        [--decode-grid results/sim/decode_context/decode.json]    # decode steps over batch x context on the bench machine
        [--cache-cliff]                                           # and the cache cliff fitted on them
    infercept simulate --paper [--model gptj-6b|llama2-70b]       # the paper's Figure 2 setting, every policy
    infercept simulate --sessions 10000 --profile gptj-6b --workload mixed   # sessions one device sustains
                                                                  # (--profile: a name or its file under configs/profiles/)
    infercept simulate --sensitivity [--seeds 1,2,3]               # the bench setting over device KV x link
        [--cost-from BENCH_JSON]                                  # from that run's profile and fitted costs
    infercept simulate --like results/bench/mixed/bench.json --policies a,b --rates 4,5,6   # a bench's setting and SLO
    infercept simulate --profile P --policies a,b --rates 1,2 --duration 300  # any sweep
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

QUICK_POLICIES = ("discard", "vllm-apc", "infercept", "unlimited-kv")


def add_arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--validate", metavar="BENCH_JSON", help="replay a benchmark run and compare each policy's max rate at the SLO")
    mode.add_argument("--like", metavar="BENCH_JSON", help="sweep --policies at --rates and --seeds in a benchmark run's setting, "
                      "judged by its measured SLO (explore a policy before the engine confirms it)")
    mode.add_argument("--paper", action="store_true", help="the paper's Figure 2 setting on a derived GPU profile, all policies")
    mode.add_argument("--sessions", type=int, metavar="N", help="capacity planning: concurrent sessions sustained at the SLO, up to N")
    mode.add_argument("--quick", action="store_true", help="a short sweep (under a minute; what CI runs)")
    mode.add_argument("--sensitivity", action="store_true",
                      help="the benchmark's setting at device KV x0.5/1/2/4 and a link of 0.1/0.25/1 GB/s, every simulated policy")
    p.add_argument("--profile", default="gptj-6b", help="gptj-6b | llama2-70b | a profile JSON path (default gptj-6b)")
    p.add_argument("--model", choices=("gptj-6b", "llama2-70b"), help="--paper: which of the paper's settings (default gptj-6b)")
    p.add_argument("--workload", choices=("mixed", "qa", "chatbot"),
                   help="default mixed (--sensitivity --cost-from: the bench's)")
    p.add_argument("--policies", help="comma-separated policy labels (default: all for --paper and --validate)")
    p.add_argument("--rates", help="requests/s, comma-separated")
    p.add_argument("--duration", type=float, help="seconds of arrivals per rate")
    p.add_argument("--drain", type=float, help="seconds after the last arrival before the cutoff")
    p.add_argument("--link-gbps", type=float, help="--paper, --quick and sweeps on a derived GPU profile: the host link swaps go over, GB/s (default: the profile's PCIe rate, "
                                                   "25.2 GB/s on the A100 profiles); --like: in place of the bench's link (a what-if)")
    p.add_argument("--seeds", help="comma-separated workload seeds (default 1,2,3 as the bench; --quick and --sessions: 1)")
    p.add_argument("--token-budget", type=int,
                   help="max tokens per step (max_num_batched_tokens) for every policy (default: S from the profile; "
                        "--validate: each policy's own from the bench.json)")
    p.add_argument("--decode-context-share", type=float,
                   help="measured CPU profiles: share of the decode step beyond T_fwd that grows with context (default 0)")
    p.add_argument("--decode-grid", metavar="JSON",
                   help="--validate (and --like, --sensitivity --cost-from): decode steps over batch x context measured on the bench's machine "
                        "(results/sim/decode_context/decode.json); the CPU's cache cliff is fitted on them")
    p.add_argument("--cache-cliff", action="store_true",
                   help="with --decode-grid: also charge the cache cliff fitted on the grid (a step reading "
                        "more KV than its threshold costs the fitted jump more)")
    p.add_argument("--host-overhead-us", type=float,
                   help="--validate, --like, --sensitivity --cost-from: host time per held request per step, in us (default: fitted on --fit-on)")
    p.add_argument("--window-share", type=float, default=None,
                   help="--validate, --like, --sensitivity --cost-from: share of a step's time that swap copies hide behind (default: "
                        "the bench's measured swap_overlap; 1.0 where it did not record it)")
    p.add_argument("--chunk-step-ms", type=float, default=None,
                   help="--validate, --like, --sensitivity --cost-from: a step's fixed cost per request it prefills (a prompt, "
                        "a chunk, a resumed turn's new tokens), in ms (default: the profile's extra.chunk_step_s, else 0)")
    p.add_argument("--fit-on", default="unlimited-kv",
                   help="--validate, --like, --sensitivity --cost-from: the policy the host time is fitted on (default the bound, which never "
                        "recomputes; 'none': 0)")
    p.add_argument("--fit-recompute-on", default=None,
                   help="--validate, --like, --sensitivity --cost-from: also fit, on this policy alone, a multiple of the profile's attention cost per "
                        "(query, earlier key) pair, which recompute chunks pay (default: none, the grid's own)")
    p.add_argument("--cost-from", metavar="BENCH_JSON",
                   help="--sensitivity: start every cell from that bench run's profile, setting and cost constants "
                        "(fitted on it as --validate fits them)")
    p.add_argument("--at-machine-speed", nargs="?", const="probed", choices=("probed", "damped"), default=None,
                   help="--validate: replay each point at the machine speed its machine check measured, the cost fits included; "
                        "a bench made before the machine check is refused. 'probed' (the default when given): the mean of its two "
                        "probes over the SLO reference's; 'damped': over the run's median probe, to the power with which the "
                        "forward time followed the probes in a replay at one speed (fitted first; the one-speed replay is kept "
                        "in the JSON). The speed check printed with every validation (forward time, measured against simulated) "
                        "says which replay got the machine's speed right")
    p.add_argument("--out", help="where to write the JSON (default under results/sim/)")


def _labels(args: argparse.Namespace, default: tuple[str, ...]) -> list[str]:
    return [x.strip() for x in args.policies.split(",") if x.strip()] if args.policies else list(default)


def _floats(s: str | None) -> tuple[float, ...] | None:
    return tuple(float(x) for x in s.split(",") if x.strip()) if s else None


def _write(obj: Any, path: Path) -> None:
    from infercept.benchmarks.sim.setup import dump

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(obj) + "\n")
    print(f"wrote {path}")


def _seeds(args: argparse.Namespace, default: str) -> tuple[int, ...]:
    return tuple(int(x) for x in (args.seeds or default).split(",") if x.strip())


def _paper_run(args: argparse.Namespace, model: str, quick: bool = False) -> Any:
    from infercept.benchmarks.sim.paper import ALL_POLICIES, PaperRun

    run = PaperRun(model=model, seeds=_seeds(args, "1" if quick else "1,2,3"))
    run.policies = tuple(_labels(args, QUICK_POLICIES if quick else ALL_POLICIES))
    if "unlimited-kv" not in run.policies:
        run.policies += ("unlimited-kv",)
    run.rates = _floats(args.rates) or ((1.0, 2.0, 3.0) if quick else None)
    run.duration_s = args.duration or (60.0 if quick else run.duration_s)
    run.drain_s = args.drain or (120.0 if quick else run.drain_s)
    run.token_budget = args.token_budget
    run.link_gbps = args.link_gbps
    return run


def _cost_args(args: argparse.Namespace) -> dict[str, Any]:
    """--validate's and --like's cost constants: given, or fitted on the bench (`validate.fit_cost`)."""
    return {"context_share": args.decode_context_share,
            "host_per_request_s": None if args.host_overhead_us is None else args.host_overhead_us * 1e-6,
            "fit_on": None if args.fit_on == "none" else args.fit_on, "decode_grid": args.decode_grid,
            "fit_recompute_on": args.fit_recompute_on, "cache_cliff": args.cache_cliff,
            "window_share": args.window_share,
            "chunk_step_s": None if args.chunk_step_ms is None else args.chunk_step_ms * 1e-3}


def _command() -> str:
    return "infercept simulate " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 and sys.argv[1] == "simulate" else " ".join(sys.argv)


def _made_by() -> dict[str, Any]:
    """What a result file records of how it was made: the command, and the commit whose code ran it (with
    whether the code had uncommitted changes), so that a result can be told apart from later code."""
    from infercept.benchmarks.runner import git_commit, git_dirty

    return {"command": _command(), "commit": git_commit(), "code_dirty": git_dirty()}


def main(args: argparse.Namespace) -> int:
    from infercept.benchmarks.sim.report import table

    t0 = time.time()
    made_by = _made_by()  # the code as the run starts (edits while it runs do not change what it ran)
    if args.sessions is not None and args.sessions <= 0:
        print("error: --sessions must be a positive number of sessions", file=sys.stderr)
        return 2
    if args.link_gbps is not None and (args.validate or args.sensitivity or args.sessions is not None):
        print("error: --link-gbps is for sweeps on a derived GPU profile (--paper, --quick, --profile) and --like (a "
              "what-if on the bench's setting); --validate replays the bench's own link, --sensitivity sweeps it, "
              "and --sessions plans on the profile's", file=sys.stderr)
        return 2
    if args.link_gbps is not None and not (args.link_gbps > 0 and math.isfinite(args.link_gbps)):
        print("error: --link-gbps must be a positive, finite number of GB/s", file=sys.stderr)
        return 2
    if args.validate:
        from infercept.benchmarks.sim.validate import print_validation, validate

        v = validate(args.validate, policies=_labels(args, ()) or None, token_budget=args.token_budget,
                     machine_speed=args.at_machine_speed, **_cost_args(args))
        v = {**made_by, **v}
        print_validation(v)
        _write(v, Path(args.out or "results/sim/validation.json"))
    elif args.like:
        from infercept.benchmarks.sim.validate import like_bench, print_like

        rates = _floats(args.rates)
        labels = _labels(args, ())
        if not rates or not labels:
            print("error: --like needs --rates and --policies", file=sys.stderr)
            return 2
        v = {**made_by, **like_bench(args.like, labels, rates, _seeds(args, "1,2,3"), args.duration,
                                     link_gbps=args.link_gbps, **_cost_args(args))}
        print_like(v)
        if args.out:
            _write(v, Path(args.out))
    elif args.paper or args.quick:
        from infercept.benchmarks.sim.paper import run_paper

        model = args.model or "gptj-6b"
        res = {**made_by, **run_paper(_paper_run(args, model, quick=args.quick))}
        print(f"\nSLO: median normalized latency <= {res['slo']['slo_normalized_latency_s'] * 1000:.2f} ms/token "
              f"(5x the unloaded {res['slo']['unloaded_normalized_latency_s'] * 1000:.2f} ms on unlimited-kv)")
        print(table(res["headline"], res["token_budget"]))
        default = "results/sim/quick.json" if args.quick else ("results/sim/paper_scale.json" if model == "gptj-6b"
                                                               else f"results/sim/paper_scale_{model}.json")
        if args.out or not args.quick:
            _write(res, Path(args.out or default))
    elif args.sensitivity:
        from infercept.benchmarks.sim import sensitivity as sens

        res = sens.sensitivity(_labels(args, sens.POLICIES), rates=_floats(args.rates) or sens.RATES,
                               duration_s=args.duration or 30.0, seeds=_seeds(args, "1,2,3"), workload=args.workload,
                               cost_from=args.cost_from, **(_cost_args(args) if args.cost_from else {}))
        res = {**made_by, **res}
        print(sens.table(res))
        _write(res, Path(args.out or "results/sim/sensitivity.json"))
    elif args.sessions is not None:
        from infercept.benchmarks.sim.capacity import capacity
        from infercept.benchmarks.sim.paper import PAPER_PROFILES, PaperRun, paper_model

        model = paper_model(args.profile)
        if model is None:
            print("error: --sessions needs --profile gptj-6b or llama2-70b (a derived GPU profile, by name or by its "
                  "file under configs/profiles/)", file=sys.stderr)
            return 2
        labels = _labels(args, ("discard", "vllm-apc", "vllm-offload", "continuum", "swap", "infercept-paper", "infercept", "infercept-admit", "unlimited-kv"))
        bench = PaperRun(model=model, policies=tuple(labels), token_budget=args.token_budget).bench()
        res = capacity(bench, labels, workload=args.workload or "mixed", max_sessions=args.sessions, seed=_seeds(args, "1")[0])
        res = {**made_by, "profile": str(PAPER_PROFILES[model]), "token_budget": bench.budget(None), **res}
        print(f"\nsessions one {model} device sustains at the SLO ({res['slo']['slo_normalized_latency_s'] * 1000:.1f} ms/token), "
              f"workload {args.workload or 'mixed'}, up to {args.sessions}:")
        for lab, r in res["policies"].items():
            reps = r["replicas_for_max_sessions"]
            print(f"  {lab:20s} {r['sessions_at_slo']:6d}{'+' if r['censored'] else ' '}  "
                  f"-> {args.sessions} sessions need {reps if reps is not None else 'no number of'} replica(s)  "
                  f"({len(r['probes'])} probes, {r['wall_s']:.1f} s)")
        _write(res, Path(args.out or "results/sim/capacity.json"))
    else:
        from infercept.benchmarks.sim.paper import paper_model

        model = paper_model(args.profile)
        if model is None:
            print("error: sweeps on other profiles: use --validate with a bench.json", file=sys.stderr)
            return 2
        run = _paper_run(args, model)
        from infercept.benchmarks.sim.paper import run_paper

        res = {**made_by, **run_paper(run)}
        print(table(res["headline"], res["token_budget"]))
        if args.out:
            _write(res, Path(args.out))
    print(f"simulated in {time.time() - t0:.1f} s wall")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infercept simulate", description=__doc__.split("\n")[0])
    add_arguments(p)
    return p


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
