"""What-if, not the engine's code: the paper-scale run with the swap-in budget counting the remaining
blocks of swap-ins already armed or loading.

`InterceptCore._plan_swaps` (engine_adapter/intercept/core.py, at 16eac27) asks `SwapPlanner.budgets`
for a swap-in budget of `want_in` = the LOAD_QUEUED entries' tokens only. Once every waiting swap-in is
armed, the budget is 0 and `take_copies` moves one block per step ("a budget under one block still
moves one"): a 1.3k-token GPT-J context then takes ~80 steps to come back instead of ~3. This script
patches that one input (want_in += the armed/loading entries' remaining blocks) at run time and reruns
the affected policies; it changes no file. The fix belongs in the engine (engine_adapter owners).

    cd REPO && PYTHONPATH=. python results/sim/whatif/swapin_budget_fix.py OUT.json \
        vllm-apc,swap,swap-heuristic,infercept-paper,infercept,oracle-duration,unlimited-kv 600
"""
import json, sys
from engine_adapter.intercept import core as core_mod
from engine_adapter.intercept.state import KvState
from engine_adapter.intercept.swap import SwapPlanner

orig_plan = core_mod.InterceptCore._plan_swaps
def _plan_swaps(self, view, now):
    sw = self.swap
    sw._extra_in = sum((len(e.host.to_load) if e.host.to_load is not None else len(e.host.slots)) * self.block_size
                       for e in self.entries.values() if e.host and e.state in (KvState.LOAD_ARMED, KvState.LOADING))
    return orig_plan(self, view, now)
core_mod.InterceptCore._plan_swaps = _plan_swaps
orig_budgets = SwapPlanner.budgets
def budgets(self, want_out, want_in, dev):
    return orig_budgets(self, want_out, want_in + getattr(self, "_extra_in", 0), dev)
SwapPlanner.budgets = budgets

from benchmarks.sim.paper import PaperRun, run_paper
from benchmarks.sim.setup import dump
pols = tuple(sys.argv[2].split(","))
run = PaperRun(seeds=(1,), policies=pols, duration_s=float(sys.argv[3]), drain_s=float(sys.argv[3]))
res = run_paper(run)
res["whatif"] = "swap-in budget includes the armed/loading swap-ins' remaining blocks (core._plan_swaps want_in)"
open(sys.argv[1], "w").write(dump(res))
from benchmarks.sim.report import table
print(table(res["headline"], res["token_budget"]))
