"""How long paused contexts stay on the device under `infercept`, per augmentation type, and where that time
goes (before the copy out starts, while it is under way, or kept by min-waste): the simulator replaying a
benchmark's workloads at 8 req/s with the current core and the cost model fitted in results/sim/validation.json.

    PYTHONPATH=. .venv/bin/python results/sim/pause_holds/holds.py results/bench/before_partial_block/bench.json 1,2,3
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import benchmarks.sim.validate as val
from benchmarks.sim import setup
from benchmarks.sim.cost import context_shares, read_decode_grid
from engine_adapter.intercept.core import InterceptCore

engines: list[Any] = []
_engine = setup.SimBench.engine


def _record_engine(self: setup.SimBench, *a: Any, **k: Any) -> Any:
    e = _engine(self, *a, **k)
    engines.append(e)
    return e


swap_start: dict[tuple[int, int], float] = {}
_start_swap_out = InterceptCore.start_swap_out


def _record_swap_start(self: InterceptCore, e: Any, now: float) -> bool:
    ok = _start_swap_out(self, e, now)
    if ok:
        swap_start[(id(self), e.record.intercept_id)] = now
    return ok


setup.SimBench.engine = _record_engine  # type: ignore[method-assign]
InterceptCore.start_swap_out = _record_swap_start  # type: ignore[method-assign]


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * len(xs))] if xs else 0.0


def main(bench: str, seeds: list[int]) -> None:
    bj = dict(val.read_bench(bench))
    bj["seeds"], bj["rates"] = seeds, [8]
    cm = json.loads(Path("results/sim/validation.json").read_text())["cost_model"]
    prof = setup.profile_from_bench(bj["setting"], fallback=val.DEFAULT_PROFILE)
    share = context_shares(read_decode_grid(cm["decode_grid"]), prof, None)
    val._validate(bj, ["infercept"], host_per_request_s=cm["host_per_request_s"], verbose=False, context_share=share,
                  frontend_s=tuple(cm["frontend_in_out_s"]), step_overhead_s=cm["step_overhead_s"],
                  pair_scale=cm["pair_scale"])
    # The sweep's first engine measures the SLO's unloaded reference (one request at a time); then one per seed.
    runs = [e for e in engines[1:] if e.now > 0]
    for seed, eng in zip(seeds, runs):
        core = eng.core
        cap = eng.sched.pool.num_blocks * eng.bs * eng.now
        print(f"== seed {seed}, 8 req/s ({eng.now:.0f} s, {core.steps} steps)")
        by: dict[str, list[tuple[float, int, str, float | None]]] = defaultdict(list)
        split = {"before the copy out starts": 0.0, "while the copy out is under way": 0.0, "never copied out": 0.0}
        for r in core.ledger.records:
            end = r.kv_released_at_s if r.kv_released_at_s is not None else r.resumed_at_s
            if end is None:
                continue
            ss = swap_start.get((id(core), r.intercept_id))
            by[r.aug_type].append((end - r.paused_at_s, r.context_tokens, r.kv_fate.value,
                                   None if ss is None else ss - r.paused_at_s))
            if ss is None:
                split["never copied out"] += (end - r.paused_at_s) * r.context_tokens
            else:
                split["before the copy out starts"] += (ss - r.paused_at_s) * r.context_tokens
                split["while the copy out is under way"] += (end - ss) * r.context_tokens
        for t, xs in sorted(by.items()):
            held = [h for h, *_ in xs]
            waits = [w for *_, w in xs if w is not None]
            copying = [h - w for h, _, _, w in xs if w is not None]
            fates: dict[str, int] = defaultdict(int)
            for x in xs:
                fates[x[2]] += 1
            print(f"  {t:6s} n={len(xs):4d} on the device {sum(h * c for h, c, *_ in xs) / cap * 100:5.2f}% of capacity x time;"
                  f" held median {statistics.median(held) * 1e3:5.1f} ms, p90 {pct(held, .9) * 1e3:6.1f}, max {max(held) * 1e3:7.1f};"
                  f" wait for the copy to start p90 {pct(waits, .9) * 1e3:5.1f} ms; copying median"
                  f" {statistics.median(copying) * 1e3 if copying else 0.0:5.1f} ms; fates {dict(fates)}")
        print("  preserved-idle split: " + ", ".join(f"{k} {v / cap * 100:.2f}%" for k, v in split.items()))


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")])
