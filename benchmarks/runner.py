"""`infercept bench`: the paper's evaluation on the embedded engine, every policy on equal footing.

* **Same knobs.** Every policy runs in the same engine with the same KV, host buffer, emulated link,
  running slots and duration priors. The priors are generic (`--priors generic`: the same one-second
  guess for every type; each estimator learns the types online from the calls it sees); `POLICY@table1`
  rows get the workload's own distributions (an oracle) and `POLICY@x0.3` / `@x3` misspecified ones.
* **Budgets piloted alike.** Before the sweep, every policy (not the priors rows) runs at S, 2S and
  vLLM's default token budget (4S for policies that cap their iterations at S, whose cap follows the
  budget tried) at the pilot rates on the first seed; each is then measured at its best.
* **The bound** is `unlimited-kv`: `preserve` with KV for every request's context at once, a running
  slot per session, real call durations, piloted like the others. No policy may beat it beyond noise
  (`bound_violations`).
* **The SLO** comes from the bound's engine running requests one at a time with zero-time calls, before
  the first policy and after the last (the faster kept). A rate is within the SLO when the median
  normalized latency is within `--slo-factor` x that reference **and** the p99 of new requests' time to
  first token, and of resumed turns' wait from the call's return to their next token, are each within
  `--ttft-factor` x the unloaded TTFT p90 (so that starving new requests or resumed turns cannot pass).
* **Knees by bisection.** Each seed runs the rate grid, then `--refine` rounds that probe each policy
  halfway between its highest passing and lowest failing rate; its max rate is the highest passing rate
  below the lowest failing one (no interpolation). Within a seed, the policies of every round run in a
  shuffled order (recorded as `order`), so that drifts of the machine spread over policies.
* **Statistics.** Medians over seeds with min..max, per-seed ratios and a paired bootstrap interval of
  every ratio; each run's steady-state check (`metrics.steady_state`).
* **Resumable.** Every point is saved as it finishes (`points.PointStore`); the same command continues
  a run that stopped and says so. A full run re-measures the tiny model's profile on this machine first.

Why the default setting resembles the paper's A100 runs: the `tiny` model (random 2-layer Llama, real
tokenizer) on 2 CPU cores has an A100's forward time for GPT-J relative to context (recomputing a 1.5k
context costs a few decode steps of a batch), and its throughput per token saturates near the profile's
S; 24k tokens of KV hold 12-16 of the workload's 1.5-2k contexts, so paused contexts compete for memory
as the rate grows; swaps go over an emulated 0.25 GB/s link (`swap_link_gbps`: a 1.5k-token context,
1.5 MB here, takes ~6 ms, about one decode step, as GPT-J's 690 MB over PCIe does on an A100; without it
RAM-to-RAM copies would make swapping free); call durations are scaled by `--time-scale` (0.1).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infercept.benchmarks.metrics import (BOUND, first_token_bound, headline, judge, machine_check, next_probe, repeatability,
                                          slo_clause, step_breakdown)
from infercept.benchmarks.points import PointStore, budget_key, repeat_pairs
from infercept.benchmarks.replay import ABLATION, REPO, EngineRun, Setting, variant
from infercept.benchmarks.workload import PRIOR_MODES, WORKLOADS, Request, ShareGPT, check_priors, generate, write_priors
from engine_adapter.paths import configs_dir
from engine_adapter.policy.table import policy_spec

DEFAULT_POLICIES = ("discard", "vllm-apc", "vllm-offload", "continuum", "preserve", "swap", "infercept-paper", "infercept", BOUND)
QUICK_POLICIES = ("discard", "vllm-apc", "infercept", BOUND)
PRIOR_ROWS_OF = ("infercept",)  # the policies that get `@table1`/`@x0.3`/`@x3` rows in a full run
PROFILE_GRID = (64, 256, 512, 1024, 2048)  # the tiny model's profile, as shipped (tiny-cpu-bench.json)


@dataclass
class Plan:
    workload: str
    labels: list[str]
    rates: list[float]  # the grid every policy runs on every seed; bisection refines between its points
    duration_s: float
    seeds: list[int]
    token_budget: int  # S: the budget of every policy that is not piloted
    tune: bool  # pilot every policy's budget (S, 2S, vLLM's default) before the sweep
    ablation: bool
    slo_factor: float
    setting: Setting
    out: Path
    command: str
    pilot_rates: list[float] = field(default_factory=list)
    calibration_requests: int = 16
    refine: int = 0  # bisection rounds after the grid
    rel_tol: float = 0.1  # bisection stops once the knee and the first failure are this close (relative)
    # new requests' p99 TTFT, and resumed turns' p99 wait for their next token, within this x the unloaded
    # TTFT p90 (None: no such rule)
    ttft_factor: float | None = 10.0
    allow_other_machine: bool = False  # resume points measured on other hardware (not part of the fingerprint)
    reprofile: bool = False  # measure the tiny model's profile on this machine before anything else
    budget_from_profile: bool = True  # S, the default budget, is the (re-measured) profile's

    @property
    def extend_step(self) -> float:
        """How far above the highest rate tried a censored knee is searched: the grid's top step."""
        r = sorted(self.rates)
        return r[-1] - r[-2] if len(r) > 1 else r[-1]

    @property
    def highest_probe(self) -> float:
        """The highest rate the search can reach: a policy passing everything climbs one step a round."""
        return round(max(self.rates) + self.refine * self.extend_step, 4)  # rounded as the probes are

    def fingerprint(self) -> dict[str, Any]:
        """What decides the points a run measures: a resumed run must agree on all of it."""
        s = self.setting
        return {"workload": self.workload, "labels": self.labels, "rates": self.rates, "duration_s": self.duration_s,
                "seeds": self.seeds, "token_budget": self.token_budget, "tune": self.tune, "ablation": self.ablation,
                "slo_factor": self.slo_factor, "pilot_rates": self.pilot_rates, "refine": self.refine, "rel_tol": self.rel_tol,
                "ttft_factor": self.ttft_factor, "reprofile": self.reprofile, "calibration_requests": self.calibration_requests,
                "setting": {k: v for k, v in asdict(s).items() if k not in ("profile", "priors_dir", "unlimited_kv_tokens", "unlimited_kv_slots")},
                "code": code_digest(), "dirty": git_dirty()}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), None)
        flags = set(cpuinfo.split())
        info["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx")))
    except OSError:
        pass
    return info


def hardware(m: dict[str, Any]) -> str:
    """What makes two machines' points comparable: CPU model, cores and vector flags (not the host name)."""
    return f"{m.get('cpu')}, {m.get('cpus')} cores, {' '.join(m.get('cpu_flags') or [])}"


def other_hardware(mine: dict[str, Any], earlier: list[dict[str, Any]]) -> list[str]:
    """The hardware of earlier points' machines that differs from this one's."""
    return sorted({hardware(m) for m in earlier} - {hardware(mine)})


class OtherMachine(ValueError):
    pass


def check_machine(mine: dict[str, Any], store: PointStore, allow: bool) -> str | None:
    """Refuse to resume a run whose points ran on other hardware: the knees would compare machines as
    much as policies (a 2-core AMD EPYC ran the same suite 1.45x slower than the Intel Xeon before it).
    With `allow`, the warning to print instead (bench.json lists every machine under `machines`)."""
    other = other_hardware(mine, store.machines())
    if not other:
        return None
    why = (f"this machine ({hardware(mine)}) is not the one earlier points in {store.dir.parent} ran on "
           f"({'; '.join(other)})")
    if not allow:
        raise OtherMachine(f"{why}: resuming would compare machines as much as policies; resume on that machine, "
                           "start over with another --out, or pass --allow-other-machine to mix them anyway")
    return f"warning: {why}: the comparison spans machines (bench.json lists them under `machines`)"


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD")


CODE_PATHS = ("engine_adapter", "benchmarks", "configs", "infercept", "gateway", "augmentations", "pyproject.toml")


def code_digest() -> str | None:
    """The committed code a run's points were measured with: git's hashes of the code's trees, so that a
    resumed run must run the same code while commits to docs or tests in between do not stop it."""
    return _git("rev-parse", *(f"HEAD:{p}" for p in CODE_PATHS))


def git_dirty() -> bool | None:
    """Whether the code differs from the commit (uncommitted changes a resumed run could not check)."""
    out = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    return None if out is None else bool(out)


def profile_doc(s: Setting) -> dict[str, Any] | None:
    path = Path(s.profile) if s.profile and s.model == "tiny" else configs_dir() / "profiles" / f"{s.model}-cpu.json"
    return json.loads(path.read_text()) if path.is_file() else None


def context_tokens(r: Request) -> int:
    return len(r.prompt) + sum(c.decode_tokens + c.returned_tokens for c in r.calls) + r.final_decode_tokens


class Workloads:
    """The seeded workload of each (seed, rate), generated when first asked for (bisection picks rates as
    it goes) and kept."""

    def __init__(self, plan: Plan) -> None:
        from transformers import AutoTokenizer

        from engine_adapter.models import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model(plan.setting.model))
        self.encode = lambda t: tok.encode(t, add_special_tokens=False)
        self.sharegpt = ShareGPT().texts if plan.workload in ("chatbot", "mixed") and ShareGPT.available() else []
        self.plan = plan
        self.made: dict[tuple[int, float], list[Request]] = {}

    def __getitem__(self, key: tuple[int, float]) -> list[Request]:
        if key not in self.made:
            p, s = self.plan, self.plan.setting
            self.made[key] = generate(p.workload, key[1], p.duration_s, key[0], context_scale=s.context_scale,
                                      max_context=s.max_context, encode=self.encode, sharegpt=self.sharegpt)
        return self.made[key]


def make_workloads(plan: Plan) -> dict[tuple[int, float], list[Request]]:
    """Every (seed, rate) of the plan's grid and pilot."""
    w = Workloads(plan)
    return {(seed, r): w[(seed, r)] for seed in plan.seeds for r in sorted(set(plan.rates) | set(plan.pilot_rates))}


def chunked(label: str) -> bool:
    """Whether the policy caps its iterations at S: then the budget it runs at is its S as well."""
    return policy_spec(variant(label).policy).chunk_at_saturation


def pilot_score(runs: Iterable[Mapping[str, Any]]) -> float | None:
    """A budget's pilot score: the summed median normalized latency over the pilot rates (None: a rate
    finished no request)."""
    score = sum(r["normalized_latency_s"]["median"] or math.inf for r in runs)
    return score if math.isfinite(score) else None


def best_budget(scores: Mapping[str, float | None]) -> str:
    """The budget the pilot chose: the lowest score (summed median normalized latency over the pilot
    rates; None: a rate finished no request), the first tried on a tie."""
    return min(scores, key=lambda k: math.inf if scores[k] is None else scores[k])  # type: ignore[return-value]


def budgets_tried(label: str, s_tokens: int) -> list[int | None]:
    """S, 2S and vLLM's default; 4S instead of the default for policies that cap iterations at S (their
    cap follows the budget tried, and vLLM's default on this CPU is 2048 = 4 x 512)."""
    return [s_tokens, 2 * s_tokens, 4 * s_tokens if chunked(label) else None]


class Bench:
    """One benchmark run: its plan, its points on disk, the progress bar and the engines' info."""

    def __init__(self, plan: Plan, bar: Any, workloads: Workloads, store: PointStore, here: dict[str, Any]) -> None:
        self.plan, self.bar = plan, bar
        self.store = store
        self.workloads = workloads
        self.machine = here  # in every point: a resumed run may be on another host

    async def runs(self, label: str, budget: int | None, seed: int, rates: Sequence[float], phase: str) -> dict[str, Any]:
        """The points of one policy at one budget and seed, measured where not on disk: one engine for
        all of them, rates ascending."""
        keys = {r: PointStore.key(phase, label, budget_key(budget), seed, f"{r:g}") for r in rates}
        out = {f"{r:g}": self.store.get(k) for r, k in keys.items()}
        todo = [r for r in sorted(rates) if out[f"{r:g}"] is None]
        self.bar.update(len(rates) - len(todo))
        if todo:
            self.bar.set_postfix_str(f"{phase} {label} b={budget_key(budget)} seed {seed}")
            sat = budget if chunked(label) and budget is not None else None
            async with EngineRun(variant(label), self.plan.setting, budget, sat) as er:
                info = await er.info()  # kept in every point: a resumed run's summary reads it from there
                for r in todo:
                    res = await er.run(self.workloads[(seed, r)], r) | {"seed": seed, "budget": budget_key(budget),
                                                                         "commit": git_commit(), "finished": time.time(),
                                                                         "engine": info, "machine": self.machine}
                    self.store.put(keys[r], res)
                    out[f"{r:g}"] = res
                    self.bar.update(1)
        return out

    async def reference(self, when: str) -> dict[str, Any]:
        """The SLO's reference: the first seed's lowest-rate requests, one at a time, on the bound's engine."""
        key = PointStore.key("reference", when)
        got = self.store.get(key)
        if got is None:
            self.bar.set_postfix_str(f"SLO reference ({when})")
            p = self.plan
            first = self.workloads[(p.seeds[0], min(p.rates))]
            async with EngineRun(variant(BOUND), p.setting, p.token_budget) as er:
                got = await er.unloaded(first[:p.calibration_requests]) | {"when": when, "machine": self.machine}
            self.store.put(key, got)
        self.bar.update(1)
        return got


async def prepare(plan: Plan) -> Workloads:
    """Priors, the bound's KV and slots, and (for a full run) a fresh profile, all in OUT."""
    s = plan.setting
    plan.out.mkdir(parents=True, exist_ok=True)
    s.priors_dir = str(plan.out)
    for mode in PRIOR_MODES:
        write_priors(plan.out / f"priors-{mode}.yaml", mode, s.time_scale)
    if plan.reprofile and s.model == "tiny":
        path = plan.out / "profile.json"
        if not path.is_file():  # a resumed run keeps the profile it started with
            from engine_adapter.profiler import ImplausibleProfile, check_fwd, run_profile

            for attempt in (1, 2, 3):
                print(f"measuring the tiny model's profile on this machine into {path} ...", file=sys.stderr, flush=True)
                try:
                    prof = await run_profile("tiny", s.dtype, PROFILE_GRID, 3, None)
                    check_fwd(prof.fwd_tokens, prof.fwd_seconds, prof.device)
                    path.write_text(prof.to_json() + "\n")
                    break
                except ImplausibleProfile as e:  # a noisy machine: measured again, and refused the third time
                    print(f"profile attempt {attempt}: {e}", file=sys.stderr, flush=True)
                    if attempt == 3:
                        raise ValueError(f"no plausible profile in three attempts ({e}); run alone on the machine, "
                                         "or give one with --profile") from e
        s.profile = str(path)
        if plan.budget_from_profile:
            plan.token_budget = int(json.loads(path.read_text())["saturation_tokens"])
    # The bound's KV holds every request of the busiest workload at its largest context at once, and it
    # gets a running slot for each: the busiest is the highest rate the search can reach (`highest_probe`).
    w = Workloads(plan)
    top = [w[(seed, plan.highest_probe)] for seed in plan.seeds]
    s.unlimited_kv_tokens = max(sum(context_tokens(r) for r in reqs) for reqs in top)
    s.unlimited_kv_slots = max(len(reqs) for reqs in top)
    return w


async def sweep(b: Bench, labels: Sequence[str], budgets: dict[str, int | None], slo_s: float, ttft_slo_s: float | None,
                order: dict[str, list[list[str]]]) -> dict[str, dict[int, dict[str, Any]]]:
    """results[label][seed][rate]: per seed, the grid for every policy, then bisection rounds; the
    policies of each round in a shuffled order. `ttft_slo_s` bounds both first tokens' p99, a new
    request's and a resumed turn's (`first_token_bound`)."""
    p = b.plan
    results: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in labels}
    for seed in p.seeds:
        rounds = order.setdefault(str(seed), [])
        for rnd in range(p.refine + 1):
            shuffled = list(labels)
            random.Random(f"order:{seed}:{rnd}").shuffle(shuffled)
            ran = []
            for label in shuffled:
                have = results[label].setdefault(seed, {})
                if rnd == 0:
                    rates: list[float] = list(p.rates)
                else:
                    probe = next_probe(have, slo_s, ttft_slo_s, p.rel_tol, p.extend_step, resume_slo_s=ttft_slo_s)
                    if probe is None:
                        continue
                    rates = [probe]
                have.update(await b.runs(label, budgets[label], seed, rates, f"round{rnd}"))
                ran.append(label)
            rounds.append(ran)
            b.bar.total -= (len(labels) - len(ran)) if rnd else 0
    return results


async def bench(plan: Plan) -> dict[str, Any]:
    from tqdm import tqdm

    t_start = time.time()
    # Before anything is measured or written: a folder of another plan or code, or of another machine, is refused.
    store = PointStore(plan.out, plan.fingerprint())
    here = machine() | {"host": platform.node()}
    warning = check_machine(here, store, plan.allow_other_machine)
    workloads = await prepare(plan)
    s = plan.setting
    labels = list(plan.labels)
    ablation = [label for _, label in ABLATION] if plan.ablation else []
    piloted = [label for label in labels if "@" not in label] if plan.tune else []
    total = (2 + sum(len(budgets_tried(x, plan.token_budget)) for x in piloted) * len(plan.pilot_rates)
             + len(plan.seeds) * (len(plan.rates) + plan.refine) * (len(labels) + len(ablation)))
    pilot: dict[str, Any] = {}
    order: dict[str, list[list[str]]] = {}
    budgets: dict[str, int | None] = {label: plan.token_budget for label in labels}
    with tqdm(total=total, desc="bench", unit="point", file=sys.stderr) as bar:
        b = Bench(plan, bar, workloads, store, here)
        if b.store.resumed:
            print(f"resuming {plan.out}: {b.store.resumed} points already measured with this plan and code", file=sys.stderr, flush=True)
            if warning:
                print(warning, file=sys.stderr, flush=True)
        # 1. The SLO's reference, before any policy (and again after the last: 4.).
        reference = [await b.reference("before")]
        # 2. Pilot: every policy at each budget tried; the sweep uses the best (lowest summed median
        #    normalized latency over the pilot rates, first seed). Priors rows use their policy's.
        for label in piloted:
            pilot[label] = {}
            for budget in budgets_tried(label, plan.token_budget):
                runs = await b.runs(label, budget, plan.seeds[0], plan.pilot_rates, "pilot")
                pilot[label][budget_key(budget)] = {
                    "score": pilot_score(runs.values()),
                    **{rate: {"normalized_latency_median_s": r["normalized_latency_s"]["median"], "completed": r["completed"],
                              "requests": r["requests"]} for rate, r in runs.items()}}
            best = best_budget({k: v["score"] for k, v in pilot[label].items()})
            budgets[label] = None if best == "vllm-default" else int(best)
        for label in labels:
            if "@" in label:
                budgets[label] = budgets.get(label.split("@")[0], plan.token_budget)
        # 3. The sweep, judged as it goes by the first reference (the final SLO may be a little tighter).
        ref0 = reference[0]
        slo0 = plan.slo_factor * ref0["median_s"]
        ttft0 = first_token_bound(plan.ttft_factor, ref0)
        results = await sweep(b, labels, budgets, slo0, ttft0, order)
        abl = await sweep(b, ablation, {x: None for x in ablation}, slo0, ttft0, {}) if ablation else {}
        reference.append(await b.reference("after"))
    unloaded = min(reference, key=lambda r: r["median_s"])
    slo_s = plan.slo_factor * unloaded["median_s"]
    ttft_slo_s = first_token_bound(plan.ttft_factor, unloaded)
    judged = judge(results, slo_s, ttft_slo_s, ttft_slo_s)
    head, violations = judged["headline"], judged["bound_violations"]
    pairs = repeat_pairs(b.store.get, {x: budget_key(budgets[x]) for x in piloted}, plan.seeds[0], plan.pilot_rates)
    for label in violations:
        print(f"warning: {label} beats the bound {BOUND} by more than 5% ({head[label]['max_rate_at_slo']:.2f} vs "
              f"{head[BOUND]['max_rate_at_slo']:.2f} req/s): the benchmark is wrong, not the policy", file=sys.stderr)
    # Read from the points, not this process: a resumed run measured some of them in an earlier one.
    points = [r for by_seed in results.values() for by_rate in by_seed.values() for r in by_rate.values()]
    made = {k: b.workloads[k] for k in sorted({(int(r["seed"]), float(r["rate"])) for r in points})}
    finished = [r["finished"] for r in points if r.get("finished")]
    result: dict[str, Any] = {
        "command": plan.command, "commit": git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
        "elapsed_s": time.time() - t_start, "resumed_points": b.store.resumed, "machine": machine(),
        "points_finished": {"first": min(finished, default=None), "last": max(finished, default=None)},
        "machines": b.store.machines(),  # every point's on disk, pilot and references too
        "workload": plan.workload, "rates": plan.rates, "duration_s": plan.duration_s, "seeds": plan.seeds,
        "policies": labels, "token_budget": {label: budgets.get(label) for label in labels},
        "token_budget_default": plan.token_budget, "baselines_tuned": plan.tune,
        "pilot": {"rates": plan.pilot_rates, "by_policy": pilot, "rule": "every policy at S, 2S and vLLM's default "
                  "(4S where iterations are capped at S); lowest summed median normalized latency, first seed"},
        "priors": {"run": s.priors, "rows": {x: variant(x).priors for x in labels if "@" in x},
                   "generic_s": "GENERIC_PRIOR_S x time_scale for every type", "files": sorted(f"priors-{m}.yaml" for m in PRIOR_MODES)},
        "order": order, "refine": {"rounds": plan.refine, "rel_tol": plan.rel_tol},
        "steady_state": judged["steady_state"],
        "setting": asdict(s) | {"profile_data": profile_doc(s)},
        "requests_per_rate": {f"{seed}/{rate:g}": len(w) for (seed, rate), w in made.items()},
        "request_mix": {f"{seed}/{rate:g}": {t: sum(1 for q in w if q.aug_type == t) for t in WORKLOADS[plan.workload]}
                        for (seed, rate), w in made.items()},
        "engines": {label: next((r["engine"] for s_ in by_seed.values() for r in s_.values() if "engine" in r), None)
                    for label, by_seed in results.items()},
        "slo": {"slo_factor": plan.slo_factor, "ttft_factor": plan.ttft_factor,
                "reference": f"{BOUND} engine, {unloaded['requests']} requests one at a time, zero-time calls; "
                             "measured before the first policy and after the last, the faster kept",
                "unloaded_normalized_latency_s": unloaded["median_s"], "slo_normalized_latency_s": slo_s,
                "unloaded_ttft_p90_s": unloaded.get("ttft_p90_s"), "ttft_p99_bound_s": ttft_slo_s,
                "resume_p99_bound_s": ttft_slo_s, "reference_runs": reference},
        "headline": head, "bound_violations": violations, "repeatability": repeatability(pairs, slo_s, ttft_slo_s, ttft_slo_s),
        "machine_check": machine_check(results), "step_breakdown": step_breakdown(results),
        "results": results,
    }
    if abl:
        result |= {"ablation_headline": headline(abl, slo_s, ttft_slo_s, ttft_slo_s), "ablation_results": abl,
                   "ablation_token_budget": "vllm-default"}
    from infercept.benchmarks.plots import plots

    result["plots"] = plots(result, plan.out)
    (plan.out / "bench.json").write_text(json.dumps(result, indent=2, default=lambda o: None if o == float("inf") else str(o)))
    return result


def print_table(result: dict[str, Any]) -> None:
    slo = result["slo"]
    ttft = slo_clause(slo)
    print(f"\nSLO: median normalized latency <= {slo['slo_normalized_latency_s'] * 1000:.2f} ms/token{ttft} "
          f"({slo['slo_factor']:g}x the {slo['reference']})")
    refs = [x for x in ("discard", "vllm-apc", "continuum", BOUND) if x in result["headline"]]
    print(f"{'policy':18s} {'budget':>7s} {'max rate@SLO (min..max)':>24s} " + " ".join(f"{'vs ' + ('bound' if r == BOUND else r):>20s}" for r in refs)
          + f" {'waste':>6s} {'TTFT p99':>8s} {'JCT':>6s}")

    def f(x: float | None, fmt: str = "{:.2f}") -> str:
        return "-" if x is None else fmt.format(x)

    for label, h in result["headline"].items():
        rate = f"{h['max_rate_at_slo']:.2f}{'+' if h['censored'] else ' '} ({h['max_rate_min']:.2f}..{h['max_rate_max']:.2f})"
        cells = []
        for r in refs:
            key = "bound" if r == BOUND else r
            ci = h.get(f"ratio_ci_vs_{key}")
            cells.append(f"{f(h.get(f'ratio_vs_{key}')):>5s} [{f(ci[0]) if ci else '-'}..{f(ci[1]) if ci else '-'}]")
        print(f"{label:18s} {str(result['token_budget'].get(label)):>7s} {rate:>24s} " + " ".join(f"{c:>20s}" for c in cells)
              + f" {f(h['waste_share_at_slo_rate'], '{:.1%}'):>6s} {f(h['ttft_p99_s'], '{:.2f}s'):>8s} {f(h['jct_mean_s'], '{:.0f}s'):>6s}")
    print("(+: met the SLO at every rate tried; ratios: median vs median over seeds [95% paired bootstrap over seeds]; "
          "waste, TTFT p99, JCT: at the highest rate within the SLO)")


def main(args: Any) -> int:
    quick = args.quick
    labels = [x.strip() for x in (args.policies or ",".join(QUICK_POLICIES if quick else DEFAULT_POLICIES)).split(",") if x.strip()]
    try:
        for x in labels:
            variant(x)
        priors = check_priors(args.priors)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.policies and not quick:
        labels += [f"{x}@{m}" for x in PRIOR_ROWS_OF if x in labels for m in PRIOR_MODES if m != priors]
    if BOUND not in labels:
        labels.append(BOUND)  # every ratio needs its bound
    s = Setting(priors=priors)
    for name, attr in (("time_scale", "time_scale"), ("kv_tokens", "kv_tokens"), ("model", "model"),
                       ("host_gib", "swap_space_gib")):
        if getattr(args, name, None):
            setattr(s, attr, getattr(args, name))
    if args.link_gbps is not None:
        s.swap_link_gbps = args.link_gbps or None
    if s.model != "tiny":
        s.dtype = "auto"
    if args.profile:
        s.profile = args.profile
    prof = profile_doc(s)
    if prof is not None:
        s.kv_bytes_per_token = int(prof["kv_bytes_per_token"])
    rates = [float(r) for r in (args.rates or ("4" if quick else "3,6,9,12")).split(",")]
    seeds = [int(x) for x in (args.seeds or ("1" if quick else "1,2,3")).split(",")]
    if quick:
        s.drain_s = 30.0
        if args.time_scale is None:
            s.time_scale = 0.02
    if any(r <= 0 for r in rates) or not seeds:
        print("error: rates must be positive and at least one seed given", file=sys.stderr)
        return 2
    if getattr(args, "host_gib", None) is not None and not (math.isfinite(args.host_gib) and args.host_gib > 0):
        print(f"error: --host-gib must be a positive number of GiB (got {args.host_gib:g})", file=sys.stderr)
        return 2
    budget = args.token_budget or (int(prof["saturation_tokens"]) if prof else 512)
    tune = not quick and not args.no_pilot
    if not tune:
        pilot_rates: list[float] = []  # no pilot: its rates are no part of the plan
    elif getattr(args, "pilot_rates", None):
        pilot_rates = [float(r) for r in args.pilot_rates.split(",")]
    else:
        pilot_rates = [sorted(rates)[(len(rates) - 1) // 2]]  # the middle of the grid
    refine = args.refine if args.refine is not None else (0 if quick else 2)
    command = "infercept " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("infercept") else " ".join(sys.argv)
    plan = Plan(workload=args.workload, labels=labels, rates=rates, duration_s=args.duration or (6.0 if quick else 30.0),
                seeds=seeds, token_budget=budget, tune=tune, ablation=args.ablation,
                slo_factor=args.slo_factor, setting=s, out=Path(args.out), command=command, pilot_rates=pilot_rates,
                refine=refine, rel_tol=args.rel_tol, ttft_factor=args.ttft_factor or None,
                reprofile=not quick and not args.profile, budget_from_profile=not args.token_budget,
                allow_other_machine=args.allow_other_machine)
    try:
        result = asyncio.run(bench(plan))
    except ValueError as e:  # a plan, code or machine that does not match the points in OUT, a setting vLLM refuses
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_table(result)
    print(f"\nwrote {plan.out / 'bench.json'} and {', '.join(result['plots'])} in {result['elapsed_s']:.0f} s")
    return 0
