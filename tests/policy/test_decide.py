from __future__ import annotations

import dataclasses
import math

import pytest

from engine_adapter.policy import (
    DEFAULT_TTL_S,
    POLICIES,
    POLICY_NAMES,
    Action,
    PausedView,
    policy_spec,
)
from engine_adapter.policy.decide import continuum_ttl_s, demotion_order, ttl_expired, ttl_for
from engine_adapter.policy.table import pause_action


def view(rid: str, aug: str = "math", ctx: int = 100, at: float = 0.0, exp: float | None = None) -> PausedView:
    return PausedView(rid, aug, ctx, at, exp)


@pytest.mark.parametrize(
    "name, action, keeps_arrival, apc, swap",
    [
        ("discard", Action.DISCARD, False, False, False),
        ("vllm-apc", Action.DISCARD, False, True, False),
        ("vllm-offload", Action.DISCARD, False, True, False),  # vllm-apc with vLLM's host tier
        ("improved-discard", Action.DISCARD, True, False, False),
        ("preserve", Action.PRESERVE, True, False, False),
        ("ttl", Action.PRESERVE, True, False, False),
        ("continuum", Action.PRESERVE, True, True, False),  # for the TTL chosen at the pause
        ("chunked-discard", Action.DISCARD, True, False, False),
        ("swap", Action.SWAP, True, False, True),
        ("swap-heuristic", Action.PRESERVE, True, False, True),  # swapped per iteration when the call is long
        ("infercept-paper", Action.PRESERVE, True, False, True),
        ("infercept", Action.PRESERVE, True, False, True),  # decided per iteration afterwards
        ("infercept-admit", Action.PRESERVE, False, False, True),  # queued at its return; new requests first
    ],
)
def test_policy_table(name: str, action: Action, keeps_arrival: bool, apc: bool, swap: bool) -> None:
    spec = policy_spec(name)
    assert pause_action(spec, ttl_for(DEFAULT_TTL_S, "math") if spec.ttl else None) is action
    assert (spec.keep_arrival_time, spec.prefix_caching, spec.swap) == (keeps_arrival, apc, swap)
    assert spec.summary and (spec.decide is not None) == (name in ("swap-heuristic", "infercept-paper", "infercept", "infercept-admit"))
    # The ablation adds one technique per step: chunking from chunked-discard on, the paper's estimate
    # until the last step.
    chunked = ("chunked-discard", "swap", "swap-heuristic", "infercept-paper", "infercept", "infercept-admit")
    assert spec.chunk_at_saturation == (name in chunked)
    assert spec.estimator == ("dynamic" if name in ("swap-heuristic", "infercept-paper") else None)
    assert spec.host_tier == (name == "vllm-offload")
    assert spec.new_first == (name == "infercept-admit")


def test_ttl_expiry_per_type() -> None:
    ttl = {"math": 1.0, "chat": 0.0, "default": 5.0}
    assert pause_action(policy_spec("ttl"), ttl_for(ttl, "chat")) is Action.DISCARD  # zero TTL: nothing to keep
    assert pause_action(policy_spec("ttl"), ttl_for(ttl, "math")) is Action.PRESERVE
    assert pause_action(policy_spec("preserve"), None) is Action.PRESERVE  # only the ttl policies
    views = [dataclasses.replace(view("m", "math", at=10.0), ttl_s=ttl_for(ttl, "math")),
             dataclasses.replace(view("q", "qa", at=10.0), ttl_s=ttl_for(ttl, "qa"))]
    assert ttl_expired(views, now_s=10.5) == []
    assert ttl_expired(views, now_s=11.0) == [("m", 11.0)]
    assert ttl_expired(views, now_s=15.0) == [("m", 11.0), ("q", 15.0)]  # the moment each ran out
    assert math.isinf(ttl_for({"math": 1.0}, "tts"))
    assert ttl_expired([view("x", at=0.0)], now_s=1e9) == []  # no TTL set: kept


def test_continuum_ttl_trades_memory_against_reload() -> None:
    # Calls of 1 s and 10 s, half each; 1000 tokens of 1 KiB. Keeping through the short calls costs
    # M*ctx*(0.5*1 + 0.5*1) = 1.024e6 byte-s plus half the reloads; keeping through all costs 5.632e6.
    mem = 1000 * 1024
    samples = [1.0] * 5 + [10.0] * 5
    assert continuum_ttl_s(samples, 1000, 1024, reload_byte_s=0.5 * mem) == 0.0  # reload cheap: never keep
    assert continuum_ttl_s(samples, 1000, 1024, reload_byte_s=4.0 * mem) == 1.0  # keep through the short calls
    assert continuum_ttl_s(samples, 1000, 1024, reload_byte_s=20.0 * mem) == 10.0  # reload dear: keep through all
    assert continuum_ttl_s([], 1000, 1024, reload_byte_s=1e12) == 0.0  # nothing known: nothing kept
    # The cost is the expectation over the samples at the chosen tau (brute force over a fine grid agrees).
    xs = [0.2, 0.5, 0.9, 3.0, 7.0]
    reload = 2.5 * mem

    def cost(tau: float) -> float:
        return sum(mem * min(x, tau) + (reload if x > tau else 0.0) for x in xs) / len(xs)

    best = continuum_ttl_s(xs, 1000, 1024, reload)
    assert all(cost(best) <= cost(t / 100) + 1e-6 for t in range(0, 1000))


def test_demotion_order_latest_return_first() -> None:
    views = [
        view("soon", at=0.0, exp=1.0),
        view("late", at=0.0, exp=30.0),
        view("unknown-small", ctx=10, exp=None),
        view("unknown-big", ctx=500, exp=None),
    ]
    assert demotion_order(views) == ["unknown-big", "unknown-small", "late", "soon"]


def test_unknown_policy_and_names() -> None:
    with pytest.raises(ValueError, match="unknown policy 'lru'; choose one of discard, "):
        policy_spec("lru")
    assert set(POLICY_NAMES) == set(POLICIES) == {
        "discard", "vllm-apc", "vllm-offload", "preserve", "ttl", "improved-discard", "chunked-discard", "swap", "swap-heuristic",
        "infercept-paper", "infercept", "continuum", "infercept-admit", "infercept-prefetch", "infercept-slack",
        "infercept-apc", "infercept-offload"}


def test_only_infercept_apc_swaps_with_prefix_caching() -> None:
    # The other swap policies run without vLLM's prefix cache, as the paper's did.
    assert [n for n, p in POLICIES.items() if p.swap and p.prefix_caching] == ["infercept-apc"]
    apc, admit = policy_spec("infercept-apc"), policy_spec("infercept-admit")
    import dataclasses

    assert dataclasses.replace(apc, name=admit.name, summary=admit.summary, prefix_caching=False) == admit


def test_policy_table_host_tier_needs_prefix_caching_and_no_swap() -> None:
    # vLLM's host tier finds blocks by their prefix-cache hash, and it is the engine's one KV connector.
    import dataclasses

    spec = policy_spec("vllm-offload")
    with pytest.raises(ValueError, match="the host tier needs prefix caching"):
        dataclasses.replace(spec, prefix_caching=False)
    with pytest.raises(ValueError, match="excludes swap"):
        dataclasses.replace(spec, prefix_caching=False, swap=True)
