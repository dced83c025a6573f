"""The headline of a `bench.json` as the markdown table docs/results.md carries (`infercept bench --report
FILE`), so that the docs' numbers come from the data by a command rather than by hand.

The best peer is the peer with the highest median max rate, picked from the data: the peers are the
policies users run today, the simple baselines and the paper's own policy (`PEERS`), never the bound, one
of this project's `infercept` policies or a priors row (`POLICY@MODE`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infercept.benchmarks.metrics import (BOUND, first_token_bound, judge, machine_check, repeatability, resume_bound,
                                          slo_clause, step_breakdown)
from infercept.benchmarks.points import PointStore, budget_key, reader, repeat_pairs
from infercept.benchmarks.replay import ABLATION

PEERS = ("discard", "vllm-apc", "vllm-offload", "continuum", "ttl", "preserve", "swap", "infercept-paper")


def best_peer(head: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The peer run with the highest median max rate (ties: the one with the higher minimum over seeds,
    then the earlier in `PEERS`)."""
    run = [p for p in PEERS if p in head]
    if not run:
        return None
    return max(run, key=lambda p: (head[p]["max_rate_at_slo"], head[p]["max_rate_min"], -PEERS.index(p)))


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


def _ms_or_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f} s"


def _ratio(h: Mapping[str, Any], ref: str) -> str:
    key = "bound" if ref == BOUND else ref
    r, ci = h.get(f"ratio_vs_{key}"), h.get(f"ratio_ci_vs_{key}")
    if r is None:
        return "-"
    return f"{r:.2f} [{ci[0]:.2f}..{ci[1]:.2f}]" if ci else f"{r:.2f}"


def markdown_table(result: Mapping[str, Any], order: Sequence[str] | None = None) -> str:
    """One row per policy: max rate at the SLO (median (min..max): per seed; `+` where censored), the
    ratio to the best peer and to the bound (median vs median [paired bootstrap over seeds]), and at each
    knee (medians over seeds) TTFT p50/p99, resume p50/p99, JCT mean/p90, goodput and KV waste."""
    head = result["headline"]
    peer = best_peer(head)
    labels = list(order or result.get("policies") or head)
    lines = [f"| policy | max rate at the SLO, req/s: median (min..max): per seed | vs best peer `{peer}` [bootstrap] "
             "| vs bound | TTFT p50 / p99 | resume p50 / p99 | JCT mean / p90 | goodput | KV waste |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label in labels:
        h = head.get(label)
        if h is None:
            continue
        seeds = ", ".join(f"{v:g}" for _, v in sorted(h["max_rate_by_seed"].items(), key=lambda kv: int(kv[0])))
        rate = f"{h['max_rate_at_slo']:.2f}{'+' if h['censored'] else ''}"
        if label == peer:
            rate = f"**{rate}**"
        name = f"`{label}` (bound)" if label == BOUND else f"`{label}`"
        lines.append(" | ".join([
            f"| {name}", f"{rate} ({h['max_rate_min']:.2f}..{h['max_rate_max']:.2f}): {seeds}",
            "1.00" if label == peer else (_ratio(h, peer) if peer else "-"),
            "1.00" if label == BOUND else _ratio(h, BOUND),
            f"{_ms_or_s(h.get('ttft_p50_s'))} / {_ms_or_s(h.get('ttft_p99_s'))}",
            f"{_ms_or_s(h.get('resume_p50_s'))} / {_ms_or_s(h.get('resume_p99_s'))}",
            f"{_num(h.get('jct_mean_s'), '{:.1f}')} / {_num(h.get('jct_p90_s'), '{:.1f}')} s",
            f"{_num(h.get('goodput_rps'), '{:.2f}')}/s", f"{_num(h.get('waste_share_at_slo_rate'), '{:.1%}')} |"]))
    slo = result["slo"]
    lines += ["", f"SLO: median normalized latency <= {slo['slo_normalized_latency_s'] * 1000:.2f} ms/token{slo_clause(slo)}. "
              "`+`: no rate tried failed (the knee is at least this). Ratios: median vs median over seeds, "
              "[paired bootstrap over seeds]. TTFT, resume, JCT, goodput and waste at each policy's knee, median over seeds.",
              f"Bound violations: {', '.join(result.get('bound_violations') or []) or 'none'}."]
    pooled = [(label, head[label].get("ttft_p99_pooled_by_rate") or {}) for label in labels if label in head]
    if any(by_rate for _, by_rate in pooled):
        lines += ["", "New requests' TTFT p99 pooled over the seeds, at each rate every seed ran (samples in brackets):"]
        lines += [f"- `{label}`: " + ", ".join(f"{float(r):g} req/s {_ms_or_s(v['p99_s'])} ({v['samples']})" for r, v in by_rate.items())
                  for label, by_rate in pooled if by_rate]
    steady = result.get("steady_state") or {}
    if steady.get("runs_at_knee"):
        lines.append(f"Steady runs at the knees: {steady['steady_runs_at_knee']} of {steady['runs_at_knee']}.")
    rep = result.get("repeatability")
    if rep:
        nl, tt = rep["normalized_latency"], rep["ttft_p99"]
        lines.append(f"Repeatability ({rep['rule']}, {rep['pairs']} pairs): the median normalized latency moved by a factor "
                     f"{_num(nl['median_factor'], '{:.2f}')} (median; largest {_num(nl['max_factor'], '{:.2f}')}), the TTFT p99 "
                     f"by {_num(tt['median_factor'], '{:.2f}')} (largest {_num(tt['max_factor'], '{:.2f}')}); "
                     f"the SLO verdict differs in {rep['verdicts_differ']} of {rep['pairs']}.")
    mc = result.get("machine_check")
    if mc:
        slow = ", ".join(f"`{x['policy']}` seed {x['seed']} at {x['rate']:g}" for x in mc["slow_points"]) or "none"
        lines.append(f"Machine check (one request alone on the idle engine before and after each of {mc['points']} points): "
                     f"{mc['median_s_per_token'] * 1000:.2f} ms/token median, probes within a factor "
                     f"{_num(mc['factor_p10'], '{:.2f}')}..{_num(mc['factor_p90'], '{:.2f}')} of it (p10..p90; slowest "
                     f"{mc['factor_max']:.2f}); points where a probe was over {1 + mc['tolerance']:.2f}x: {slow}.")
    steps = result.get("step_breakdown")
    if steps:
        lines += ["", "Where the engine's steps go: ms per step with tokens, median over each policy's points (forward "
                  "pass with copy stalls; our core around vLLM's calls; vLLM's schedule and output handling, with our "
                  "hooks inside them; the busy gap between steps; steps without tokens):", "",
                  "| policy | points | forward | ours | vLLM schedule | vLLM update | between | empty steps |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| `{label}` | {b['points']} | " + " | ".join(f"{b.get(k, 0) * 1000:.2f}" for k in (
                  "forward", "ours", "vllm_schedule", "vllm_update", "between", "empty")) + " |" for label, b in steps.items()]
    return "\n".join(lines)


def with_repeatability(result: dict[str, Any], bench_json: Path) -> dict[str, Any]:
    """A run made before bench.json carried `repeatability`: computed from its points folder, if there."""
    points = bench_json.parent / "points"
    if result.get("repeatability") is not None or not points.is_dir() or not result.get("baselines_tuned"):
        return result
    budgets = {label: budget_key(b) for label, b in (result.get("token_budget") or {}).items()
               if label in (result.get("pilot") or {}).get("by_policy", {})}
    pairs = repeat_pairs(reader(points), budgets, int(result["seeds"][0]), result["pilot"]["rates"])
    slo = result["slo"]
    return result | {"repeatability": repeatability(pairs, slo["slo_normalized_latency_s"], slo.get("ttft_p99_bound_s"),
                                                    slo.get("resume_p99_bound_s"))}


def rejudge(result: dict[str, Any]) -> dict[str, Any]:
    """A run judged again from its points by this version's SLO rules: resumed turns' p99 wait for their
    next token gets the bound new requests' TTFT has, where the run predates that rule. Refining the
    knees under the old rule probed around its knees: where the new rule moves a knee, it lands on a
    coarser step (the rates tried are in `rates_tried_by_seed`). Its points did not record the resumed
    turns cut off at the cutoff. Repeatability is computed again from the points folder beside the file
    (none without it); the plots are the run's, by its own rule."""
    slo = dict(result["slo"])
    slo["resume_p99_bound_s"] = resume_bound(slo)
    args = (slo["slo_normalized_latency_s"], slo.get("ttft_p99_bound_s"), slo["resume_p99_bound_s"])
    out = result | judge(result["results"], *args) | {"slo": slo, "repeatability": None}
    if result.get("ablation_results"):
        out["ablation_headline"] = judge(result["ablation_results"], *args)["headline"]
    return out


def interim(out: Path) -> dict[str, Any]:
    """What a run under way (or stopped) says so far: its sweep points judged by this version's SLO rules
    against the references measured so far, in bench.json's shape (headline, slo, bound violations,
    repeatability). A seed whose grid or bisection is unfinished has knees that may still move; points
    measured before resumed turns were bounded did not record those cut off at the cutoff, and the run's
    own bisection follows the rules of its code."""
    plan = json.loads((out / "plan.json").read_text())
    missing = [k for k in ("labels", "seeds", "slo_factor", "token_budget") if k not in plan]
    if missing:
        raise ValueError(f"not a run's --out folder (its plan.json has no {', '.join(missing)})")
    points = out / "points"
    get = reader(points)
    refs = [r for when in ("before", "after") if (r := get(f"reference__{when}")) is not None]
    if not refs:
        raise ValueError("no SLO reference measured yet (points/reference__before.json)")
    unloaded = min(refs, key=lambda r: r["median_s"])
    slo_s = float(plan["slo_factor"]) * unloaded["median_s"]
    factor = plan.get("ttft_factor")
    bound = first_token_bound(factor, unloaded)
    budgets = chosen_budgets(plan, get)
    results: dict[str, dict[int, dict[str, Any]]] = {}
    ablation: dict[str, dict[int, dict[str, Any]]] = {}
    abl_labels = {label for _, label in ABLATION} if plan.get("ablation") else set()
    for path in sorted(points.glob("round*__*.json")):
        _, label, budget, seed, rate = path.stem.split("__")
        # The ablation runs its steps at vLLM's default budget, some of them policies of the sweep too.
        for into, wanted in ((results, budgets.get(label)), (ablation, "vllm-default" if label in abl_labels else None)):
            if budget == wanted:
                into.setdefault(label, {}).setdefault(int(seed), {})[rate] = json.loads(path.read_text())
    labels = [x for x in plan["labels"] if x in results]
    slo = {"slo_factor": plan["slo_factor"], "ttft_factor": factor, "slo_normalized_latency_s": slo_s,
           "ttft_p99_bound_s": bound, "resume_p99_bound_s": bound, "reference_runs": refs}
    head = judge({x: results[x] for x in labels}, slo_s, bound, bound)
    piloted = {x: budgets[x] for x in labels if "@" not in x} if plan.get("tune") else {}
    pairs = repeat_pairs(get, piloted, int(plan["seeds"][0]), plan.get("pilot_rates") or [])
    doc = {"interim": True, "policies": labels, "seeds": plan["seeds"], "slo": slo, **head,
           "token_budget": {x: budgets[x] for x in labels},
           "points": {x: {str(sd): sorted(float(r) for r in by_rate) for sd, by_rate in results[x].items()} for x in labels},
           "repeatability": repeatability(pairs, slo_s, bound, bound), "machine_check": machine_check(results),
           "step_breakdown": step_breakdown(results),
           "results": results}
    if ablation:
        doc |= {"ablation_headline": judge(ablation, slo_s, bound, bound)["headline"], "ablation_results": ablation}
    return doc


def chosen_budgets(plan: Mapping[str, Any], get: Callable[[str], Any]) -> dict[str, str]:
    """Each policy's sweep budget as the runner chose it: the pilot's best (`runner.best_budget`) where
    the plan pilots, the plan's budget where it does not; priors rows take their policy's. A policy whose
    pilot is unfinished has none yet."""
    from infercept.benchmarks.runner import best_budget, budgets_tried, pilot_score

    s_tokens = int(plan["token_budget"])
    out: dict[str, str] = {}
    for label in plan["labels"]:
        if "@" in label:
            continue
        if not plan.get("tune"):
            out[label] = budget_key(s_tokens)
            continue
        scores: dict[str, float | None] = {}
        for b in budgets_tried(label, s_tokens):
            runs = [get(PointStore.key("pilot", label, budget_key(b), plan["seeds"][0], f"{float(r):g}"))
                    for r in plan["pilot_rates"]]
            if any(r is None for r in runs):
                break
            scores[budget_key(b)] = pilot_score(runs)
        else:
            out[label] = best_budget(scores)
    for label in plan["labels"]:
        base = label.split("@")[0]
        if "@" in label and base in out:
            out[label] = out[base]
        elif "@" in label and base not in plan["labels"]:  # a priors row without its policy: the plan's budget
            out[label] = budget_key(s_tokens)
    return out


def main(path: str, rejudge_points: bool = False) -> int:
    import sys

    try:
        if Path(path).is_dir():
            if rejudge_points:
                print(f"error: {path}: --rejudge is for a finished run's bench.json; a folder's report already "
                      "judges by this version's rules", file=sys.stderr)
                return 2
            result = interim(Path(path))
            points = sum(len(v) for by_seed in result["points"].values() for v in by_seed.values())
            print(f"Interim: {points} sweep points of {path} so far (the run's bench.json, once written, is the "
                  "result); judged by this version's rules against the references measured so far.\n")
            print(markdown_table(result))
            return 0
        doc = json.loads(Path(path).read_text())
        result = with_repeatability(rejudge(doc) if rejudge_points else doc, Path(path))
        table = markdown_table(result)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"error: {path}: not a finished run's bench.json (no {e})", file=sys.stderr)
        return 2
    print(table)
    return 0
