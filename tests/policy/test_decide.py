from __future__ import annotations

import math

import pytest

from engine_adapter.policy import POLICY_NAMES, Action, PausedView, make_policy


def view(rid: str, aug: str = "math", ctx: int = 100, at: float = 0.0, exp: float | None = None, preserved: bool = True) -> PausedView:
    return PausedView(rid, aug, ctx, at, exp, preserved)


@pytest.mark.parametrize(
    "name, action, keeps_arrival, apc",
    [
        ("discard", Action.DISCARD, False, False),
        ("vllm-apc", Action.DISCARD, False, True),
        ("improved-discard", Action.DISCARD, True, False),
        ("preserve", Action.PRESERVE, True, False),
        ("ttl", Action.PRESERVE, True, False),
        ("swap", Action.PRESERVE, True, False),  # kept until its copy to the host has finished
        ("infercept", Action.PRESERVE, True, False),  # decided per iteration afterwards
    ],
)
def test_policy_table(name: str, action: Action, keeps_arrival: bool, apc: bool) -> None:
    p = make_policy(name)
    assert p.on_pause(view("a")) is action
    assert p.spec.keep_arrival_time is keeps_arrival
    assert p.spec.prefix_caching is apc


def test_ttl_expiry_per_type() -> None:
    p = make_policy("ttl", {"math": 1.0, "chat": 0.0, "default": 5.0})
    assert p.on_pause(view("c", aug="chat")) is Action.DISCARD  # zero TTL: nothing to keep
    views = [view("m", "math", at=10.0), view("q", "qa", at=10.0), view("gone", "math", at=0.0, preserved=False)]
    assert p.expired(views, now_s=10.5) == []
    assert p.expired(views, now_s=11.0) == ["m"]
    assert p.expired(views, now_s=15.0) == ["m", "q"]
    assert make_policy("preserve").expired(views, now_s=1e9) == []


def test_demotion_order_latest_return_first() -> None:
    p = make_policy("preserve")
    views = [
        view("soon", at=0.0, exp=1.0),
        view("late", at=0.0, exp=30.0),
        view("unknown-small", ctx=10, exp=None),
        view("unknown-big", ctx=500, exp=None),
        view("freed", exp=100.0, preserved=False),
    ]
    assert p.demotion_order(views, now_s=0.5) == ["unknown-big", "unknown-small", "late", "soon"]


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("lru")
    assert set(POLICY_NAMES) == {"discard", "vllm-apc", "improved-discard", "preserve", "ttl", "swap", "infercept"}
    assert math.isinf(make_policy("ttl", {"math": 1.0}).ttl_for("tts"))
