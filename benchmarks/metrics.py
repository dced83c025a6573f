"""The benchmark's measures, pure (no engine): per-request outcomes, one run's summary, the maximum rate at
the SLO, and the headline over seeds. The simulator imports the same definitions.

* normalized latency of a request: (finish - arrival - time spent in its calls) / output tokens, the
  paper's metric; a request still running at the cutoff counts with a lower bound of it;
* job completion time (JCT): finish - arrival, calls included (as Continuum/CacheTTL report it);
* memory waste: token-seconds of KV by kind (preserved idle, recompute, swap stall), as a share of one
  common denominator for every policy: the real KV capacity (tokens) x the run's wall time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One turn of a request (a prompt or a call's return, then decoding up to the next pause): where a
    request's engine time goes. Times in seconds; `sent_s` from the run's start."""

    rid: int
    aug_type: str
    index: int  # 0: the request's first turn (admission); > 0: a resume after a call
    in_tokens: int
    out_tokens: int
    sent_s: float
    first_s: float  # from sending the turn to its first token (the turn's end if it produced none)
    total_s: float  # from sending the turn to its end

    @property
    def decode_per_token_s(self) -> float | None:
        """Decode time per token after the first one; None for a turn of one token or none."""
        return (self.total_s - self.first_s) / (self.out_tokens - 1) if self.out_tokens > 1 else None


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
    turns: list[Turn] = field(default_factory=list)

    @property
    def normalized_latency(self) -> float | None:
        if self.end_s is None or not self.output_tokens:
            return None
        return (self.end_s - self.arrival_s - self.call_s) / self.output_tokens

    @property
    def jct_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.arrival_s


def pct(xs: Iterable[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no data."""
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(len(xs) - 1, int(k) + 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def turn_timing(turns: Iterable[Turn]) -> dict[str, Any]:
    """Where turn time goes: new requests' first token (admission, queueing for memory included), resumed
    turns' first token (the resume: preserved, swapped in or recomputed), and decode time per token after
    the first (which grows with batch size on a CPU). Medians and p90s in seconds."""
    turns = list(turns)
    new = [t.first_s for t in turns if t.index == 0]
    resume = [t.first_s for t in turns if t.index > 0]
    decode = [d for d in (t.decode_per_token_s for t in turns) if d is not None]
    out = sum(t.out_tokens for t in turns)
    return {"turns": len(turns),
            "new_first_token_s": {"median": pct(new, 0.5), "p90": pct(new, 0.9)},
            "resume_first_token_s": {"median": pct(resume, 0.5), "p90": pct(resume, 0.9)},
            "decode_per_token_s": {"median": pct(decode, 0.5), "p90": pct(decode, 0.9)},
            "turn_time_per_output_token_s": sum(t.total_s for t in turns) / out if out else None}


def summarize(outs: Sequence[Outcome], stats0: Mapping[str, Any], stats1: Mapping[str, Any], wall_s: float,
              cutoff_s: float, capacity_tokens: int) -> dict[str, Any]:
    """One run's figures from its outcomes and the engine's stats before and after (as dicts).
    `capacity_tokens` is the waste shares' denominator (with `wall_s`): the same for every policy."""
    done = [o for o in outs if o.end_s is not None]
    running = [o for o in outs if o.end_s is None and not o.error]
    nl = [x for x in (o.normalized_latency for o in done) if x is not None]
    # Requests still running at the cutoff (an overloaded engine) count with a lower bound of their
    # latency, so an overloaded run cannot look good by finishing only its easy requests.
    nl += [(cutoff_s - o.arrival_s - o.call_s) / max(1, o.output_tokens) for o in running]
    jct = [x for x in (o.jct_s for o in done) if x is not None] + [cutoff_s - o.arrival_s for o in running]
    ttft = [o.first_token_s - o.arrival_s for o in done if o.first_token_s is not None]
    span = (max(o.end_s for o in done) - min(o.arrival_s for o in outs)) if done else wall_s  # type: ignore[type-var]
    w0, w1 = stats0["waste"], stats1["waste"]
    waste = {k: {"token_s": w1["by_kind"][k]["token_s"] - w0["by_kind"][k]["token_s"],
                 "gb_min": w1["by_kind"][k]["gb_min"] - w0["by_kind"][k]["gb_min"]} for k in w1["by_kind"]}
    denom = capacity_tokens * wall_s
    fwd = w1["forward_s"] - w0["forward_s"]
    rec = w1["recompute_forward_s"] - w0["recompute_forward_s"]
    t0, t1 = stats0["totals"], stats1["totals"]
    return {
        "requests": len(outs), "completed": len(done), "failed": sum(1 for o in outs if o.error),
        "errors": sorted({o.error for o in outs if o.error})[:5],
        "normalized_latency_s": {"median": pct(nl, 0.5), "p90": pct(nl, 0.9), "mean": statistics.fmean(nl) if nl else None},
        "jct_s": {"mean": statistics.fmean(jct) if jct else None, "p90": pct(jct, 0.9)},
        "ttft_s": {"median": pct(ttft, 0.5), "p90": pct(ttft, 0.9)},
        "turn_timing": turn_timing(t for o in outs for t in o.turns),
        "throughput_rps": len(done) / span if span > 0 else 0.0,
        "wall_s": wall_s,
        "waste": waste,
        "waste_total_token_s": sum(v["token_s"] for v in waste.values()),
        "capacity_tokens": capacity_tokens,
        "waste_share_of_capacity_time": sum(v["token_s"] for v in waste.values()) / denom if denom else None,
        "waste_share_by_kind": {k: v["token_s"] / denom for k, v in waste.items()} if denom else None,
        "recompute_share_of_forward": rec / fwd if fwd else 0.0,
        "forward_s": fwd,
        "swap_stall_s": w1["swap_stall_s"] - w0["swap_stall_s"],
        # Steps whose stall the workers measured (the others' was estimated from the profile's bandwidth).
        "swap_stall_measured_steps": w1.get("swap_stall_measured_steps", 0) - w0.get("swap_stall_measured_steps", 0),
        **{k: t1.get(k, 0) - t0.get(k, 0) for k in (
            "intercepts", "recomputed_tokens", "prefix_hit_tokens", "swapped_out_tokens", "swapped_in_tokens",
            "demoted", "pressure_swaps", "discarded", "ttl_expired", "swap_fallbacks")},
        "by_type": by_type(outs, cutoff_s, t0.get("by_type", {}), t1.get("by_type", {})),
    }


def by_type(outs: Sequence[Outcome], cutoff_s: float, t0: Mapping[str, Mapping[str, float]],
            t1: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """Per augmentation type: requests, unfinished ones, median normalized latency, and what the engine
    did with the type's paused contexts during the run (preserved token-seconds, recomputed tokens, ...)."""
    out: dict[str, dict[str, Any]] = {}
    for typ in sorted({o.aug_type for o in outs} | set(t1)):
        mine = [o for o in outs if o.aug_type == typ]
        nl = [x for x in (o.normalized_latency for o in mine) if x is not None]
        nl += [(cutoff_s - o.arrival_s - o.call_s) / max(1, o.output_tokens) for o in mine if o.end_s is None and not o.error]
        engine = {k: v - t0.get(typ, {}).get(k, 0) for k, v in t1.get(typ, {}).items()}
        out[typ] = {"requests": len(mine), "unfinished": sum(1 for o in mine if o.end_s is None),
                    "normalized_latency_median_s": pct(nl, 0.5), **engine}
    return out


def max_rate_at_slo(points: Sequence[tuple[float, float | None]], slo: float) -> tuple[float, bool]:
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


BOUND = "unlimited-kv"
RATIO_REFS = ("discard", "vllm-apc", "ttl", BOUND)


def headline(runs: Mapping[str, Mapping[int, Mapping[str, Any]]], slo_s: float) -> dict[str, dict[str, Any]]:
    """Per policy: the max rate at the SLO for each seed and its median, min and max over seeds; ratios
    to the references (median vs median); the waste share and mean JCT at the highest rate it sustained
    (median over seeds). `runs[policy][seed][rate]` is a run summary."""
    per: dict[str, dict[str, Any]] = {}
    for label, by_seed in runs.items():
        rates = {seed: max_rate_at_slo([(r["rate"], r["normalized_latency_s"]["median"]) for r in by_rate.values()], slo_s)
                 for seed, by_rate in by_seed.items()}
        values = [r for r, _ in rates.values()]
        at_slo = []
        for seed, by_rate in by_seed.items():
            passing = [r for r in by_rate.values() if (r["normalized_latency_s"]["median"] or float("inf")) <= slo_s]
            at_slo.append(max(passing, key=lambda r: r["rate"]) if passing else min(by_rate.values(), key=lambda r: r["rate"]))
        per[label] = {
            "max_rate_at_slo": statistics.median(values), "max_rate_min": min(values), "max_rate_max": max(values),
            "max_rate_by_seed": {str(s): r for s, (r, _) in rates.items()},
            "censored": any(c for _, c in rates.values()),
            "waste_share_at_slo_rate": _median([r["waste_share_of_capacity_time"] for r in at_slo]),
            "jct_mean_s": _median([r["jct_s"]["mean"] for r in at_slo]),
            "jct_p90_s": _median([r["jct_s"]["p90"] for r in at_slo]),
            "unfinished_at_slo_rate": sum(r["requests"] - r["completed"] - r["failed"] for r in at_slo),
        }
    for label, h in per.items():
        for ref in RATIO_REFS:
            base = per.get(ref, {}).get("max_rate_at_slo")
            h[f"ratio_vs_{'bound' if ref == BOUND else ref}"] = h["max_rate_at_slo"] / base if base else None
    return per


def _median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def bound_violations(head: Mapping[str, Mapping[str, Any]], tolerance: float = 0.05) -> list[str]:
    """Policies that beat the bound by more than `tolerance` on the headline metric: then the benchmark
    is wrong, not the policy (a bound must bound)."""
    bound = head.get(BOUND, {}).get("max_rate_at_slo")
    if bound is None:
        return []
    # A bound of 0 (over the SLO at the lowest rate) is beaten by any policy that meets it somewhere.
    return [label for label, h in head.items() if label != BOUND and h["max_rate_at_slo"] > bound * (1 + tolerance)]
