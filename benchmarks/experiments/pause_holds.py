"""How long paused contexts stay on the device under a policy, per augmentation type, and where that time
goes (before the copy out starts, while it is under way, or never copied out): the simulator replaying a
benchmark's workloads at one rate, with the cost model a validation fitted.

    python -m infercept.benchmarks.experiments.pause_holds results/bench/bench.json \\
        --validation results/sim/validation.json --seeds 1,2,3 --rate 8
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from engine_adapter.intercept.state import Entry, KvState
from infercept.benchmarks.sim import validate as val
from infercept.benchmarks.sim.cost import context_shares, read_decode_grid
from infercept.benchmarks.sim.engine import SimEngine
from infercept.benchmarks.sim.setup import profile_from_bench
from infercept.benchmarks.sim.sweep import sweep
from infercept.benchmarks.workload import ShareGPT


class SwapStarts:
    """A core observer: when each intercept's copy out started (engine clock)."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}

    def __call__(self, e: Entry, now: float | None) -> None:
        if e.state is KvState.SWAPPING_OUT and now is not None:
            self.at.setdefault(e.record.intercept_id, now)


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * len(xs))] if xs else 0.0


def holds(eng: SimEngine, starts: SwapStarts) -> dict[str, Any]:
    """Per augmentation type: device time of paused contexts as a share of capacity x time, and its split."""
    core = eng.core
    cap = eng.sched.pool.num_blocks * eng.bs * eng.now
    by: dict[str, list[tuple[float, int, str, float | None]]] = defaultdict(list)
    split = {"before the copy out starts": 0.0, "while the copy out is under way": 0.0, "never copied out": 0.0}
    for r in core.ledger.records:
        end = r.kv_released_at_s if r.kv_released_at_s is not None else r.resumed_at_s
        if end is None:
            continue
        ss = starts.at.get(r.intercept_id)
        by[r.aug_type].append((end - r.paused_at_s, r.context_tokens, r.kv_fate.value, None if ss is None else ss - r.paused_at_s))
        if ss is None:
            split["never copied out"] += (end - r.paused_at_s) * r.context_tokens
        else:
            split["before the copy out starts"] += (ss - r.paused_at_s) * r.context_tokens
            split["while the copy out is under way"] += (end - ss) * r.context_tokens
    types = {}
    for t, xs in sorted(by.items()):
        held = [h for h, *_ in xs]
        waits = [w for *_, w in xs if w is not None]
        copying = [h - w for h, _, _, w in xs if w is not None]
        fates: dict[str, int] = defaultdict(int)
        for x in xs:
            fates[x[2]] += 1
        types[t] = {"n": len(xs), "device_share_of_capacity_time": sum(h * c for h, c, *_ in xs) / cap,
                    "held_s": {"median": statistics.median(held), "p90": pct(held, .9), "max": max(held)},
                    "wait_to_copy_p90_s": pct(waits, .9), "copying_median_s": statistics.median(copying) if copying else 0.0,
                    "fates": dict(fates)}
    return {"seconds": eng.now, "steps": core.steps, "types": types,
            "preserved_idle_split": {k: v / cap for k, v in split.items()}}


def run(bench: str | Path, validation: str | Path, seeds: list[int], rate: float, policy: str = "infercept") -> list[dict[str, Any]]:
    bj = dict(val.read_bench(bench))
    cm = json.loads(Path(validation).read_text())["cost_model"]
    prof = profile_from_bench(bj["setting"], fallback=val.DEFAULT_PROFILE)
    share = context_shares(read_decode_grid(cm["decode_grid"]), prof, None) if cm.get("decode_grid") else None
    sb = val.sim_bench(bj, context_share=share, frontend_s=tuple(cm["frontend_in_out_s"]),  # type: ignore[arg-type]
                       host_per_request_s=cm["host_per_request_s"], step_overhead_s=cm["step_overhead_s"],
                       pair_scale=cm.get("pair_scale", 1.0), window_share=cm.get("window_share", 1.0))
    watched: list[tuple[SimEngine, SwapStarts]] = []

    def watch(eng: SimEngine) -> None:
        starts = SwapStarts()
        eng.core.observers.append(starts)
        watched.append((eng, starts))

    sb.on_engine.append(watch)
    # The same prompts as the bench's (ShareGPT, tokenized by the model's tokenizer) where it drew them.
    sharegpt = sb.setting.model if bj["workload"] in ("mixed", "chatbot") and ShareGPT.available() else None
    sweep(sb, [policy], [rate], float(bj["duration_s"]), seeds, workload=bj["workload"], slo_factor=float(bj["slo"]["slo_factor"]),
          slo_s=float(bj["slo"]["slo_normalized_latency_s"]), sharegpt_model=sharegpt, verbose=False)
    # The engines that ran the workloads (the SLO's unloaded reference, if the sweep measures one, runs first).
    runs = [(e, s) for e, s in watched if e.core.ledger.records][-len(seeds):]
    return [{"seed": seed, "rate": rate, **holds(e, s)} for seed, (e, s) in zip(seeds, runs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infercept.benchmarks.experiments.pause_holds", description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", help="a bench.json whose setting and workloads are replayed")
    ap.add_argument("--validation", default="results/sim/validation.json", help="the fitted cost model (validation JSON)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--policy", default="infercept")
    args = ap.parse_args(argv)
    for r in run(args.bench, args.validation, [int(s) for s in args.seeds.split(",")], args.rate, args.policy):
        print(f"== seed {r['seed']}, {r['rate']:g} req/s ({r['seconds']:.0f} s, {r['steps']} steps)")
        for t, x in r["types"].items():
            h = x["held_s"]
            print(f"  {t:6s} n={x['n']:4d} on the device {x['device_share_of_capacity_time'] * 100:5.2f}% of capacity x time;"
                  f" held median {h['median'] * 1e3:5.1f} ms, p90 {h['p90'] * 1e3:6.1f}, max {h['max'] * 1e3:7.1f};"
                  f" wait for the copy to start p90 {x['wait_to_copy_p90_s'] * 1e3:5.1f} ms;"
                  f" copying median {x['copying_median_s'] * 1e3:5.1f} ms; fates {x['fates']}")
        print("  preserved-idle split: " + ", ".join(f"{k} {v * 100:.2f}%" for k, v in r["preserved_idle_split"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
