"""`infercept bench`: the paper's evaluation on the embedded engine, policy against policy, one run.

Each configuration (a policy, or a policy with an estimator) gets its own engine; every configuration
replays the same seeded requests at each rate through the same path the gateway uses: a session whose
turns end at the workload's decode lengths (EOS ignored) and pause inside vLLM as an intercept of the
request's augmentation type (the `__turn_end__` hint), a replay executor that sleeps the sampled call
duration (times `--time-scale`), and a resume with the sampled number of returned tokens.

Why the default setting resembles the paper's A100 runs (see the JSON's `setting` for the numbers):
* model `tiny` (random 2-layer Llama, real tokenizer): on 2 CPU cores its forward time is what an
  A100 has for GPT-J relative to context: recomputing a 1.5k-token context costs ~5 decode steps of
  a batch of 8 (paper: ~3), and throughput per token saturates near S = 512 tokens (paper: 384);
* KV cache of 24k tokens = 12-16 of the workload's 1.5-2k-token contexts, so paused contexts compete
  for memory as the rate grows;
* swaps over an emulated 0.25 GB/s link (`swap_link_gbps`): a 1.5k-token context (1.5 MB here) takes
  ~6 ms, one decode step, as 690 MB of GPT-J KV over ~25 GB/s PCIe takes ~one A100 decode step;
  without it RAM-to-RAM copies would make swapping free;
* `--time-scale 0.1` shrinks call durations (a chatbot call: 2.9 s instead of 28.6 s). Iterations here
  take ~5-10 ms against ~30-50 ms on the A100, so a call spans about half as many iterations as in
  the paper; a larger scale is closer but the sweep then outlasts 45 minutes on 2 cores (requests
  live as long as their calls: the run waits for them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.workload import (
    PRIORS,
    WORKLOADS,
    Request,
    ShareGPT,
    generate,
    load_table1,
    random_tokens,
)
from engine_adapter.policy.table import DEFAULT_TTL_S

REPO = Path(__file__).resolve().parent.parent
TABLE1 = load_table1()


@dataclass(frozen=True)
class Variant:
    label: str  # as on the command line
    policy: str
    estimator: str = "prior"
    zero_calls: bool = False  # the bound: calls take no time ...
    unlimited_kv: bool = False  # ... and KV never runs out
    oracle: bool = False  # tag each pause with its true duration


VARIANTS: dict[str, Variant] = {v.label: v for v in (
    Variant("discard", "discard"),
    Variant("vllm-apc", "vllm-apc"),
    Variant("improved-discard", "improved-discard"),
    Variant("preserve", "preserve"),
    Variant("swap", "swap"),
    Variant("ttl", "ttl"),
    Variant("infercept-paper", "infercept", estimator="dynamic"),
    Variant("infercept", "infercept", estimator="prior"),
    Variant("oracle-duration", "infercept", estimator="oracle", oracle=True),
    Variant("no-intercept-limit", "preserve", zero_calls=True, unlimited_kv=True),
)}
DEFAULT_POLICIES = tuple(VARIANTS)
QUICK_POLICIES = ("discard", "vllm-apc", "infercept", "no-intercept-limit")
ABLATION = (("improved-discard", "improved-discard"), ("+ budgeted swap", "swap"),
            ("+ min-waste, paper estimate", "infercept-paper"), ("+ min-waste, prior estimate", "infercept"))


@dataclass
class Setting:
    model: str = "tiny"
    dtype: str = "float32"
    block_size: int = 32
    kv_tokens: int = 24576
    max_model_len: int = 4096
    max_num_seqs: int = 64
    swap_space_gib: float = 1.0
    swap_link_gbps: float | None = 0.25
    time_scale: float = 0.1
    context_scale: float = 1.0
    max_context: int = 3500
    drain_s: float = 45.0  # after the last arrival, wait at most this long for requests to finish
    priors_path: str | None = None  # Table 1 with durations scaled by time_scale (written by bench())
    # The tiny model's measured profile (T_fwd grid, S = 512 tokens, M): what infercept's equations use.
    profile: str | None = str(REPO / "configs" / "profiles" / "tiny-cpu-bench.json")

    def engine_config(self, v: Variant) -> Any:
        from engine_adapter.config import EngineConfig

        blocks = self.kv_tokens // self.block_size + 1
        if v.unlimited_kv:
            blocks *= 16
        return EngineConfig(
            model=self.model, policy=v.policy, dtype=self.dtype, block_size=self.block_size, num_kv_blocks=blocks,
            max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs, swap_space_gib=self.swap_space_gib,
            swap_link_gbps=self.swap_link_gbps, estimator=v.estimator, kv_cache_gib=1.0,
            augmentation_priors=self.priors_path, profile=self.profile if self.model == "tiny" else None,
            # Continuum-style TTLs are set from call durations: scaled with them.
            ttl_s={k: t * self.time_scale for k, t in DEFAULT_TTL_S.items()},
        )


@dataclass
class Outcome:
    rid: int
    aug_type: str
    arrival_s: float
    end_s: float | None = None
    first_token_s: float | None = None
    call_s: float = 0.0
    output_tokens: int = 0
    error: str | None = None

    @property
    def normalized_latency(self) -> float | None:
        if self.end_s is None or not self.output_tokens:
            return None
        return (self.end_s - self.arrival_s - self.call_s) / self.output_tokens


async def replay(engine: Any, req: Request, v: Variant, s: Setting, t0: float, out: Outcome) -> None:
    """One request: turns end at the workload's decode lengths and pause as intercepts of its type."""
    from engine_adapter.events import TokenDelta, TurnEnd
    from engine_adapter.hints import TURN_END_KEY, ToolHint

    table_mean = TABLE1[req.aug_type].duration_s[0]
    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.monotonic()))
    out.arrival_s = time.monotonic()
    rng = random.Random(req.rid)
    session = engine.open_session(tools={TURN_END_KEY: ToolHint(req.aug_type, table_mean * s.time_scale)},
                                  max_tokens=8, ignore_eos=True, seed=req.rid)
    try:
        tokens: list[int] = list(req.prompt)
        steps = [(c.decode_tokens, c) for c in req.calls] + [(req.final_decode_tokens, None)]
        for decode, call in steps:
            async for ev in session.turn(tokens, max_tokens=decode):
                if isinstance(ev, TokenDelta):
                    if out.first_token_s is None:
                        out.first_token_s = time.monotonic()
                elif isinstance(ev, TurnEnd):
                    out.output_tokens += len(ev.token_ids)
            if call is None:
                break
            duration = 0.0 if v.zero_calls else call.duration_s * s.time_scale
            if v.oracle:
                await engine.tag(session.id, req.aug_type, duration)
            c0 = time.monotonic()
            await asyncio.sleep(duration)
            out.call_s += time.monotonic() - c0
            tokens = random_tokens(rng, call.returned_tokens)
        out.end_s = time.monotonic()
    except Exception as e:  # recorded, not fatal: a failed request counts as not completed
        out.error = f"{type(e).__name__}: {e}"
    finally:
        await session.close()


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(len(xs) - 1, int(k) + 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(outs: list[Outcome], stats0: dict[str, Any], stats1: dict[str, Any], wall_s: float, cutoff_s: float) -> dict[str, Any]:
    done = [o for o in outs if o.end_s is not None]
    nl = [o.normalized_latency for o in done if o.normalized_latency is not None]
    # Requests still running at the cutoff (an overloaded engine) count with a lower bound of their
    # latency, so an overloaded run cannot look good by finishing only its easy requests.
    nl += [(cutoff_s - o.arrival_s - o.call_s) / max(1, o.output_tokens) for o in outs if o.end_s is None and not o.error]
    ttft = [o.first_token_s - o.arrival_s for o in done if o.first_token_s is not None]
    span = (max(o.end_s for o in done) - min(o.arrival_s for o in outs)) if done else wall_s
    w0, w1 = stats0["waste"], stats1["waste"]
    waste = {k: {"token_s": w1["by_kind"][k]["token_s"] - w0["by_kind"][k]["token_s"],
                 "gb_min": w1["by_kind"][k]["gb_min"] - w0["by_kind"][k]["gb_min"]} for k in w1["by_kind"]}
    capacity_tokens = stats1["blocks"]["total"] * stats1["block_size"]
    capacity_token_s = capacity_tokens * wall_s
    fwd = w1["forward_s"] - w0["forward_s"]
    rec = w1["recompute_forward_s"] - w0["recompute_forward_s"]
    t0, t1 = stats0["totals"], stats1["totals"]
    return {
        "requests": len(outs), "completed": len(done), "failed": sum(1 for o in outs if o.error),
        "errors": sorted({o.error for o in outs if o.error})[:5],
        "normalized_latency_s": {"median": _pct(nl, 0.5), "p90": _pct(nl, 0.9), "mean": statistics.fmean(nl) if nl else None},
        "ttft_s": {"median": _pct(ttft, 0.5), "p90": _pct(ttft, 0.9)},
        "throughput_rps": len(done) / span if span > 0 else 0.0,
        "wall_s": wall_s,
        "waste": waste,
        "waste_total_token_s": sum(v["token_s"] for v in waste.values()),
        "waste_share_of_capacity_time": sum(v["token_s"] for v in waste.values()) / capacity_token_s if capacity_token_s else None,
        "waste_share_by_kind": {k: v["token_s"] / capacity_token_s for k, v in waste.items()} if capacity_token_s else None,
        "recompute_share_of_forward": rec / fwd if fwd else 0.0,
        "forward_s": fwd,
        "swap_stall_s": w1["swap_stall_s"] - w0["swap_stall_s"],
        "intercepts": t1["intercepts"] - t0["intercepts"],
        "recomputed_tokens": t1["recomputed_tokens"] - t0["recomputed_tokens"],
        "prefix_hit_tokens": t1["prefix_hit_tokens"] - t0["prefix_hit_tokens"],
        "swapped_out_tokens": t1.get("swapped_out_tokens", 0) - t0.get("swapped_out_tokens", 0),
        "capacity_tokens": capacity_tokens,
    }


async def unloaded_latency(engine: Any, reqs: list[Request], s: Setting, n: int = 10) -> dict[str, Any]:
    """The SLO's reference: requests run one at a time with zero-time calls, on an idle engine."""
    bound = VARIANTS["no-intercept-limit"]
    lat = []
    for r in reqs[:n]:
        o = Outcome(r.rid, r.aug_type, 0.0)
        await replay(engine, dataclasses.replace(r, arrival_s=0.0), bound, s, time.monotonic(), o)
        if o.normalized_latency is not None:
            lat.append(o.normalized_latency)
    return {"requests": len(lat), "median_s": _pct(lat, 0.5), "p90_s": _pct(lat, 0.9)}


async def run_variant(v: Variant, s: Setting, workloads: dict[float, list[Request]], progress: Any,
                      calibrate: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    from engine_adapter.engine import InterceptEngine

    engine = InterceptEngine(s.engine_config(v))
    await engine.start()
    results: dict[str, Any] = {}
    try:
        # Warm-up (compilation caches, first-iteration costs) outside the measurement.
        warm = engine.open_session(max_tokens=4, ignore_eos=True)
        async for _ in warm.turn(list(range(1000, 1200)), max_tokens=4):
            pass
        await warm.close()
        unloaded = await unloaded_latency(engine, next(iter(workloads.values())), s) if calibrate else None
        for rate, reqs in workloads.items():
            stats0 = dataclasses.asdict(await engine.stats())
            outs = [Outcome(r.rid, r.aug_type, r.arrival_s) for r in reqs]
            t0 = time.monotonic() + 0.05
            tasks = [asyncio.create_task(replay(engine, r, v, s, t0, o)) for r, o in zip(reqs, outs)]
            last_arrival = max((r.arrival_s for r in reqs), default=0.0)
            _, pending = await asyncio.wait(tasks, timeout=last_arrival + s.drain_s)
            cutoff = time.monotonic()
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            wall = time.monotonic() - t0
            stats1 = dataclasses.asdict(await engine.stats())
            results[f"{rate:g}"] = summarize(outs, stats0, stats1, wall, cutoff) | {"rate": rate, "timed_out": len(pending)}
            counts = dataclasses.asdict(await engine.check_integrity())
            results[f"{rate:g}"]["kv_integrity_after"] = counts
            progress.update(1)
        info = dataclasses.asdict(await engine.stats())
    finally:
        await engine.shutdown()
    return results, {"policy": info["policy"], "blocks": info["blocks"], "block_size": info["block_size"], "unloaded": unloaded,
                     "swap_profile": info["profile"]["source"], "saturation_tokens": info["profile"]["saturation_tokens"]}


def max_rate_at_slo(points: list[tuple[float, float | None]], slo: float) -> tuple[float, bool]:
    """Highest rate whose median normalized latency is within the SLO, interpolated linearly between
    the last rate that meets it and the first that does not. (rate, censored): censored means every
    rate met the SLO, so the true limit is higher than measured."""
    points = sorted(points)
    best = 0.0
    prev: tuple[float, float] | None = None
    for rate, lat in points:
        if lat is None or lat > slo:
            if prev is not None and lat is not None and lat > prev[1]:
                frac = (slo - prev[1]) / (lat - prev[1])
                return prev[0] + frac * (rate - prev[0]), False
            return best, False
        best, prev = rate, (rate, lat)
    return best, True


def headline(per_policy: dict[str, dict[str, Any]], slo_factor: float,
             unloaded: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Max rate at SLO per policy and its ratios. The SLO is `slo_factor` x the unloaded normalized
    latency (requests one at a time, zero-time calls); without that measurement, x the lowest rate's
    median of the bound (or of the first policy)."""
    if unloaded and unloaded.get("median_s"):
        base, reference = unloaded["median_s"], f"unloaded median normalized latency ({unloaded['requests']} requests one at a time)"
    else:
        ref_policy = "no-intercept-limit" if "no-intercept-limit" in per_policy else next(iter(per_policy))
        lowest = min(per_policy[ref_policy].values(), key=lambda r: r["rate"])
        base, reference = lowest["normalized_latency_s"]["median"], f"{ref_policy} median normalized latency at rate {lowest['rate']:g}"
    slo = slo_factor * base if base else float("inf")
    rates: dict[str, tuple[float, bool]] = {}
    for label, runs in per_policy.items():
        rates[label] = max_rate_at_slo([(r["rate"], r["normalized_latency_s"]["median"]) for r in runs.values()], slo)

    def ratio(a: str, b: str) -> float | None:
        if a not in rates or b not in rates or rates[b][0] <= 0:
            return None
        return rates[a][0] / rates[b][0]

    head = {label: {"max_rate_at_slo": r, "censored": c, "ratio_vs_discard": ratio(label, "discard"),
                    "ratio_vs_vllm-apc": ratio(label, "vllm-apc"), "ratio_vs_bound": ratio(label, "no-intercept-limit")}
            for label, (r, c) in rates.items()}
    slo_info = {"slo_factor": slo_factor, "reference": reference, "unloaded_normalized_latency_s": base,
                "slo_normalized_latency_s": slo}
    return head, slo_info


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def plots(result: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    per = result["results"]
    slo = result["slo"]["slo_normalized_latency_s"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in per.items():
        pts = sorted((r["rate"], r["normalized_latency_s"]["median"]) for r in runs.values() if r["normalized_latency_s"]["median"])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] * 1000 for p in pts], marker="o", label=label,
                    linewidth=2.5 if label.startswith("infercept") else 1.2)
    if slo and slo != float("inf"):
        ax.axhline(slo * 1000, color="grey", linestyle="--", linewidth=1, label=f"SLO ({result['slo']['slo_factor']:g}x unloaded)")
    ax.set_yscale("log")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("median normalized latency (ms/token)")
    ax.set_title(f"workload {result['workload']}: normalized latency vs rate (cf. paper Fig. 2)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fig2_latency_vs_rate.png", dpi=120)
    plt.close(fig)
    made.append("fig2_latency_vs_rate.png")

    head = result["headline"]
    steps = [(name, head[label]["max_rate_at_slo"]) for name, label in ABLATION if label in head]
    if steps:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.bar(range(len(steps)), [r for _, r in steps], color=["#9aa5b1", "#7a8ca3", "#4f7cac", "#2f5d8a"][: len(steps)])
        ax.set_xticks(range(len(steps)), [n for n, _ in steps], rotation=15, fontsize=8)
        ax.set_ylabel("max rate at SLO (req/s)")
        ax.set_title("ablation: adding InferCept's techniques (cf. paper Fig. 3)")
        fig.tight_layout()
        fig.savefig(out / "fig3_ablation.png", dpi=120)
        plt.close(fig)
        made.append("fig3_ablation.png")
    return made


async def bench(workload: str, labels: Sequence[str], rates: Sequence[float], duration_s: float, seed: int,
                s: Setting, out: Path, slo_factor: float, command: str) -> dict[str, Any]:
    from tqdm import tqdm

    from engine_adapter.models import resolve_model

    out.mkdir(parents=True, exist_ok=True)
    # The engine's duration priors in the same (scaled) time as the calls it will see.
    import yaml

    doc = yaml.safe_load(PRIORS.read_text())
    for st in doc["types"].values():
        st["duration_s"] = [x * s.time_scale for x in st["duration_s"]]
    s.priors_path = str(out / "priors_scaled.yaml")
    Path(s.priors_path).write_text(yaml.safe_dump(doc))
    model_path = resolve_model(s.model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    sharegpt = ShareGPT().texts if workload in ("chatbot", "mixed") and ShareGPT.available() else []
    workloads = {r: generate(workload, r, duration_s, seed, context_scale=s.context_scale, max_context=s.max_context,
                             encode=lambda t: tok.encode(t, add_special_tokens=False), sharegpt=sharegpt) for r in rates}
    per_policy: dict[str, Any] = {}
    engines: dict[str, Any] = {}
    t_start = time.time()
    with tqdm(total=len(labels) * len(rates), desc="bench", unit="run", file=sys.stderr) as bar:
        for i, label in enumerate(labels):
            bar.set_postfix_str(label)
            per_policy[label], engines[label] = await run_variant(VARIANTS[label], s, workloads, bar, calibrate=i == 0)
    head, slo_info = headline(per_policy, slo_factor, engines[labels[0]]["unloaded"])
    prof_path = Path(s.profile) if s.profile and s.model == "tiny" else REPO / "configs" / "profiles" / f"{s.model}-cpu.json"
    prof = json.loads(prof_path.read_text()) if prof_path.is_file() else None
    result: dict[str, Any] = {
        "command": command, "commit": git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
        "elapsed_s": time.time() - t_start,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "processor": platform.processor()},
        "workload": workload, "rates": list(rates), "duration_s": duration_s, "seed": seed, "policies": list(labels),
        "setting": dataclasses.asdict(s) | {
            "kv_capacity_tokens": s.kv_tokens,
            "kv_capacity_contexts_at_mean": {t: round(s.kv_tokens / (st * s.context_scale), 1) for t, st in
                                             (("math", 1422), ("qa", 1846), ("ve", 2185), ("chat", 753), ("image", 1247), ("tts", 1251))},
            "profile": ({"t_fwd_ms": dict(zip(map(str, prof["fwd_tokens"]), [round(x * 1000, 2) for x in prof["fwd_seconds"]])),
                         "saturation_tokens": prof["saturation_tokens"], "kv_bytes_per_token": prof["kv_bytes_per_token"],
                         "decode": prof.get("extra", {}).get("decode")} if prof else None),
            "sharegpt_prompts": len(sharegpt),
        },
        "requests_per_rate": {f"{r:g}": len(w) for r, w in workloads.items()},
        "request_mix": {f"{r:g}": {t: sum(1 for q in w if q.aug_type == t) for t in WORKLOADS[workload]} for r, w in workloads.items()},
        "engines": engines,
        "slo": slo_info,
        "headline": head,
        "results": per_policy,
    }
    result["plots"] = plots(result, out)
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=lambda o: None if o == float("inf") else str(o)))
    return result


def print_table(result: dict[str, Any]) -> None:
    print(f"\nSLO: median normalized latency <= {result['slo']['slo_normalized_latency_s'] * 1000:.2f} ms/token "
          f"({result['slo']['slo_factor']:g}x {result['slo']['reference']})")
    print(f"{'policy':22s} {'max rate@SLO':>12s} {'vs discard':>10s} {'vs vllm-apc':>11s} {'vs bound':>9s}  waste share  recompute share")
    for label, h in result["headline"].items():
        runs = result["results"][label]
        hi = max(runs.values(), key=lambda r: r["rate"])

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        mark = "+" if h["censored"] else " "
        ws = hi["waste_share_of_capacity_time"]
        print(f"{label:22s} {h['max_rate_at_slo']:11.2f}{mark} {f(h['ratio_vs_discard']):>10s} {f(h['ratio_vs_vllm-apc']):>11s} "
              f"{f(h['ratio_vs_bound']):>9s}  {ws * 100 if ws is not None else float('nan'):10.2f}%  {hi['recompute_share_of_forward'] * 100:8.1f}%")
    print("(+: met the SLO at every rate tried; waste and recompute shares at the highest rate)")


def main(args: Any) -> int:
    labels = [x.strip() for x in (args.policies or ",".join(QUICK_POLICIES if args.quick else DEFAULT_POLICIES)).split(",") if x.strip()]
    unknown = [x for x in labels if x not in VARIANTS]
    if unknown:
        print(f"error: unknown policies {unknown}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    s = Setting()
    if args.time_scale is not None:
        s.time_scale = args.time_scale
    if args.kv_tokens:
        s.kv_tokens = args.kv_tokens
    if args.link_gbps is not None:
        s.swap_link_gbps = args.link_gbps or None
    if args.model:
        s.model = args.model
    if args.quick:
        rates = [float(r) for r in (args.rates or "4").split(",")]
        duration = args.duration or 6.0
        if args.time_scale is None:
            s.time_scale = 0.02
        s.drain_s = 30.0
    else:
        rates = [float(r) for r in (args.rates or "3,6,9,12").split(",")]
        duration = args.duration or 10.0
    if any(r <= 0 for r in rates):
        print("error: rates must be positive", file=sys.stderr)
        return 2
    command = "infercept " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("infercept") else " ".join(sys.argv)
    result = asyncio.run(bench(args.workload, labels, rates, duration, args.seed, s, Path(args.out), args.slo_factor, command))
    print_table(result)
    print(f"\nwrote {Path(args.out) / 'bench.json'} and {', '.join(result['plots'])} in {result['elapsed_s']:.0f} s")
    return 0
