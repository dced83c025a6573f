"""`infercept bench-overhead`: what the intercept machinery costs when nothing is intercepted.

One fixed workload (N requests, fixed prompt and output lengths, EOS ignored) runs through stock vLLM
(`AsyncLLM`, its own scheduler, plain requests) and through `InterceptEngine` (the intercept scheduler
with its trigger checks, one streaming session per request), in alternating rounds inside one process
so that machine noise hits both alike. Both engines stay loaded; only one works at a time. Prints
per-round throughputs and the ratio of medians, and writes them as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine_adapter.config import EngineConfig
from engine_adapter.engine import InterceptEngine, engine_args
from engine_adapter.events import TurnEnd

WORDS = (
    "agent tool call memory cache token batch request schedule latency model answer question search "
    "result image speech game room door key table kitchen number sum product river mountain city"
).split()


@dataclass(frozen=True)
class Workload:
    requests: int = 32
    prompt_tokens: int = 128
    output_tokens: int = 64
    seed: int = 0

    def prompts(self, encode: Any) -> list[list[int]]:
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.requests):
            ids: list[int] = []
            while len(ids) < self.prompt_tokens:
                ids += encode(" " + " ".join(rng.choices(WORDS, k=32)))
            out.append(ids[: self.prompt_tokens])
        return out


async def _run_stock(llm: Any, prompts: list[list[int]], w: Workload, rnd: int) -> int:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sp = SamplingParams(max_tokens=w.output_tokens, ignore_eos=True, temperature=0.0, output_kind=RequestOutputKind.DELTA)

    async def one(i: int, p: list[int]) -> int:
        n = 0
        async for out in llm.generate(TokensPrompt(prompt_token_ids=p), sp, request_id=f"stock-{rnd}-{i}"):
            n += len(out.outputs[0].token_ids)
        return n

    return sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


async def _run_intercept(engine: InterceptEngine, prompts: list[list[int]], w: Workload) -> int:
    async def one(p: list[int]) -> int:
        s = engine.open_session(max_tokens=w.output_tokens, ignore_eos=True)
        n = 0
        try:
            async for ev in s.turn(p):
                if isinstance(ev, TurnEnd):
                    n = len(ev.token_ids)
        finally:
            await s.close()
        return n

    return sum(await asyncio.gather(*(one(p) for p in prompts)))


async def run(model: str, rounds: int, w: Workload, dtype: str, out: Path | None) -> dict[str, Any]:
    from vllm.v1.engine.async_llm import AsyncLLM

    cfg = EngineConfig(model=model, dtype=dtype, policy="preserve", max_num_seqs=w.requests, max_model_len=2048)
    engine = InterceptEngine(cfg)
    await engine.start()
    # The same engine arguments without the scheduler subclass: the same model, sizes and KV cache.
    stock = await asyncio.to_thread(AsyncLLM.from_engine_args, engine_args(cfg, engine.model_path or model, intercept=False))
    prompts = w.prompts(engine.encode)
    rows: list[dict[str, float]] = []
    try:
        await _run_stock(stock, prompts[:4], w, -1)  # warm-up both
        await _run_intercept(engine, prompts[:4], w)
        for r in range(rounds):
            order = ["stock", "intercept"] if r % 2 == 0 else ["intercept", "stock"]
            row: dict[str, float] = {}
            for name in order:
                t0 = time.perf_counter()
                n = await (_run_stock(stock, prompts, w, r) if name == "stock" else _run_intercept(engine, prompts, w))
                dt = time.perf_counter() - t0
                if n != w.requests * w.output_tokens:
                    raise RuntimeError(f"{name} produced {n} tokens, expected {w.requests * w.output_tokens}")
                row[name] = n / dt
            rows.append(row)
            print(f"round {r}: stock {row['stock']:.1f} tok/s, intercept {row['intercept']:.1f} tok/s, ratio {row['intercept'] / row['stock']:.3f}", flush=True)
    finally:
        await engine.shutdown()
        stock.shutdown()
    med_stock = statistics.median(r["stock"] for r in rows)
    med_ic = statistics.median(r["intercept"] for r in rows)
    result = {
        "command": " ".join(["infercept", "bench-overhead", *sys.argv[2:]]),
        "model": model,
        "dtype": cfg.resolved_dtype(),
        "workload": asdict(w),
        "rounds": rows,
        "median_tokens_per_s": {"stock": med_stock, "intercept": med_ic},
        "ratio_of_medians": med_ic / med_stock,
        "median_of_ratios": statistics.median(r["intercept"] / r["stock"] for r in rows),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"throughput ratio intercept/stock: {result['ratio_of_medians']:.3f} (median of ratios {result['median_of_ratios']:.3f})")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return result

