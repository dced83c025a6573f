"""`infercept profile`: measure the performance model on the machine at hand and write it as JSON.

* T_fwd over a grid of batched-token counts: one prompt of N tokens with max_tokens=1 is one iteration
  of N query tokens (chunked prefill budget >= N, prefix caching off); the time to its first token,
  minus the same for a 1-token prompt (fixed per-request overhead), is T_fwd(N). The sizes are measured
  in rounds (1 token and every grid point once per round, at least five rounds), so that a machine
  whose speed drifts over seconds moves all of them alike, and each time is the fastest of its rounds
  (noise only ever adds time; a median of two, taken size after size, let a slow patch make small N
  look free).
* Decode steps for batch shapes that matter (B concurrent requests at a given context): recorded in
  `extra` for reference; the waste equations use the prefill grid.
* The prefill path's cost per step (`extra.chunk_step_s`): what a decoding request's step gains when a
  short prompt prefills beside it (`chunk_step_s`); the simulator charges it per prefilled request.
* S, the saturation point: the smallest N whose time per token is within 5% of the best, counting the
  iteration's fixed part (one decode step of one request) with T_fwd(N).
* M, KV bytes per token: from the model config (2 x layers x KV heads x head size x dtype bytes).
* Swap bandwidth out and in: the swap connector's own copy code (`index_select` / `index_copy_` of
  whole blocks between a KV-shaped tensor on the device and a host buffer, pinned on CUDA), timed.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from engine_adapter.config import EngineConfig
from engine_adapter.engine import InterceptEngine
from engine_adapter.events import TurnEnd
from engine_adapter.policy.profile import Profile, kv_bytes_per_token, saturation_point

DEFAULT_GRID = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)


async def _ttft(engine: InterceptEngine, n_tokens: int, seed: int) -> float:
    s = engine.open_session(max_tokens=1)
    ids = [1000 + (seed * 7919 + i * 31) % 30000 for i in range(n_tokens)]
    t0 = time.perf_counter()
    try:
        async for ev in s.turn(ids):
            if isinstance(ev, TurnEnd):
                break
        return time.perf_counter() - t0
    finally:
        await s.close()


async def decode_step_s(engine: InterceptEngine, batch: int, context: int, steps: int = 16) -> float:
    sessions = [engine.open_session(max_tokens=steps + 1, ignore_eos=True) for _ in range(batch)]
    stamps: list[list[float]] = [[] for _ in range(batch)]

    async def one(i: int) -> None:
        ids = [2000 + (i * 13 + j * 17) % 30000 for j in range(context)]
        async for _ in sessions[i].turn(ids):
            stamps[i].append(time.perf_counter())

    try:
        await asyncio.gather(*(one(i) for i in range(batch)))
    finally:
        for s in sessions:
            await s.close()
    gaps = [b - a for st in stamps for a, b in zip(st[1:-1], st[2:-1])]
    return statistics.median(gaps) if gaps else float("nan")


async def chunk_step_s(engine: InterceptEngine, context: int = 512, chunk: int = 2, rounds: int = 5,
                       steps: int = 24) -> float:
    """What a step costs the requests decoding in it when another request prefills beside them, beyond the
    tokens it prefills: vLLM's prefill path (on the CPU backend ~1-2 ms a prefilled request, whatever its
    length; `results/bench/block-waits/step-diag/`). One request decodes at `context` while a `chunk`-token
    prompt arrives (two tokens: a prefill whose compute is a decode's, so the grid's T_fwd adds nothing to
    it): the decoding request's longest gap after the arrival, less its median gap, the median over
    `rounds`. T_fwd(N) cannot show it (it is measured against a one-token prompt, which pays it too); the
    simulator charges it per prefilled request (`benchmarks/sim/cost.py`)."""
    extras = []
    for r in range(rounds):
        s = engine.open_session(max_tokens=steps, ignore_eos=True)
        stamps: list[float] = []
        arrived: list[float] = []
        half = asyncio.Event()  # set halfway through the decode, or when it ends short of that

        async def decode() -> None:
            ids = [3000 + (r * 7 + j * 13) % 30000 for j in range(context)]
            try:
                async for _ in s.turn(ids):
                    stamps.append(time.perf_counter())
                    if len(stamps) == steps // 2:
                        half.set()
            finally:
                half.set()

        async def prefill() -> None:
            await half.wait()
            if len(stamps) < steps // 2:
                return  # the decode ended early (its error is gather's): nothing to measure beside
            arrived.append(time.perf_counter())
            await _ttft(engine, chunk, 1000 + r)

        try:
            await asyncio.gather(decode(), prefill())
        finally:
            await s.close()
        ts = stamps[1:-1]  # the tokens after the prompt's, without the turn's end
        gaps = [(b, b - a) for a, b in zip(ts, ts[1:])]
        after = [g for t, g in gaps if t > arrived[0]][:3] if arrived else []
        if after:
            extras.append(max(after) - statistics.median(g for _, g in gaps))
    return max(0.0, statistics.median(extras)) if extras else float("nan")


def measure_swap_bandwidth(block_shape: tuple[int, ...], dtype: Any, blocks: int = 64, repeats: int = 5) -> tuple[float, float]:
    """(out, in) bytes/s of the connector's block copies (`kv_copy.BlockCopier`) on this device."""
    import torch

    from engine_adapter.kv_copy import BlockCopier

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.randn((blocks * 2, *block_shape), dtype=torch.float32).to(dtype).to(device)
    copier = BlockCopier({"layer": dev}, num_blocks=blocks * 2, host_slots=blocks)
    pairs = [(i * 2, i) for i in range(blocks)]  # every other device block: a scattered request
    nbytes = blocks * copier.block_bytes("layer")

    def timed(to_host: bool) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            if to_host:
                copier.begin_step(swap_out=pairs)
                copier.copy_out_all()
            else:
                copier.begin_step(swap_in=pairs)
                copier.copy_in()
            copier.finish()
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times)

    timed(True)  # warm-up
    return timed(True), timed(False)


class ImplausibleProfile(RuntimeError):
    """The measured T_fwd curve cannot be a forward pass's (noise from a busy machine swamped it)."""


def check_fwd(grid: tuple[int, ...], fwd: tuple[float, ...], device: str = "cuda") -> None:
    """T_fwd must not fall by half from one grid point to the next (more tokens never cost much less): a
    curve that does came from a machine busy with something else, and its S would be wrong. On a CPU a
    forward pass of hundreds of tokens is never free either (tens can look free: the step's fixed part
    hides them; on a GPU hundreds can too)."""
    if device == "cpu":
        for n, t in zip(grid, fwd):
            if n >= 256 and t <= 1e-5:
                raise ImplausibleProfile(f"T_fwd({n} tokens) measured {t * 1e6:.0f} us on a CPU: the 1-token "
                                         "reference was slower than it (a busy machine); measure again")
    for (n0, t0), (n1, t1) in zip(zip(grid, fwd), zip(grid[1:], fwd[1:])):
        if t0 > 1e-4 and t1 < 0.5 * t0:
            raise ImplausibleProfile(f"T_fwd fell from {t0 * 1000:.2f} ms at {n0} tokens to {t1 * 1000:.2f} ms at {n1}: "
                                     "measure again on an idle machine")


def iteration_saturation(grid: tuple[int, ...], fwd: tuple[float, ...], step_s: float) -> int:
    """S from whole iterations: an iteration of N tokens costs its fixed part (one decode step of one
    request, `step_s`) plus T_fwd(N), which is measured over a 1-token prompt and so leaves the fixed part
    out. Judged on T_fwd alone, a grid point where the fixed part dominates (T_fwd ~ 0: small N on a GPU,
    or on a CPU whose step overhead hides the first tokens) would look free, and S would collapse to it."""
    return saturation_point(grid, [t + max(0.0, step_s) for t in fwd])


async def run_profile(model: str, dtype: str, grid: tuple[int, ...], repeats: int, out: Path | None) -> Profile:
    from transformers import AutoConfig

    cfg = EngineConfig(model=model, dtype=dtype, policy="preserve", max_model_len=max(grid) + 64,
                       max_num_batched_tokens=max(grid) + 64, max_num_seqs=64)
    engine = InterceptEngine(cfg)
    await engine.start()
    try:
        await _ttft(engine, 8, 0)  # warm-up
        sizes = (1, *grid)
        best = dict.fromkeys(sizes, float("inf"))
        for r in range(max(repeats, 5)):
            for n in sizes:
                best[n] = min(best[n], await _ttft(engine, n, r))
        base = best[1]
        fwd: list[float] = []
        for n in grid:
            t = best[n]
            fwd.append(max(t - base, 1e-6) if n > 1 else t)
            print(f"T_fwd({n:5d} tokens) = {fwd[-1] * 1000:8.2f} ms  ({fwd[-1] / n * 1e6:7.1f} us/token)", flush=True)
        decode = {}
        for batch in (1, 8, 32):
            ctx = min(512, max(grid))
            decode[f"batch{batch}_ctx{ctx}_s"] = await decode_step_s(engine, batch, ctx)
            print(f"decode step, batch {batch} at context {ctx}: {decode[f'batch{batch}_ctx{ctx}_s'] * 1000:.1f} ms", flush=True)
        chunk = await chunk_step_s(engine, context=min(512, max(grid)))
        print(f"prefill beside a decode: {chunk * 1000:.2f} ms more for the step", flush=True)
        model_path = engine.model_path or model
    finally:
        await engine.shutdown()

    import torch

    hf = AutoConfig.from_pretrained(model_path)
    head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[cfg.resolved_dtype()]
    dtype_bytes = torch.tensor([], dtype=tdtype).element_size()
    m = kv_bytes_per_token(hf.num_hidden_layers, kv_heads, head, dtype_bytes)
    # One layer's block as vLLM's CPU and GPU backends lay it out (16 tokens of K and V).
    out_bw, in_bw = measure_swap_bandwidth((kv_heads, 16, 2 * head), tdtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"M = {m} bytes/token; swap out {out_bw / 1e9:.2f} GB/s, in {in_bw / 1e9:.2f} GB/s ({device})")
    prof = Profile(
        model=Path(model_path).name,
        device=device,
        fwd_tokens=tuple(grid),
        fwd_seconds=tuple(fwd),
        saturation_tokens=iteration_saturation(tuple(grid), tuple(fwd), next(v for k, v in decode.items() if k.startswith("batch1_"))),
        kv_bytes_per_token=m,
        swap_out_bytes_per_s=out_bw,
        swap_in_bytes_per_s=in_bw,
        source=f"measured by infercept profile on {time.strftime('%Y-%m-%d', time.gmtime())}",
        extra={"decode": decode, "per_request_overhead_s": base, "chunk_step_s": chunk, "dtype": dtype, "repeats": repeats},
    )
    print(f"saturation point S = {prof.saturation_tokens} tokens")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(prof.to_json() + "\n")
        print(f"wrote {out}")
    return prof
