"""One (policy, seed, rate) run of the committed `mixed` bench's setting, with each turn's timing kept:
the bench's own replay (`benchmarks.replay`, which times every turn), its engine at budget 512, seed
`seed`'s workload at `rate`, the first run after the engine's warm-up as in the bench.

    PYTHONPATH=. .venv/bin/python results/bench/bound_check/turns.py unlimited-kv 3 4 bound
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import yaml

from benchmarks.replay import VARIANTS, EngineRun, Setting
from benchmarks.runner import Plan, context_tokens, make_workloads
from benchmarks.workload import PRIORS

HERE = Path(__file__).resolve().parent


async def main(label: str, seed: int, rate: float, tag: str) -> None:
    s = Setting()
    tmp = Path("/tmp/bound_check")
    tmp.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(PRIORS.read_text())  # Table 1 with durations scaled, as the runner writes it
    for st in doc["types"].values():
        st["duration_s"] = [x * s.time_scale for x in st["duration_s"]]
    s.priors_path = str(tmp / "priors.yaml")
    Path(s.priors_path).write_text(yaml.safe_dump(doc))
    plan = Plan(workload="mixed", labels=[label], rates=[4.0, 8.0, 12.0], duration_s=10.0, seeds=[seed], token_budget=512,
                tune=False, ablation=False, slo_factor=5.0, setting=s, out=tmp, command="")
    wl = make_workloads(plan)
    s.unlimited_kv_tokens = max(sum(context_tokens(r) for r in reqs) for reqs in wl.values())
    async with EngineRun(VARIANTS[label], s, 512) as er:
        res = await er.run(wl[(seed, rate)], rate)
    print(label, seed, rate, f"median nl {res['normalized_latency_s']['median']:.4f}", res["completed"], "/", res["requests"])
    turns = [dataclasses.asdict(t) for o in er.outcomes for t in o.turns]
    (HERE / f"turns_{tag}.json").write_text(json.dumps({"summary": res["normalized_latency_s"], "turns": turns}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]))
