"""What to do with a paused request's KV, per policy.

The policies of the engine issue, as one mechanism with parameters (`PolicySpec`):

| policy            | KV at the pause           | resume queued by     | prefix caching |
|-------------------|---------------------------|----------------------|----------------|
| discard           | freed (request ends)      | new arrival (back)   | off            |
| vllm-apc          | freed (request ends)      | new arrival (back)   | on             |
| improved-discard  | freed                     | original arrival     | off            |
| preserve          | kept                      | original arrival     | off            |
| ttl               | kept for ttl[type], freed | original arrival     | off            |
| swap              | copied to host, freed     | original arrival     | off            |
| infercept         | min-waste per iteration   | original arrival     | off            |

`infercept` decides per iteration (see `infercept_plan`): swap out the paused requests that would waste
the most within the swap-out budget, then preserve or discard the rest by the paper's Eq. 5.

Under memory pressure every policy gives preserved KV back (`demotion_order`): a paused request never
blocks a running or resuming one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum


class Action(str, Enum):
    PRESERVE = "preserve"
    DISCARD = "discard"


@dataclass(frozen=True)
class PausedView:
    """What a policy may know about one paused request."""

    request_id: str
    aug_type: str
    context_tokens: int
    paused_at_s: float  # engine clock (monotonic seconds)
    expected_duration_s: float | None
    preserved: bool  # its KV is still in the cache


@dataclass(frozen=True)
class PolicySpec:
    name: str
    discard_at_pause: bool
    keep_arrival_time: bool
    prefix_caching: bool
    # Time-to-live per augmentation type ("default" for others); None = no TTL.
    ttl_s: Mapping[str, float] | None = None
    swap_at_pause: bool = False
    min_waste: bool = False

    @property
    def uses_swap(self) -> bool:
        return self.swap_at_pause or self.min_waste


POLICY_NAMES = ("discard", "vllm-apc", "improved-discard", "preserve", "ttl", "swap", "infercept")


@dataclass
class InterceptPolicy:
    spec: PolicySpec

    @property
    def name(self) -> str:
        return self.spec.name

    def on_pause(self, view: PausedView) -> Action:
        if self.spec.discard_at_pause:
            return Action.DISCARD
        if self.spec.ttl_s is not None and self.ttl_for(view.aug_type) <= 0:
            return Action.DISCARD
        return Action.PRESERVE

    def ttl_for(self, aug_type: str) -> float:
        assert self.spec.ttl_s is not None
        return float(self.spec.ttl_s.get(aug_type, self.spec.ttl_s.get("default", math.inf)))

    def expired(self, views: Sequence[PausedView], now_s: float) -> list[str]:
        """Preserved requests whose time-to-live ran out (only the `ttl` policy has any)."""
        if self.spec.ttl_s is None:
            return []
        return [
            v.request_id
            for v in views
            if v.preserved and now_s - v.paused_at_s >= self.ttl_for(v.aug_type)
        ]

    def demotion_order(self, views: Sequence[PausedView], now_s: float) -> list[str]:
        """Preserved requests to free first when running work needs blocks or slots.

        The one expected back last goes first (expected return = pause + expected duration; unknown
        durations count as returning never), ties broken by the larger context (frees more).
        """

        def expected_back(v: PausedView) -> float:
            d = v.expected_duration_s
            return math.inf if d is None else v.paused_at_s + d

        keep = sorted(
            (v for v in views if v.preserved),
            key=lambda v: (expected_back(v), v.context_tokens),
            reverse=True,
        )
        return [v.request_id for v in keep]


DEFAULT_TTL_S: dict[str, float] = {
    # Continuum-style: keep the KV across calls expected to be short, drop it for long ones.
    "math": 1.0,
    "qa": 2.0,
    "ve": 1.0,
    "chat": 0.0,
    "image": 0.0,
    "tts": 0.0,
    "default": 1.0,
}


def make_policy(name: str, ttl_s: Mapping[str, float] | None = None) -> InterceptPolicy:
    specs = {
        "discard": PolicySpec("discard", True, False, False),
        "vllm-apc": PolicySpec("vllm-apc", True, False, True),
        "improved-discard": PolicySpec("improved-discard", True, True, False),
        "preserve": PolicySpec("preserve", False, True, False),
        "ttl": PolicySpec("ttl", False, True, False, dict(ttl_s if ttl_s is not None else DEFAULT_TTL_S)),
        "swap": PolicySpec("swap", False, True, False, swap_at_pause=True),
        "infercept": PolicySpec("infercept", False, True, False, min_waste=True),
    }
    if name not in specs:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
    return InterceptPolicy(specs[name])


@dataclass(frozen=True)
class PausedCost:
    """One paused request's waste under each choice for this iteration (byte-seconds)."""

    request_id: str
    context_blocks: int
    waste_preserve: float
    waste_discard: float
    # Our extension: swapping only pays when the call is expected to outlast the round trip of the
    # copy (out and back in); otherwise the request would be back before its KV is.
    swap_worthwhile: bool = True

    @property
    def waste(self) -> float:  # Eq. 5
        return min(self.waste_preserve, self.waste_discard)


@dataclass(frozen=True)
class IterationPlan:
    swap_out: list[str]
    discard: list[str]
    preserve: list[str]


def infercept_plan(costs: Sequence[PausedCost], swap_out_budget_blocks: int, host_free_blocks: int) -> IterationPlan:
    """The paper's per-iteration choice: sort paused requests by their minimum waste, largest first;
    swap out from the top while the swap-out budget and the host buffer allow; preserve or discard the
    rest, whichever wastes less. A request bigger than one iteration's budget still starts swapping
    (its copy continues over the next iterations) when it is first in line and the budget is unused,
    so large contexts are not starved."""
    swap, discard, keep = [], [], []
    budget, host = swap_out_budget_blocks, host_free_blocks
    for c in sorted(costs, key=lambda c: c.waste, reverse=True):
        fits_host = c.context_blocks <= host
        if fits_host and c.swap_worthwhile and c.waste > 0 and (c.context_blocks <= budget or (budget == swap_out_budget_blocks and budget > 0)):
            swap.append(c.request_id)
            budget -= min(budget, c.context_blocks)
            host -= c.context_blocks
        elif c.waste_discard < c.waste_preserve:
            discard.append(c.request_id)
        else:
            keep.append(c.request_id)
    return IterationPlan(swap_out=swap, discard=discard, preserve=keep)
