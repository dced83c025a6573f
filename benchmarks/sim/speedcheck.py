"""Whether a validation replayed the bench at the machine's speed, judged on what the knees do not use.

A replay's knees depend on its step times: if the simulated machine is faster or slower than the one the
bench met, every policy's knee moves, and a fitted cost (the host time per held request) can hide it. Each
measured point records how long its engine spent in forward passes (`forward_s`), and the simulator reports
the same for the same requests: their ratio, point by point, is the machine speed the replay got wrong (plus
the work it cut differently, which the step counts beside it show). The probes (one request alone on the idle
engine before and after each point, `benchmarks.replay.decode_probe`) are the other measure of the machine:
this module says how noisy they are (before against after the same point), where the reference the probed
replay divides by sits among them, and how much they drift over the run against the forward time's drift.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from infercept.benchmarks.metrics import measured_runs, point_probe_s


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _drift(rows: Sequence[tuple[float, float]]) -> float | None:
    """The median of the last quarter minus that of the first (values in log, rows sorted by time)."""
    k = len(rows) // 4
    if k < 2:
        return None
    return statistics.median(v for _, v in rows[-k:]) - statistics.median(v for _, v in rows[:k])


def reference_probe_s(bj: Mapping[str, Any]) -> float | None:
    """The probe (seconds per token) of the SLO reference the bench kept, the faster of its reference runs by
    their latency; None where no reference recorded a probe (a bench made before the machine check)."""
    refs = [r for r in (bj.get("slo") or {}).get("reference_runs") or [] if r.get("probe_s_per_token") and r.get("median_s")]
    return min(refs, key=lambda r: r["median_s"])["probe_s_per_token"] if refs else None


def _points(bj: Mapping[str, Any], per_rate: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The measured runs of a validation that both sides timed, in the order the bench finished them: log(measured /
    simulated) forward seconds and steps with work, and the log of the point's probe and its noise (|log before /
    after|)."""
    rows = []
    for label, runs in per_rate.items():
        for key, row in runs.items():
            m, s = row.get("measured") or {}, row.get("simulated") or {}
            if not (m.get("forward_s") and s.get("forward_s")):
                continue
            seed, rate = key.split("/")
            point = measured_runs(bj, label, seed).get(rate) or {}
            mc = point.get("machine_check") or {}
            b, a = mc.get("before_s_per_token"), mc.get("after_s_per_token")
            probe = point_probe_s(point)
            rows.append({"when": float(point.get("finished") or 0.0),
                         "forward": math.log(m["forward_s"] / s["forward_s"]),
                         "steps": math.log(m["iterations"] / s["iterations"]) if m.get("iterations") and s.get("iterations") else None,
                         "noise": abs(math.log(b / a)) if b and a else None,
                         "probe": math.log(probe) if probe else None})
    return sorted(rows, key=lambda r: r["when"])


def speed_check(bj: Mapping[str, Any], per_rate: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Over the measured runs of a validation (`per_rate`: label -> "seed/rate" -> measured and simulated
    `_brief`s, the rate as the bench's `results` keys it): log(measured / simulated) forward seconds and steps
    with work (median, and median of the absolute value), the forward ratio's drift over the run (last quarter
    of the points in the order they finished, against the first), and the bench's probes: their noise (median
    |log(before / after)| of one point), their drift on the same points, the probe of the SLO reference the
    probed replay divides by (the faster reference's) as a factor of the run's median probe, and how far the
    forward ratio follows the probes (`probe_slope`)."""
    rows = _points(bj, per_rate)
    fwd = [(r["when"], r["forward"]) for r in rows]
    probes = [(r["when"], r["probe"]) for r in rows if r["probe"] is not None]
    timed = all(t for t, _ in fwd)  # a bench before `finished` was recorded has no order to drift over
    out: dict[str, Any] = {
        "runs": len(fwd),
        "forward_log_ratio_median": _median([v for _, v in fwd]),
        "forward_log_ratio_median_abs": _median([abs(v) for _, v in fwd]),
        "forward_drift_log": _drift(fwd) if timed else None,
        "steps_log_ratio_median": _median([r["steps"] for r in rows if r["steps"] is not None]),
        "probe_noise_log": _median([r["noise"] for r in rows if r["noise"] is not None]),
        "probe_drift_log": _drift(probes) if timed else None,
        "reference_probe_factor": None,
        "probe_slope": probe_slope(rows),
    }
    kept = reference_probe_s(bj)  # what `validate.machine_speeds` divides by
    if kept and probes:
        out["reference_probe_factor"] = kept / math.exp(statistics.median(v for _, v in probes))
    return out


def probe_slope(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Least squares of the forward ratio (log measured / simulated) on the log of each point's probe: `slope` is
    how much of a probe's move the loaded machine followed (0: none, the replay's speed was right throughout; 1:
    all of it, as the probed replay assumes), `r` how closely. The probes' own noise flattens the slope; to
    predict a point's forward time from its noisy probe that flattened slope is the one wanted. None with fewer
    than four points, or probes that never moved."""
    pts = [(r["probe"], r["forward"]) for r in rows if r["probe"] is not None]
    if len(pts) < 4:
        return None
    mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    syy = sum((y - my) ** 2 for _, y in pts)
    if sxx <= 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    return {"slope": sxy / sxx, "r": sxy / math.sqrt(sxx * syy) if syy > 0 else 0.0, "points": len(pts)}


def format_speed_check(c: Mapping[str, Any]) -> str:
    """One paragraph for `print_validation`."""
    def lg(x: float | None) -> str:
        return "-" if x is None else f"{x:+.3f}"

    def ab(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    ref = c.get("reference_probe_factor")
    return (f"speed check over {c['runs']} measured runs, log(measured / simulated): forward time median "
            f"{lg(c['forward_log_ratio_median'])} (median |.| {ab(c['forward_log_ratio_median_abs'])}, drift over the run "
            f"{lg(c['forward_drift_log'])}), steps with work {lg(c['steps_log_ratio_median'])}; probes: noise "
            f"{ab(c['probe_noise_log'])} (median |log before/after| of a point), drift {lg(c['probe_drift_log'])}, "
            f"the SLO reference's probe at {'-' if ref is None else f'{ref:.2f}'}x their median"
            + ("" if not c.get("probe_slope") else
               f"; the forward ratio follows log(probe) with slope {c['probe_slope']['slope']:.2f} (r {c['probe_slope']['r']:.2f})"))
