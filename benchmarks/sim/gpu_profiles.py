"""GPU performance profiles derived from first principles, for the simulator's paper-scale runs.

    python -m infercept.benchmarks.sim.gpu_profiles          # writes configs/profiles/gptj-6b-a100-80gb.json, ...

Nothing here was measured on a GPU. Each number is one of:

* spec (public): A100 SXM4 80GB: 108 SMs, 312 TFLOP/s dense bf16 tensor-core peak, 2.0 TB/s HBM2e,
  80 GiB; NVLink 3: 600 GB/s per GPU (300 GB/s each way); PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130
  = 31.5 GB/s each way (NVIDIA A100 datasheet; PCI-SIG). DGX A100: two GPUs share each PCIe switch,
  and each switch has one x16 Gen4 link to the host (NVIDIA DGX A100 System Architecture white paper),
  so 8 GPUs swap over 4 host links.
* model shapes (public configs): GPT-J-6B (EleutherAI): 28 layers, d=4096, 16 heads of 256, MLP 16384,
  vocab 50400; Llama-2-70B (Meta): 80 layers, d=8192, 64 query heads and 8 KV heads of 128 (GQA),
  gated MLP 28672, vocab 32000. KV bytes per token = 2 (K, V) x layers x KV heads x head size x 2 (bf16):
  GPT-J 458,752 B (448 KiB), Llama-2-70B 327,680 B (320 KiB).
* derived: the step time (`cost.RooflineCost`): per layer, each GEMM takes the longer of streaming its
  weights from HBM and computing its output tiles; the tiles run in waves of one per SM, so a GEMM of
  M rows costs ceil(ceil(M/128) * ceil(N/128) / 108) tile-times (tile and wave quantization, NVIDIA's
  "Matrix Multiplication Background User's Guide", DU-09799-001, sections 2.3 and 3); attention takes
  the longer of reading the KV it attends to and its FLOPs; tensor parallelism adds two all-reduces per
  layer (Megatron-style). The T_fwd grid is that model for one prompt of n tokens (what
  `infercept profile` would measure), and S is `saturation_point` of that grid (the smallest size whose
  time per token is within 5% of the best), exactly as `infercept profile` computes it on a device.
* assumed (no public measurement at hand; change them here and rerun): 80% of peak inside a full tile,
  85% of peak HBM bandwidth, 80% of the PCIe and NVLink rates, 20 us per all-reduce, a fixed 1 ms (6B)
  / 2 ms (70B, 8 GPUs) per step outside the kernels, and vLLM's 90% memory utilization with a 2 GiB
  activation reserve for the KV capacity.
* cross-check (public measurement): InferCept's own scripts fit GPT-J-6B's forward time on an A100 as
  0.0463 ms per token + 10 ms (github.com/WukLab/InferCept, exps/6B_bench.sh, the `f_ch` constants of
  vllm/core/scheduler_v2.py): 261 TFLOP/s past the knee (84% of peak, against our 80%) on vLLM 0.2.x,
  whose fixed cost (10 ms less the 6 ms weight read) was larger than today's.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from infercept.benchmarks.sim.cost import Roofline, RooflineCost, StepLoad, grid
from engine_adapter.policy.profile import Profile, kv_bytes_per_token, saturation_point
from engine_adapter.paths import configs_dir

PROFILES = configs_dir() / "profiles"
# The grid `infercept profile` measures by default (engine_adapter/profiler.py), so that S comes out as
# the engine would compute it on that GPU.
GRID = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
GIB = 2**30


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    gated_mlp: bool

    @property
    def params(self) -> int:
        d, kv = self.hidden, self.kv_heads * self.head_dim
        attn = d * (self.heads * self.head_dim) + 2 * d * kv + self.heads * self.head_dim * d
        mlp = (3 if self.gated_mlp else 2) * d * self.ffn
        return self.layers * (attn + mlp) + 2 * self.vocab * d  # embedding and (untied) output head

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, 2)


@dataclass(frozen=True)
class Device:
    name: str
    sms: int = 108
    peak_flops: float = 312e12
    hbm_bytes_per_s: float = 2.0e12
    memory_bytes: int = 80 * GIB
    pcie_bytes_per_s: float = 31.5e9  # PCIe 4.0 x16, each way
    nvlink_bytes_per_s: float = 300e9  # NVLink 3, each way


GPTJ_6B = Model("gpt-j-6b", 28, 4096, 16, 16, 256, 16384, 50400, gated_mlp=False)
LLAMA2_70B = Model("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, gated_mlp=True)
A100_80GB = Device("a100-80gb")

MMA_EFFICIENCY = 0.80
HBM_EFFICIENCY = 0.85
LINK_EFFICIENCY = 0.80
ALLREDUCE_LATENCY_S = 20e-6
MEMORY_UTILIZATION = 0.90
ACTIVATION_RESERVE = 2 * GIB


@dataclass(frozen=True)
class Setup:
    model: Model
    device: Device
    tp: int
    fixed_s: float
    host_links: int  # PCIe links the swap traffic shares (DGX A100: one per two GPUs)
    file: str


SETUPS = {
    "gptj-6b-a100": Setup(GPTJ_6B, A100_80GB, tp=1, fixed_s=1e-3, host_links=1, file="gptj-6b-a100-80gb.json"),
    "llama2-70b-8xa100": Setup(LLAMA2_70B, A100_80GB, tp=8, fixed_s=2e-3, host_links=4, file="llama2-70b-8xa100-80gb.json"),
}


def roofline(s: Setup) -> Roofline:
    m, d, tp = s.model, s.model.hidden, s.tp
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    gemms = [((q + 2 * kv) // tp, d), (d, q // tp), ((2 if m.gated_mlp else 1) * m.ffn // tp, d), (d, m.ffn // tp)]
    return Roofline(
        layers=m.layers, gemms=tuple(gemms), lm_head=(m.vocab // tp, d),
        attn_flops_per_pair=4.0 * m.heads * m.head_dim / tp,  # QK^T and PV, 2 FLOPs per multiply-add
        kv_bytes_per_token=2 * m.kv_heads * m.head_dim * 2 // tp,
        sms=s.device.sms, tile=(128, 128), peak_flops=s.device.peak_flops, mma_efficiency=MMA_EFFICIENCY,
        hbm_bytes_per_s=s.device.hbm_bytes_per_s, hbm_efficiency=HBM_EFFICIENCY, fixed_s=s.fixed_s,
        allreduce_per_layer=2 if tp > 1 else 0, allreduce_bus_bytes_per_s=s.device.nvlink_bytes_per_s * LINK_EFFICIENCY,
        allreduce_latency_s=ALLREDUCE_LATENCY_S, tp=tp, hidden=d,
    )


def kv_capacity_tokens(s: Setup) -> int:
    """vLLM's KV cache: 90% of each GPU's memory, less its shard of the weights and an activation
    reserve, over its shard of the KV per token."""
    per_gpu = MEMORY_UTILIZATION * s.device.memory_bytes - 2 * s.model.params / s.tp - ACTIVATION_RESERVE
    return int(per_gpu // (s.model.kv_bytes_per_token / s.tp))


def derive(key: str) -> Profile:
    s = SETUPS[key]
    r = roofline(s)
    cost = RooflineCost(r)
    fwd = grid(cost, GRID)
    swap_bw = s.host_links * s.device.pcie_bytes_per_s * LINK_EFFICIENCY
    decode = {f"batch{b}_ctx512_s": cost.forward_s(StepLoad(b, b, b * 512, b * 513)) for b in (1, 8, 32, 128)}
    per_token = [t / n for t, n in zip(fwd, GRID)]
    # Past this size every GEMM of a layer is compute-bound (its tiles take longer than its weights).
    knee = next((n for n in GRID if all(r.gemm_s(n, nn, k) > nn * k * 2 / (r.hbm_bytes_per_s * r.hbm_efficiency) * 1.0001
                                       for nn, k in r.gemms)), None)
    return Profile(
        model=f"{s.model.name}-tp{s.tp}" if s.tp > 1 else s.model.name,
        device="cuda", fwd_tokens=GRID, fwd_seconds=tuple(fwd), saturation_tokens=saturation_point(GRID, fwd),
        kv_bytes_per_token=s.model.kv_bytes_per_token, swap_out_bytes_per_s=swap_bw, swap_in_bytes_per_s=swap_bw,
        source=f"derived (roofline, not measured): benchmarks/sim/gpu_profiles.py, {s.model.name} on {s.tp} x {s.device.name}",
        extra={
            "roofline": r.to_dict(),
            "decode": decode,
            "kv_capacity_tokens": kv_capacity_tokens(s),
            "params": s.model.params,
            "weights_bytes_per_gpu": 2 * s.model.params // s.tp,
            "tensor_parallel": s.tp,
            "compute_bound_from_tokens": knee,
            "time_per_token_s": dict(zip(map(str, GRID), per_token)),
            "derivation": {"mma_efficiency": MMA_EFFICIENCY, "hbm_efficiency": HBM_EFFICIENCY,
                           "link_efficiency": LINK_EFFICIENCY, "allreduce_latency_s": ALLREDUCE_LATENCY_S,
                           "fixed_s": s.fixed_s, "host_links": s.host_links,
                           "memory_utilization": MEMORY_UTILIZATION, "activation_reserve_bytes": ACTIVATION_RESERVE},
        },
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(PROFILES))
    ap.add_argument("--print", action="store_true", help="print the grids instead of writing files")
    args = ap.parse_args(argv)
    for key, s in SETUPS.items():
        p = derive(key)
        if args.print:
            print(key, "S =", p.saturation_tokens, "KV tokens =", p.extra["kv_capacity_tokens"], "M =", p.kv_bytes_per_token)
            for n, t in zip(p.fwd_tokens, p.fwd_seconds):
                print(f"  {n:5d} tokens {t * 1000:8.2f} ms  {t / n * 1e6:7.2f} us/token")
            print("  decode:", {k: round(v * 1000, 2) for k, v in p.extra["decode"].items()})
            continue
        path = Path(args.out) / s.file
        path.write_text(json.dumps(json.loads(p.to_json()), indent=2) + "\n")
        print(f"wrote {path}: S = {p.saturation_tokens}, KV capacity {p.extra['kv_capacity_tokens']} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
