"""Intercept policies: pure bookkeeping (numbers and ids in, decisions out; no vLLM, no torch), so a
simulator can import them. The scheduler in `engine_adapter.scheduler` applies the decisions."""

from engine_adapter.policy.decide import (
    POLICY_NAMES,
    Action,
    InterceptPolicy,
    PausedView,
    PolicySpec,
    make_policy,
)

__all__ = ["POLICY_NAMES", "Action", "InterceptPolicy", "PausedView", "PolicySpec", "make_policy"]
