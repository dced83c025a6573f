"""Experiments behind the results that are not a benchmark run: each module is a command whose output
lives in `results/` beside the data it explains, with the command in that data or its README. They use
the benchmark's and the simulator's public functions and watch the intercept core through its
`observers` hook (`InterceptCore.observers`, `SimBench.on_engine`); none patches production code.
tests/bench/test_experiments.py imports every one of them.

* `pause_holds`: how long paused contexts stay on the device under `infercept`, per augmentation type
  (the simulator replaying a benchmark's workloads).
* `decode_context`: decode step time over batch x context on the real engine (the simulator's CPU cost
  model reads it: `results/sim/decode_context/`).
* `bound_check`: one (policy, seed, rate) run of a bench setting with every turn's timing kept, and
  their summary (`results/bench/bound_check/`).
"""

EXPERIMENTS = ("pause_holds", "decode_context", "bound_check")
