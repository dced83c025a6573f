from __future__ import annotations

import pytest

from engine_adapter.accounting import BlockCounts, Ledger


def pause(ledger: Ledger, rid: str, ctx: int, at: float) -> None:
    ledger.pause(session_id="s", request_id=rid, aug_type="qa", trigger="react", tool="Wikipedia",
                 policy="p", context_tokens=ctx, paused_at_s=at)


def test_preserved_span_and_resume() -> None:
    led = Ledger()
    pause(led, "a", 100, at=10.0)
    assert led.snapshot(now_s=12.0)["preserved_token_seconds"] == pytest.approx(200.0)
    rec = led.resume("a", now_s=13.0, requeued_arrival_time=1.0)
    assert rec is not None and rec.restored_by == "preserve" and rec.tokens_kept == 100
    assert rec.call_duration_s == pytest.approx(3.0)
    assert led.snapshot(now_s=50.0)["preserved_token_seconds"] == pytest.approx(300.0)


def test_discard_then_recompute_with_prefix_hits() -> None:
    led = Ledger()
    pause(led, "a", 100, at=0.0)
    led.release_kv("a", "demoted", now_s=2.0)
    led.resume("a", now_s=5.0, requeued_arrival_time=0.0)
    led.recomputed("a", prefix_hit_tokens=64)
    rec = led.records[0]
    assert (rec.kv_fate, rec.tokens_recomputed, rec.tokens_prefix_hit, rec.restored_by) == (
        "demoted", 36, 64, "partial-prefix-cache")
    t = led.snapshot(now_s=9.0)
    assert (t["demoted"], t["recomputed_tokens"], t["prefix_hit_tokens"]) == (1, 36, 64)
    assert t["preserved_token_seconds"] == pytest.approx(200.0)  # only until the demotion


def test_integrity_check() -> None:
    BlockCounts(total=10, free=5, running=3, preserved=2).check()
    with pytest.raises(AssertionError, match="integrity"):
        BlockCounts(total=10, free=5, running=3, preserved=1).check()


def test_waste_meter_by_kind() -> None:
    from engine_adapter.accounting import WasteMeter

    m = WasteMeter(kv_bytes_per_token=1000)
    # 0.2 s iteration: 100 of 400 tokens recompute, 3000 tokens resident, 0.05 s of swap stall.
    m.iteration(0.2, scheduled_tokens=400, recompute_tokens=100, resident_tokens=3000, swap_stall_s=0.05)
    m.iteration(0.1, scheduled_tokens=10, recompute_tokens=0, resident_tokens=3000)
    snap = m.snapshot(preserved_token_s=6000.0)
    assert snap["forward_s"] == pytest.approx(0.3)
    assert snap["recompute_forward_s"] == pytest.approx(0.05)
    assert snap["recompute_share_of_forward"] == pytest.approx(0.05 / 0.3)
    assert snap["by_kind"]["recompute"]["token_s"] == pytest.approx(0.05 * 3000)
    assert snap["by_kind"]["swap_stall"]["token_s"] == pytest.approx(0.05 * 3000)
    assert snap["by_kind"]["preserved_idle"]["gb_min"] == pytest.approx(6000 * 1000 / 1e9 / 60)
