"""Intercept policies: pure bookkeeping (numbers and ids in, decisions out; no vLLM, no torch), so the
simulator imports the same code the engine runs. `table.py` lists the policies; `decide.py` holds their
decision functions; `waste.py` the paper's equations; `estimator.py` call durations; `profile.py` the
performance model."""

from engine_adapter.policy.decide import PausedView, StepDecision
from engine_adapter.policy.table import (
    DEFAULT_TTL_S,
    POLICIES,
    POLICY_NAMES,
    Action,
    PolicySpec,
    policy_spec,
)

__all__ = ["DEFAULT_TTL_S", "POLICIES", "POLICY_NAMES", "Action", "PausedView", "PolicySpec", "StepDecision", "policy_spec"]
