"""What only a GPU can tell us, in one short run (for a session that is lent a GPU; vLLM does not travel
there, torch does). Prints one JSON document (and writes it to $OUT/gpu_check.json when OUT is set):

1. the swap connector's copy (`engine_adapter.kv_copy.BlockCopier`) out to pinned host memory and back
   into other device blocks, bit-exact, on GPT-J-6B-shaped KV (28 layers, 16 heads x 256, block 16);
   also with the blocks overwritten by the compute stream in the copying step, each layer's write
   ordered after the gathers only (`copy_out_before_writes`: a swap-out's blocks released and reused in
   the step that copies them);
2. device<->host bandwidth with pinned and pageable buffers (the `swap_out/in_bytes_per_s` of a profile);
3. layer-pipelined copies overlapping compute: a 28-layer stack of GPT-J-sized matmuls with and without
   one layer's block copy issued on the side stream after each layer (how much of the copy hides);
4. T_fwd of a GPT-J-6B-shaped decoder stack in torch (random bf16 weights) over batched-token counts,
   and the saturation point S (`policy.profile.saturation_point`), to set against the derived profile.

    python scripts/gpu_check.py            # about a minute on an H100/H200
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine_adapter.kv_copy import BlockCopier  # noqa: E402
from engine_adapter.policy.profile import saturation_point  # noqa: E402

LAYERS, HEADS, HEAD, HIDDEN, FFN, BLOCK = 28, 16, 256, 4096, 16384, 16  # GPT-J-6B


def timed(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def round_trip(blocks: int = 256) -> dict:
    kv = {f"l{i}": torch.randn((2, blocks, BLOCK, HEADS, HEAD), device="cuda").to(torch.bfloat16) for i in range(LAYERS)}
    ref = {n: t.clone() for n, t in kv.items()}
    copier = BlockCopier(kv, {n: 1 for n in kv}, host_slots=blocks)
    out_pairs = [(b, (b * 7) % blocks) for b in range(0, blocks, 2)]
    t_out = time.perf_counter()
    for n in kv:
        copier.copy_out(n, out_pairs)
    copier.finish()
    t_out = time.perf_counter() - t_out
    for t in kv.values():
        t.zero_()
    in_pairs = [(b + 1, s) for b, s in out_pairs]
    t_in = time.perf_counter()
    for n in kv:
        copier.copy_in(n, in_pairs)
    copier.finish()
    t_in = time.perf_counter() - t_in
    exact = all(torch.equal(kv[n][:, d], ref[n][:, s0]) for n in kv for (s0, _), (d, _) in zip(out_pairs, in_pairs))
    moved = len(out_pairs) * copier.block_bytes("l0") * LAYERS
    # Reused in the copying step: copied out before the writes, then every layer's blocks overwritten on
    # the compute stream behind a busy matmul chain (an unordered write would race the side stream's gather).
    kv2 = {n: r.clone() for n, r in ref.items()}
    copier2 = BlockCopier(kv2, {n: 1 for n in kv2}, host_slots=blocks)
    busy = torch.randn((4096, 4096), device="cuda")
    for _ in range(20):
        busy = torch.tanh(busy @ busy)
    copier2.copy_out_before_writes(out_pairs)
    idx = torch.tensor([d for d, _ in out_pairs], device="cuda")
    for t in kv2.values():
        t.index_fill_(1, idx, 3.0)
    copier2.finish()
    for n in kv2:
        copier2.copy_in(n, in_pairs)
    copier2.finish()
    fenced = all(torch.equal(kv2[n][:, d], ref[n][:, s0]) for n in kv2 for (s0, _), (d, _) in zip(out_pairs, in_pairs))
    return {"bit_exact": exact, "bit_exact_reused_in_step": fenced, "blocks": len(out_pairs), "bytes": moved,
            "out_gbps": moved / t_out / 1e9, "in_gbps": moved / t_in / 1e9}


def bandwidth(mb: int = 512) -> dict:
    dev = torch.empty(mb * 2**20, dtype=torch.uint8, device="cuda")
    out = {}
    for pinned in (True, False):
        host = torch.empty(mb * 2**20, dtype=torch.uint8, pin_memory=pinned)
        d2h = timed(lambda: host.copy_(dev, non_blocking=pinned))
        h2d = timed(lambda: dev.copy_(host, non_blocking=pinned))
        out["pinned" if pinned else "pageable"] = {"d2h_gbps": mb * 2**20 / d2h / 1e9, "h2d_gbps": mb * 2**20 / h2d / 1e9}
    return out


def layer_stack(tokens: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    w = [torch.randn((HIDDEN, 3 * HIDDEN + FFN), device="cuda", generator=g, dtype=torch.bfloat16) * 0.01 for _ in range(2)]
    return w, torch.randn((tokens, HIDDEN), device="cuda", dtype=torch.bfloat16)


def forward(w: list[torch.Tensor], x: torch.Tensor, between=None) -> None:
    for layer in range(LAYERS):
        h = x @ w[layer % 2]  # QKV and the MLP up-projection of one GPT-J layer, fused
        x = (h[:, :HIDDEN] + h[:, 3 * HIDDEN:3 * HIDDEN + HIDDEN]) * 0.5
        if between is not None:
            between(layer)


def overlap(tokens: int = 512, blocks_per_layer: int = 64) -> dict:
    w, x = layer_stack(tokens)
    kv = {f"l{i}": torch.randn((2, 1024, BLOCK, HEADS, HEAD), device="cuda", dtype=torch.bfloat16) for i in range(LAYERS)}
    copier = BlockCopier(kv, {n: 1 for n in kv}, host_slots=blocks_per_layer)
    pairs = [(b, b) for b in range(blocks_per_layer)]
    plain = timed(lambda: forward(w, x))
    copy_only = timed(lambda: ([copier.copy_out(f"l{i}", pairs) for i in range(LAYERS)], copier.finish()))

    def with_copies() -> None:
        forward(w, x, between=lambda layer: copier.copy_out(f"l{layer}", pairs))
        copier.finish()

    both = timed(with_copies)
    hidden = max(0.0, min(1.0, (plain + copy_only - both) / copy_only)) if copy_only else None
    return {"tokens": tokens, "forward_s": plain, "copies_alone_s": copy_only, "forward_with_copies_s": both,
            "share_of_copy_time_hidden": hidden}


def t_fwd(grid: tuple[int, ...] = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 2048, 4096)) -> dict:
    out = {}
    for n in grid:
        w, x = layer_stack(n)
        out[n] = timed(lambda: forward(w, x))
    tokens, seconds = list(out), [out[n] for n in out]
    return {"fwd_tokens": tokens, "fwd_seconds": seconds, "saturation_tokens": saturation_point(tokens, seconds),
            "note": "matmuls of a GPT-J-6B-shaped stack (QKV + MLP up-projection per layer), no attention kernel"}


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 1
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "round_trip": round_trip(),
              "bandwidth": bandwidth(), "overlap": overlap(), "t_fwd": t_fwd()}
    text = json.dumps(report, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)
    rt = report["round_trip"]
    return 0 if rt["bit_exact"] and rt["bit_exact_reused_in_step"] else 2


if __name__ == "__main__":
    raise SystemExit(main())
