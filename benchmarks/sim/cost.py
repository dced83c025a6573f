"""What one simulated iteration costs: its forward time, from a performance profile, and its copies.

Two models, chosen by what the profile carries:

* `MeasuredCost` (profiles written by `infercept profile`, e.g. the CPU ones): the T_fwd grid as the
  profile's own interpolation gives it (`Profile.t_fwd_s` of an unrefined copy), plus what the
  profile's decode steps (`extra.decode`: B requests decoding at context C took D(B, C)) measured
  beyond it: for the scheduled requests (the step's total, interpolated in B between the measured batch
  sizes), and per token of earlier context they attend to (the grid is a lone prompt, with no earlier
  context). A decode step
  at a measured batch size and context thus takes exactly the measured D, and a lone prompt of n
  tokens T_fwd(n) more than a one-token step: the profiler's own definition of T_fwd (time to first
  token of n tokens less that of one token).
* `RooflineCost` (profiles with `extra.roofline`, derived in `gpu_profiles.py`): per layer, every
  GEMM takes the longer of reading its weights and computing its tiles (wave-quantized on the GPU's
  SMs), attention the longer of reading the KV it attends to and its FLOPs, plus the tensor-parallel
  all-reduces and a fixed per-step overhead.

A CPU's cache cliff (`KVSpill`, measured CPU profiles that carry `extra.decode_spill`): on the bench
machine a decode step grows smoothly with batch and context while the KV it reads fits the last-level
cache with the weights beside it, and jumps (1.5-4x) once it does not (`results/sim/decode_context/`:
the tiny model on a 32 MB L3 jumps between 52 and 56 MB of KV per step). A step reading more KV than
the threshold costs a fitted constant more than the profile says. Opt-in (`--cache-cliff`): charged in
the bench's replay it makes the bound's 8 and 12 req/s runs 2-2.5x slower than measured, so the bench's
own batches do not pay it as the microbenchmark's lockstep decodes do (see that folder's README).

Copies (swap out and in) cost bytes / bandwidth per direction. On a GPU (or the CPU engine's emulated
link) they run beside the forward pass and the step lasts max(forward, copies), which is what the
swap connector's link emulation sleeps for; on a plain CPU they share the cores: forward + copies.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engine_adapter.policy.profile import Profile

_DECODE_KEY = re.compile(r"batch(\d+)_ctx(\d+)_s$")


@dataclass(frozen=True)
class StepLoad:
    """What a step schedules, in aggregate."""

    tokens: int  # query tokens
    requests: int  # requests with tokens in the step
    context: int  # sum over those requests of the tokens already in their KV (read by attention)
    pairs: int  # (query, key) pairs attention computes: sum of q * c + q * (q + 1) / 2
    cross: int = 0  # of those, chunks' pairs with earlier context: sum of q * c over requests with q > 1
    chunks: int = 0  # requests with more than one query token (prompts, chunks of them, recomputes)


class StepCost(Protocol):
    def forward_s(self, load: StepLoad) -> float: ...


def pristine(profile: Profile) -> Profile:
    """A copy whose online refinement (`Profile.observe`) is its own: the intercept core refines the
    profile it uses, and that must never change what the simulated device costs."""
    return dataclasses.replace(profile, _ratios={})


@dataclass(frozen=True)
class KVSpill:
    """A step that reads more than `threshold_bytes` of KV costs `jump_s` more (measured on the bench CPU:
    past the cliff a step costs a roughly constant extra, not one in proportion to the KV it reads)."""

    threshold_bytes: float
    jump_s: float
    source: str = ""

    def extra_s(self, kv_bytes: float) -> float:
        return self.jump_s if kv_bytes > self.threshold_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KVSpill:
        return cls(float(d["threshold_bytes"]), float(d["jump_s"]), str(d.get("source", "")))

    @classmethod
    def fit(cls, rows: Sequence[tuple[int, int, float]], kv_bytes_per_token: int, source: str = "") -> KVSpill | None:
        """From decode steps `(batch, context, seconds)`: below a threshold a step is a + b B + c B C
        (least squares); above it, that plus a constant jump (the mean residual). The threshold (midway
        between two measured KV sizes, at least three points on each side) is the one with the least
        squared error. None when no split more than halves the error of one smooth model over all the
        points, or the jump is under 5% of the median step (no cliff measured)."""
        pts = sorted((b * c * kv_bytes_per_token, b, c, t) for b, c, t in rows)

        def smooth(sub: Sequence[tuple[float, int, int, float]]) -> tuple[_DecodeFit, float]:
            fit = _DecodeFit.of([(b, c, t) for _, b, c, t in sub])
            return fit, sum((t - fit(b, c)) ** 2 for _, b, c, t in sub)

        if len(pts) < 6:
            return None
        _, sse_all = smooth(pts)
        best: tuple[float, float, float] | None = None  # (sse, threshold, jump)
        for i in range(3, len(pts) - 2):
            if pts[i][0] == pts[i - 1][0]:
                continue
            fit, sse = smooth(pts[:i])
            above = [t - fit(b, c) for _, b, c, t in pts[i:]]
            jump = sum(above) / len(above)
            sse += sum((r - jump) ** 2 for r in above)
            if jump > 0 and (best is None or sse < best[0]):
                best = (sse, (pts[i - 1][0] + pts[i][0]) / 2, jump)
        median_step = sorted(t for *_, t in pts)[len(pts) // 2]
        if best is None or best[0] >= 0.5 * sse_all or best[2] < 0.05 * median_step:
            return None
        return cls(best[1], best[2], source)


def context_shares(rows: Sequence[tuple[int, int, float]], profile: Profile, below_bytes: float | None = None) -> dict[int, float]:
    """What the profile's one-context decode steps cannot say, from decode steps measured over batch x
    context (`(batch, context, seconds)`, those reading at most `below_bytes` of KV: short of a cache
    cliff): per batch size B the profile measured at context C, the share of its excess over T_fwd(B)
    that grows with context, c B C / (D(B, C) - T_fwd(B)), with D = a + b B + c B C fitted on the rows.
    A ratio, so it carries over between days when the machine runs faster or slower as a whole."""
    m = profile.kv_bytes_per_token
    sub = [r for r in rows if below_bytes is None or r[0] * r[1] * m <= below_bytes]
    if len(sub) < 3:
        return {}
    fit = _DecodeFit.of(sub)
    out: dict[int, float] = {}
    for b, ctx, _ in profile_decode_steps(profile):
        excess = fit(b, ctx) - profile.t_fwd_s(b)
        out[b] = min(1.0, max(0.0, fit.c * b * ctx / excess)) if excess > 0 else 0.0
    return out


def prefill_step_s(profile: Profile, given: float | None = None) -> float:
    """The measured cost model's fixed step cost per prefilled request: `given`, else the profile's
    `extra.chunk_step_s` (`infercept profile` measures it), else 0. `MeasuredCost` charges it and
    `SimBench.frontend` takes it out of the front end's share."""
    chunk = profile.extra.get("chunk_step_s", 0.0) if given is None else given
    if not 0.0 <= float(chunk) < 1.0:
        raise ValueError(f"chunk step cost {chunk} s: a fixed cost per prefilled request, in [0, 1) s")
    return float(chunk)


def profile_decode_steps(profile: Profile) -> list[tuple[int, int, float]]:
    """The profile's measured decode steps `(batch, context, seconds)` (`extra.decode`, keys `batchB_ctxC_s`)."""
    steps = []
    for key, seconds in (profile.extra.get("decode") or {}).items():
        m = _DECODE_KEY.match(str(key))
        if m is not None and seconds is not None and math.isfinite(float(seconds)):
            steps.append((int(m.group(1)), int(m.group(2)), float(seconds)))
    return steps


@dataclass(frozen=True)
class _DecodeFit:
    """A decode step of B requests at context C as a + b B + c B C, least squares over measured steps."""

    a: float
    b: float
    c: float

    @classmethod
    def of(cls, rows: Sequence[tuple[int, int, float]]) -> _DecodeFit:
        return cls(*_lstsq([(1.0, float(b), float(b * c)) for b, c, _ in rows], [t for *_, t in rows]))

    def __call__(self, batch: int, context: int) -> float:
        return self.a + self.b * batch + self.c * batch * context


def _lstsq(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares by the normal equations, Gaussian elimination with partial pivoting."""
    n = len(xs[0])
    m = [[sum(r[i] * r[j] for r in xs) for j in range(n)] + [sum(r[i] * y for r, y in zip(xs, ys))] for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda i: abs(m[i][c]))
        m[c], m[p] = m[p], m[c]
        if m[c][c] == 0:
            return [0.0] * n
        for i in range(n):
            if i != c:
                f = m[i][c] / m[c][c]
                m[i] = [x - f * y for x, y in zip(m[i], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


class MeasuredCost:
    """T_fwd from the grid, plus what a decode step measured beyond it, e(B) = D(B, C) - T_fwd(B),
    split between a per-request cost and a cost per token of earlier context: a share `phi` of e(B)
    grows with the context each scheduled request attends to, the rest is per request (sampling,
    output processing: on a tiny CPU model the bulk of it). The profile measures one context length
    only, so `phi` is not in it: the profile's `extra.decode_context_share` if set, else the caller's."""

    def __init__(self, profile: Profile, context_share: float | Mapping[int, float] | None = None, pair_s: float | None = None,
                 spill: KVSpill | None = None, chunk_s: float | None = None) -> None:
        self.profile = pristine(profile)
        # A chunk of a prompt (chunked prefill, a recompute after a discard) attends to the context
        # before it too, which a lone prompt of the grid never does: its (query, earlier key) pairs cost
        # the grid's own quadratic term (`attention_pair_s`) unless given.
        self.pair_s = attention_pair_s(self.profile) if pair_s is None else float(pair_s)
        # A step pays a fixed cost per request it prefills (a prompt, a chunk of one, a resumed turn's
        # new tokens, a recompute): vLLM's prefill path. The grid hides it (T_fwd(n) is measured against
        # a one-token prompt, which pays it too) and the front end's share absorbs it (`SimBench.frontend`).
        self.chunk_s = prefill_step_s(self.profile, chunk_s)
        phi = context_share if context_share is not None else self.profile.extra.get("decode_context_share", 0.0)
        # One share for every batch size, or one per measured batch size (`context_shares`).
        shares = {int(b): float(x) for b, x in phi.items()} if isinstance(phi, Mapping) else {}
        default = float(phi) if not isinstance(phi, Mapping) else 0.0
        if not all(0.0 <= x <= 1.0 for x in [default, *shares.values()]):
            raise ValueError("decode context share must be within [0, 1]")
        self.context_share: float | dict[int, float] = shares or default
        # Per measured batch size B: the excess split into its request part (1 - phi) e(B) and its context
        # part phi e(B), both as totals for the step, interpolated in B. Not per request or per token: e(B) / B
        # falls steeply from B = 1 (the step's fixed cost), and interpolating it made a step of 3 requests
        # cost more than one of 8 (6.8 against 4.1 ms on the bench profile,
        # `results/bench/block-waits/step-diag/`).
        points: list[tuple[int, float, float, int]] = []
        for batch, ctx, seconds in profile_decode_steps(self.profile):
            excess = max(0.0, seconds - self.profile.t_fwd_s(batch))
            share = shares.get(batch, default)
            points.append((batch, (1 - share) * excess, share * excess, ctx))
        points.sort()
        self._batches = [b for b, *_ in points]
        self._request_part = [r for _, r, _, _ in points]
        self._context_part = [k for _, _, k, _ in points]
        self._context = [float(c) for *_, c in points]
        own = self.profile.extra.get("decode_spill")
        self.spill = spill if spill is not None else (KVSpill.from_dict(own) if own else None)

    def _interp(self, ys: list[float], requests: int) -> float:
        """Piecewise linear in B between the measured batch sizes, held outside them."""
        bs = self._batches
        if not bs:
            return 0.0
        if requests <= bs[0]:
            return ys[0]
        if requests >= bs[-1]:
            return ys[-1]
        i = bisect.bisect_left(bs, requests)
        b0, b1 = bs[i - 1], bs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (requests - b0) / (b1 - b0)

    def request_part_s(self, requests: int) -> float:
        """The step's cost for its B requests beyond the grid and their context: the measured totals
        interpolated in B; beyond the largest measured batch, that batch's cost per request times B."""
        bs = self._batches
        if bs and requests > bs[-1]:
            return self._request_part[-1] * requests / bs[-1]
        return self._interp(self._request_part, requests)

    def per_context_token_s(self, requests: int) -> float:
        """Per token of context the step's B requests attend to: the context part interpolated in B as a
        total over the measured context (B C), so B requests at that context pay exactly it; held beyond
        the measured batch sizes."""
        bs = self._batches
        if not bs:
            return 0.0
        b = min(max(requests, bs[0]), bs[-1])
        return self._interp(self._context_part, b) / (b * self._interp(self._context, b))

    def forward_s(self, load: StepLoad) -> float:
        if load.tokens <= 0:
            return 0.0
        b = load.requests
        t = (self.profile.t_fwd_s(load.tokens) + self.request_part_s(b) + load.context * self.per_context_token_s(b)
             + load.cross * self.pair_s + load.chunks * self.chunk_s)
        return t + self.spill.extra_s(load.context * self.profile.kv_bytes_per_token) if self.spill else t


def attention_pair_s(profile: Profile) -> float:
    """Seconds per (query, key) pair of attention on this device, from the T_fwd grid: the quadratic
    term of the least-squares fit T(n) = a + b n + k n (n + 1) / 2 over the grid's lone prompts (0 when
    the grid has fewer than three points or shows no quadratic growth)."""
    pts = list(zip(profile.fwd_tokens, profile.fwd_seconds))
    if len(pts) < 3:
        return 0.0
    coef = _lstsq([(1.0, float(n), n * (n + 1) / 2) for n, _ in pts], [t for _, t in pts])
    return max(0.0, coef[2])


@dataclass(frozen=True)
class Roofline:
    """A device and a model's per-device shapes (see `gpu_profiles.py` for where each number comes from)."""

    layers: int
    gemms: tuple[tuple[int, int], ...]  # (N, K) of each per-layer GEMM on one device
    lm_head: tuple[int, int]  # (N, K) of the output projection, for the sampled rows only
    attn_flops_per_pair: float  # per layer, per (query, key) pair, on one device (QK^T and PV)
    kv_bytes_per_token: int  # per layer, on one device
    sms: int
    tile: tuple[int, int]  # (M, N) output tile of the GEMM kernels
    peak_flops: float  # per device, dense bf16
    mma_efficiency: float  # fraction of peak a full tile sustains
    hbm_bytes_per_s: float
    hbm_efficiency: float
    fixed_s: float  # per step, outside the kernels (launches, sampling, scheduling)
    allreduce_per_layer: int = 0  # tensor-parallel all-reduces per layer (0: one device)
    allreduce_bus_bytes_per_s: float = 0.0
    allreduce_latency_s: float = 0.0
    tp: int = 1
    hidden: int = 0
    dtype_bytes: int = 2

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Roofline:
        kw = dict(d)
        kw["gemms"] = tuple(tuple(int(x) for x in g) for g in kw["gemms"])
        kw["lm_head"] = tuple(int(x) for x in kw["lm_head"])
        kw["tile"] = tuple(int(x) for x in kw["tile"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in kw.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gemms"] = [list(g) for g in self.gemms]
        d["lm_head"], d["tile"] = list(self.lm_head), list(self.tile)
        return d

    def gemm_s(self, rows: int, n: int, k: int) -> float:
        """One GEMM of `rows` x K by K x N: the longer of streaming its weights and computing its
        output tiles, which run in waves of one tile per SM (NVIDIA's wave quantization). As cuBLAS's
        heuristics do, skinny GEMMs (decode batches) use tiles only as tall as they need (16, 32, 64
        rows), and a GEMM with too few tiles to fill the SMs may split K (2, 4 or 8 ways, paying for
        the fp32 partial sums it writes and reads back): the fastest choice is taken."""
        if rows <= 0:
            return 0.0
        bw = self.hbm_bytes_per_s * self.hbm_efficiency
        mem = n * k * self.dtype_bytes / bw
        tm, tn = self.tile
        while tm > 16 and rows <= tm // 2:
            tm //= 2
        tiles = math.ceil(rows / tm) * math.ceil(n / tn)
        tile_s = 2 * tm * tn * k / (self.peak_flops / self.sms * self.mma_efficiency)
        best = math.inf
        for split in (1, 2, 4, 8):
            waves = math.ceil(tiles * split / self.sms)
            partials = 0.0 if split == 1 else 2 * rows * n * 4 * split / bw
            best = min(best, waves * tile_s / split + partials)
            if tiles * split >= self.sms:
                break
        return max(mem, best)

    def allreduce_s(self, rows: int) -> float:
        if self.tp <= 1 or self.allreduce_per_layer == 0 or rows <= 0:
            return 0.0
        size = rows * self.hidden * self.dtype_bytes
        # nccl-tests' bus bandwidth: a ring all-reduce moves 2 (p - 1) / p of the buffer per device.
        moved = size * 2 * (self.tp - 1) / self.tp
        return self.allreduce_per_layer * (self.allreduce_latency_s + moved / self.allreduce_bus_bytes_per_s)


class RooflineCost:
    def __init__(self, roofline: Roofline) -> None:
        self.r = roofline
        self._per_tokens: dict[int, float] = {}

    def _token_part_s(self, tokens: int) -> float:
        """Per-step time that depends only on the query tokens (memoized: steps repeat sizes)."""
        t = self._per_tokens.get(tokens)
        if t is None:
            r = self.r
            layer = sum(r.gemm_s(tokens, n, k) for n, k in r.gemms) + r.allreduce_s(tokens)
            t = r.fixed_s + r.layers * layer
            self._per_tokens[tokens] = t
        return t

    def forward_s(self, load: StepLoad) -> float:
        if load.tokens <= 0:
            return 0.0
        r = self.r
        attn_mem = load.context * r.kv_bytes_per_token / (r.hbm_bytes_per_s * r.hbm_efficiency)
        attn_flops = load.pairs * r.attn_flops_per_pair / (r.peak_flops * r.mma_efficiency)
        head = r.gemm_s(load.requests, *r.lm_head)
        return self._token_part_s(load.tokens) + r.layers * max(attn_mem, attn_flops) + head


def make_cost(profile: Profile, context_share: float | Mapping[int, float] | None = None, pair_s: float | None = None,
              spill: KVSpill | None = None, chunk_s: float | None = None) -> StepCost:
    roof = profile.extra.get("roofline")
    return RooflineCost(Roofline.from_dict(roof)) if roof else MeasuredCost(profile, context_share, pair_s, spill, chunk_s)


def read_decode_grid(path: str | Path) -> list[tuple[int, int, float]]:
    """Decode steps `(batch, context, seconds)` from a file `results/sim/decode_context/measure.py` writes
    (`rows`, or `runs[].rows`)."""
    d = json.loads(Path(path).read_text())
    rows = d.get("rows") or [r for run in d.get("runs", []) for r in run["rows"]]
    return [(int(r["batch"]), int(r["context"]), float(r["step_s"])) for r in rows]


def copies_s(profile: Profile, out_tokens: int, in_tokens: int) -> float:
    """Wall time of one step's swap copies at the profile's bandwidths."""
    return profile.t_swap_out_s(out_tokens) + profile.t_swap_in_s(in_tokens)


def overlapped(profile: Profile) -> bool:
    """Copies run beside the forward pass (GPU side stream, or an emulated link), rather than on the
    cores that compute it."""
    return profile.device != "cpu"


def step_s(forward: float, copies: float, overlap: bool, window: float | None = None) -> float:
    """A step's time: copies beside the forward pass hide behind its window (all of it unless given) and
    stall the step by what outlasts it; copies on the computing cores add to it."""
    if not overlap:
        return forward + copies
    return forward + max(0.0, copies - (forward if window is None else window))


def grid(cost: StepCost, tokens: Sequence[int]) -> list[float]:
    """T_fwd as `infercept profile` measures it: one prompt of n tokens, nothing else in the step."""
    return [cost.forward_s(StepLoad(n, 1, 0, n * (n + 1) // 2)) for n in tokens]
