"""Does a decode step on this CPU cost more per token of context once the batch's KV outgrows the L3 cache?

The simulator's CPU cost model (`infercept.benchmarks.sim.cost.MeasuredCost`) takes decode steps from the
profile, measured at one context (512) only. This measures decode steps (the profiler's own
`decode_step_s`: B requests decoding together, the median gap between tokens) over batch x context, on the
bench's two pool sizes: 24,576 tokens of KV (every policy) and 186,868 (the bound, `unlimited-kv`), with the
bench's engine settings (tiny, float32, block 32). Real engines: run it alone on the machine.

    python -m infercept.benchmarks.experiments.decode_context results/sim/decode_context/decode.json [--pools bench,bound] [--grid 8x512,32x1024]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

POOLS = {"bench": 24576, "bound": 186868}
GRID = [(1, 512), (8, 512), (32, 512), (8, 2048), (16, 1024), (32, 256), (32, 1024), (64, 256), (64, 512),
        (32, 2048), (64, 1024), (64, 2048),
        # around the cliff: 24-48 MB of KV in the batch, by batch and by context
        (16, 1536), (16, 2048), (16, 3072), (8, 4000), (24, 1024), (24, 1536), (32, 768), (32, 1280), (32, 1536),
        (48, 512), (48, 768), (48, 1024), (64, 384), (64, 640), (64, 768),
        # across the cliff (48-64 MB) and beyond it
        (52, 1024), (56, 1024), (60, 1024), (64, 896), (32, 1792), (28, 2048), (48, 1536), (40, 2048), (64, 1536)]


def parse_grid(text: str) -> list[tuple[int, int]]:
    """`BxC,BxC` (batch x context) as pairs; an empty text is the default grid."""
    if not text:
        return list(GRID)
    out = []
    for x in text.split(","):
        b, _, c = x.partition("x")
        if not (b.isdigit() and c.isdigit()) or int(b) < 1 or int(c) < 1:
            raise ValueError(f"grid point {x!r}: expected BATCHxCONTEXT, e.g. 32x1024")
        out.append((int(b), int(c)))
    return out


async def measure(pool: str, tokens: int, grid: list[tuple[int, int]]) -> list[dict[str, Any]]:
    from engine_adapter.config import EngineConfig
    from engine_adapter.engine import InterceptEngine
    from engine_adapter.profiler import decode_step_s

    cfg = EngineConfig(model="tiny", policy="preserve", dtype="float32", block_size=32, num_kv_blocks=-(-tokens // 32) + 1,
                       max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=2048,
                       kv_cache_gib=max(1.0, math.ceil(tokens * 1024 * 1.1 / 2**30)))
    engine = InterceptEngine(cfg)
    await engine.start()
    rows = []
    try:
        await decode_step_s(engine, 4, 256)  # warm-up
        for batch, ctx in grid:
            if batch * (ctx + 40) > tokens:
                continue
            steps = [await decode_step_s(engine, batch, ctx, steps=24) for _ in range(3)]
            step = sorted(steps)[1]
            rows.append({"pool": pool, "pool_tokens": tokens, "batch": batch, "context": ctx,
                         "kv_mb": batch * ctx * 1024 / 2**20, "step_s": step, "steps_s": steps})
            print(f"{pool:6s} batch {batch:3d} ctx {ctx:5d} KV {rows[-1]['kv_mb']:6.1f} MB: step {step * 1000:6.2f} ms "
                  f"({', '.join(f'{s * 1000:.2f}' for s in steps)})", file=sys.stderr, flush=True)
    finally:
        await engine.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infercept.benchmarks.experiments.decode_context", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the JSON written (vLLM logs to stdout)")
    ap.add_argument("--pools", default=",".join(POOLS), help=f"pools to measure, of {', '.join(POOLS)}")
    ap.add_argument("--grid", default="", help="BxC,BxC: only these points (default: the full grid)")
    args = ap.parse_args(argv)
    pools = [p for p in args.pools.split(",") if p]
    unknown = sorted(set(pools) - set(POOLS))
    if unknown:
        ap.error(f"unknown pool(s) {', '.join(unknown)}")
    grid = parse_grid(args.grid)
    rows: list[dict[str, Any]] = []
    for pool in pools:
        rows += asyncio.run(measure(pool, POOLS[pool], grid))
    Path(args.out).write_text(json.dumps({
        "command": "python -m infercept.benchmarks.experiments.decode_context " + " ".join(argv if argv is not None else sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": platform.processor() or platform.machine(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
