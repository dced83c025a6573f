"""A discrete-event simulator of the engine: vLLM V1's iteration-level scheduling over a simulated KV
pool, driving the engine's own intercept core and policy code (no vLLM, no torch, no GPU).

* `pool.py`: device KV blocks, free queue, prefix cache; `scheduler.py`: vLLM's step building and
  recompute preemption, and the `KvPort` the core reaches the pool through; `request.py`: a request's
  scheduler state and the turns the benchmark drives it through.
* `engine.py`: the event loop, calling the core where `engine_adapter/scheduler.py` does.
* `cost.py`: a step's time from a profile (measured grid + decode steps, or a GPU roofline) and the
  copies' overlap rule; `gpu_profiles.py`: the derived A100 profiles.
* `setup.py`, `workloads.py`, `run.py`, `sweep.py`, `report.py`: a benchmark setting in simulated time,
  with the runner's own workload generator, summary and max-rate-at-SLO rule.
* `validate.py`, `paper.py`, `capacity.py`, `cli.py`: `infercept simulate --validate / --paper /
  --sessions / --quick`.
"""
