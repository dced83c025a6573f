"""One (policy, seed, rate) run of a bench setting with every turn's timing kept, and the summary of such
runs: the bench's own replay (`infercept.benchmarks.replay`, which times every turn), its engine at one
token budget, seed `seed`'s `mixed` workload at `rate`. Real engines: run it alone on the machine.

    python -m infercept.benchmarks.experiments.bound_check run unlimited-kv 3 4 --out results/bench/bound_check/turns_bound3.json
    python -m infercept.benchmarks.experiments.bound_check summary results/bench/bound_check/turns_*.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
from pathlib import Path

from infercept.benchmarks.metrics import Turn, turn_timing
from infercept.benchmarks.replay import VARIANTS, EngineRun, Setting
from infercept.benchmarks.runner import Plan, context_tokens, make_workloads
from infercept.benchmarks.workload import write_priors


async def run(label: str, seed: int, rate: float, out: Path, token_budget: int = 512) -> None:
    s = Setting()
    tmp = Path(tempfile.mkdtemp(prefix="bound-check-"))
    s.priors_dir = str(tmp)
    write_priors(tmp / f"priors-{s.priors}.yaml", s.priors, s.time_scale)  # as the runner writes them
    plan = Plan(workload="mixed", labels=[label], rates=[4.0, 8.0, 12.0], duration_s=10.0, seeds=[seed], token_budget=token_budget,
                tune=False, ablation=False, slo_factor=5.0, setting=s, out=tmp, command="")
    wl = make_workloads(plan)
    s.unlimited_kv_tokens = max(sum(context_tokens(r) for r in reqs) for reqs in wl.values())
    s.unlimited_kv_slots = max(len(reqs) for reqs in wl.values())
    async with EngineRun(VARIANTS[label], s, token_budget) as er:
        res = await er.run(wl[(seed, rate)], rate)
    print(label, seed, rate, f"median nl {res['normalized_latency_s']['median']:.4f}", res["completed"], "/", res["requests"])
    turns = [dataclasses.asdict(t) for o in er.outcomes for t in o.turns]
    out.write_text(json.dumps({"summary": res["normalized_latency_s"], "turns": turns}))


def summary_line(path: Path) -> str:
    ms = 1000.0
    d = json.loads(path.read_text())
    turns = [Turn(**t) for t in d["turns"]]
    tt = turn_timing(turns)
    out = sum(t.out_tokens for t in turns)
    first = sum(t.first_s for t in turns)
    total = sum(t.total_s for t in turns)
    return (f"{path.stem:12s} nl_med {ms * d['summary']['median']:.1f}ms turns {tt['turns']} out {out}"
            f" sum(turn time)/out {ms * tt['turn_time_per_output_token_s']:.2f}ms"
            f" | new-ttft med {ms * tt['new_first_token_s']['median']:.1f} p90 {ms * tt['new_first_token_s']['p90']:.1f}"
            f" | resume-ttft med {ms * tt['resume_first_token_s']['median']:.1f} p90 {ms * tt['resume_first_token_s']['p90']:.1f}"
            f" | per-token decode med {ms * tt['decode_per_token_s']['median']:.2f} p90 {ms * tt['decode_per_token_s']['p90']:.2f} ms"
            f" | sum ttft {first:.1f}s sum decode {total - first:.1f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infercept.benchmarks.experiments.bound_check", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one run with every turn's timing kept")
    r.add_argument("label", choices=sorted(VARIANTS))
    r.add_argument("seed", type=int)
    r.add_argument("rate", type=float)
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--token-budget", type=int, default=512)
    s = sub.add_parser("summary", help="the per-turn measures of runs")
    s.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        asyncio.run(run(args.label, args.seed, args.rate, args.out, args.token_budget))
    else:
        for f in args.files:
            print(summary_line(f))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
