"""Re-run some policies of a bench.json on its own workloads, seeds, rates and budgets, replace their
results and recompute the headline (after a fix to one policy, or to put every policy in one quiet
period of a noisy machine). `--slo` measures the SLO's reference again first (on the bound's engine,
requests one at a time, as the runner does). Every re-run is recorded under `reruns` with its commit.

    python -m infercept.benchmarks.rerun results/bench/bench.json infercept [--slo] [--token-budget N]

`--token-budget N` runs the named policies at N tokens per iteration instead of their recorded budget (e.g. the
bound at InferCept's S, the budget issue 12 asks the bound to share); the new budget is recorded in `token_budget`.
"""
import asyncio
import json
import sys
import time
from pathlib import Path

from infercept.benchmarks.metrics import bound_violations, headline
from infercept.benchmarks.plots import plots
from infercept.benchmarks.replay import VARIANTS, EngineRun, Setting
from infercept.benchmarks.runner import Plan, git_commit, make_workloads, measure_reference


async def main():
    path, labels = Path(sys.argv[1]), sys.argv[2].split(",")
    b = json.loads(path.read_text())
    if "--token-budget" in sys.argv:
        budget = int(sys.argv[sys.argv.index("--token-budget") + 1])
        b["token_budget"].update({label: budget for label in labels})
    s = Setting(**{k: v for k, v in b["setting"].items() if k in Setting.__dataclass_fields__})
    s.priors_path = str(path.parent / "priors_scaled.yaml")
    plan = Plan(workload=b["workload"], labels=labels, rates=b["rates"], duration_s=b["duration_s"], seeds=b["seeds"],
                token_budget=b["token_budget_default"], tune=False, ablation=False, slo_factor=b["slo"]["slo_factor"],
                setting=s, out=path.parent, command="", pilot_rates=b["pilot"]["rates"])
    workloads = make_workloads(plan)
    for (seed, rate), w in workloads.items():
        assert len(w) == b["requests_per_rate"][f"{seed}/{rate:g}"], "workload differs from the bench's"
    t0 = time.time()
    if "--slo" in sys.argv:
        # The SLO's reference again, in this period: requests one at a time on the bound's engine.
        from tqdm import tqdm

        unloaded = await measure_reference(plan, workloads, tqdm(total=1, disable=True))
        b["slo"]["unloaded_normalized_latency_s"] = unloaded["median_s"]
        b["slo"]["slo_normalized_latency_s"] = plan.slo_factor * unloaded["median_s"]
        print("slo", b["slo"], flush=True)
    for label in labels:
        b["results"][label] = {}
        for seed in plan.seeds:
            async with EngineRun(VARIANTS[label], s, b["token_budget"][label]) as er:
                b["results"][label][str(seed)] = {f"{r:g}": await er.run(workloads[(seed, r)], r) for r in plan.rates}
            print(label, seed, "done", round(time.time() - t0), flush=True)
    b["headline"] = headline({k: {int(sd): v for sd, v in runs.items()} for k, runs in b["results"].items()}, b["slo"]["slo_normalized_latency_s"])
    b["bound_violations"] = bound_violations(b["headline"])
    b.setdefault("reruns", []).append({"policies": labels, "commit": git_commit(), "elapsed_s": time.time() - t0,
        "command": "python -m infercept.benchmarks.rerun " + " ".join(sys.argv[1:]), "slo_remeasured": "--slo" in sys.argv,
        "token_budget": {label: b["token_budget"][label] for label in labels}})
    path.write_text(json.dumps(b, indent=2, default=lambda o: None if o == float("inf") else str(o)))
    b["plots"] = plots(b, path.parent)
    print(json.dumps({k: {kk: v[kk] for kk in ("max_rate_at_slo", "max_rate_min", "max_rate_max", "ratio_vs_discard", "ratio_vs_vllm-apc", "ratio_vs_ttl", "ratio_vs_bound", "waste_share_at_slo_rate")} for k, v in b["headline"].items()}, indent=1))

if __name__ == "__main__":
    asyncio.run(main())
