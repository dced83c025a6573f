from __future__ import annotations

from collections.abc import Callable

import pytest

from engine_adapter.intercept.meter import WAIT_REASONS, AdmissionMeter, WasteMeter
from engine_adapter.intercept.records import (
    BlockCounts,
    Fate,
    InterceptRecord,
    Ledger,
    RestoredBy,
)


def pause(ledger: Ledger, rid: str, ctx: int, at: float) -> InterceptRecord:
    return ledger.pause(session_id="s", request_id=rid, aug_type="qa", trigger="react", tool="Wikipedia",
                        policy="p", context_tokens=ctx, paused_at_s=at)


def test_preserved_span_and_resume() -> None:
    led = Ledger()
    rec = pause(led, "a", 100, at=10.0)
    assert led.totals_at(now_s=12.0).preserved_token_seconds == pytest.approx(200.0)
    led.resume(rec, now_s=13.0, requeued_arrival_time=1.0)
    assert rec.restored_by is RestoredBy.PRESERVE and rec.tokens_kept == 100 and rec.complete
    assert rec.call_duration_s == pytest.approx(3.0)
    assert led.totals_at(now_s=50.0).preserved_token_seconds == pytest.approx(300.0)
    assert "a" not in led.open


def test_discard_then_recompute_with_prefix_hits() -> None:
    led = Ledger()
    rec = pause(led, "a", 100, at=0.0)
    led.release_kv(rec, Fate.DEMOTED, now_s=2.0)
    led.resume(rec, now_s=5.0, requeued_arrival_time=0.0)
    assert not rec.complete  # known only at its first schedule
    led.recomputed(rec, prefix_hit_tokens=64)
    assert (rec.kv_fate, rec.tokens_recomputed, rec.tokens_prefix_hit, rec.restored_by) == (
        Fate.DEMOTED, 36, 64, RestoredBy.PARTIAL_PREFIX_CACHE)
    t = led.totals_at(now_s=9.0)
    assert (t.demoted, t.recomputed_tokens, t.prefix_hit_tokens) == (1, 36, 64)
    assert t.preserved_token_seconds == pytest.approx(200.0)  # only until the demotion


def test_record_round_trips_as_a_dict() -> None:
    led = Ledger()
    rec = pause(led, "a", 64, at=1.0)
    led.release_kv(rec, Fate.SWAP, now_s=2.0, moved_tokens=64)
    led.resume(rec, now_s=3.0, requeued_arrival_time=1.0)
    led.swapped_in(rec, 64)
    d = rec.to_dict()
    assert d["kv_fate"] == "swap" and d["restored_by"] == "swap"  # plain JSON values on the wire
    assert InterceptRecord.from_dict(d) == rec
    assert led.totals.swapped_out == 1 and led.totals.swapped_out_tokens == 64 and led.totals.swapped_in_tokens == 64


def test_integrity_check() -> None:
    BlockCounts(total=10, free=5, running=3, preserved=2).check()
    with pytest.raises(AssertionError, match="integrity"):
        BlockCounts(total=10, free=5, running=3, preserved=1).check()


def test_waste_meter_by_kind() -> None:
    m = WasteMeter(kv_bytes_per_token=1000)
    m.start_recompute("r", 100)
    # 0.2 s iteration: 100 of 400 tokens recompute, 3000 tokens resident, 0.05 s of swap stall.
    m.iteration(0.2, {"r": 150, "x": 250}, resident_tokens=3000, swap_stall_s=0.05)
    m.iteration(0.1, {"r": 10}, resident_tokens=3000)  # r is done recomputing
    rep = m.report(preserved_token_s=6000.0)
    assert rep.forward_s == pytest.approx(0.3)
    assert rep.recompute_forward_s == pytest.approx(0.05)
    assert rep.recompute_share_of_forward == pytest.approx(0.05 / 0.3)
    assert rep.by_kind["recompute"].token_s == pytest.approx(0.05 * 3000)
    assert rep.by_kind["swap_stall"].token_s == pytest.approx(0.05 * 3000)
    assert rep.by_kind["preserved_idle"].gb_min == pytest.approx(6000 * 1000 / 1e9 / 60)
    assert m.recomputing == {}


def test_admission_meter_charges_each_interval_to_the_reason_the_step_before_gave() -> None:
    m = AdmissionMeter()
    assert not m.fed  # an engine whose scheduler never fed it reports nothing
    m.step(10.0, waiting_new=3, reason="slots", admitted=1)  # 3 new requests left waiting: no slot
    m.step(10.5, waiting_new=1, reason="budget", admitted=2)  # 0.5 s x 3 charged to the slots
    m.step(11.0, waiting_new=0, reason=None, admitted=1)  # 0.5 s x 1 to the budget; nobody waits now
    m.step(12.0, waiting_new=0, reason=None, admitted=0)  # nothing charged
    assert m.wait_s == {"slots": 1.5, "budget": 0.5, "blocks": 0.0, "behind_resumed": 0.0}
    assert m.admitted == 4 and set(m.wait_s) == set(WAIT_REASONS)


def test_a_schedule_is_charged_to_the_first_reason_the_waiting_scan_gives() -> None:
    m, seen = AdmissionMeter(), {"r"}  # `r` ran before: a resumed request
    asked: list[str] = []

    def stop(rid: str | None) -> Callable[[], str | None]:
        def scan_stop() -> str | None:
            asked.append("stop")
            return rid
        return scan_stop

    # `a` and `b` are new; `a` is scheduled (its first schedule), `b` and `r` are left waiting.
    assert m.schedule(0.0, ["a"], ["b", "r"], seen, slots_full=True, budget_full=True, stop=stop("b")) == (1, "slots", 1)
    assert seen == {"r", "a"} and asked == []  # the scan's stop is asked only when slots and budget do not explain it
    assert m.schedule(1.0, [], ["b", "r"], seen, slots_full=False, budget_full=True, stop=stop("b")) == (1, "budget", 0)
    assert m.schedule(2.0, [], ["r", "b"], seen, slots_full=False, budget_full=False, stop=stop("r")) == (1, "behind_resumed", 0)
    assert m.schedule(3.0, [], ["b"], seen, slots_full=False, budget_full=False, stop=stop("b")) == (1, "blocks", 0)
    assert m.schedule(4.0, ["b", "a"], [], seen, slots_full=False, budget_full=False, stop=stop(None)) == (0, None, 1)
    assert asked == ["stop", "stop"]
    assert m.wait_s == {"slots": 1.0, "budget": 1.0, "behind_resumed": 1.0, "blocks": 1.0} and m.admitted == 2
