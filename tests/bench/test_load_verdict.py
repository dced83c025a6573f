"""`infercept loadtest`'s verdicts (pure): a phase passes only if all its conditions hold, and the
disconnect and kill phases fail when they measured nothing (sessions refused before streaming)."""

from __future__ import annotations

import copy

from infercept import load_verdict
from infercept.loadtest import DISCONNECT_TURN_TOKENS, MAX_MODEL_LEN, long_turn_tokens

AFTER = {"deleted": 4, "blocks": {"total": 10, "free": 10}, "all_blocks_free": True,
         "integrity": {"total": 10, "free": 10, "running": 0, "preserved": 0, "host_tokens": 0}, "running": 0, "waiting": 0}
SUMMARY = {"clients": 4, "done": 4, "outcomes": {"done": 4}, "http_5xx": 0, "refused_or_reset": 0}
GOOD = {
    "sessions": {**SUMMARY, "tool_calls": 4, "after": AFTER},
    "disconnects": {"clients": 4, "dropped_mid_stream": 4, "outcomes": {"dropped": 4},
                    "after_drop": {"running": 0, "waiting": 0, "turns_in_progress": 0, "leaked_blocks": 0},
                    "still_usable": SUMMARY, "after": AFTER},
    "kill": {"sessions_before": 4, "sessions_lost": 0, "finished_before_kill": 2, "finished_sessions": 2,
             "finished_sessions_intact": 2, "interrupted_sessions": 2, "interrupted_sessions_intact": 2, "mid_turn_at_kill": 2,
             "next_message_done": 4, "next_message_outcomes": {"done": 4}, "engine_processes_left_behind": 0},
    "schemathesis": {"exit_code": 0, "timed_out": False, "timeout_s": 60, "http_5xx": 0, "requests": 1200, "required_requests": 1000},
    "balanced": {**SUMMARY, "tool_calls": 4, "sessions_by_replica": {"r1": 2, "r2": 2},
                 "after": {"deleted": 4, "replicas": {r: {"blocks": {"total": 10, "free": 10}, "integrity": {"total": 10, "free": 10},
                                                          "running": 0, "waiting": 0} for r in ("r1", "r2")}}},
    "failover": {"sessions_before": 4, "victim": "r1", "sessions_lost": 0, "finished_before_kill": 2, "finished_sessions_intact": 2,
                 "cut_mid_stream": 1, "cut_sessions_intact": 1, "mid_turn_not_cut": 1, "mid_turn_not_cut_usable": 1,
                 "next_message_done": 4, "next_message": {"done": 4}, "engine_processes_left_behind": 0,
                 "statuses": {"by_status": {"200": 9, "503": 2}, "http_5xx_not_503": 0, "http_503_without_retry_after": 0}},
    "rolling": {"clients": 2, "sessions": 3, "sessions_lost": 0, "restarts": [{"exit_code": 0}, {"exit_code": 0}],
                "turns_done": 9, "turns_sent": 9, "turns": {"done": 9}, "sessions_with_every_turn": 3,
                "statuses": {"by_status": {"200": 12, "503": 1}, "http_5xx_not_503": 0, "http_503_without_retry_after": 0}},
    "idle": {"sessions": 100, "opened": 100, "open_failures": {}, "rss_growth_mb": 50.0,
             "read_back": {"sessions": 10, "not_200": 0}, "next_message": {"done": 5}, "next_message_done": 5},
}


def bad(phase: str, path: list[str], value: object) -> dict:
    out = copy.deepcopy(GOOD[phase])
    d = out
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return out


def test_good_phases_pass() -> None:
    for phase, out in GOOD.items():
        assert load_verdict.judge(phase, out) == {"pass": True, "failures": []}, phase
    assert load_verdict.line("kill", load_verdict.judge("kill", GOOD["kill"])) == "[loadtest] kill: PASS"


def test_each_condition_fails_its_phase() -> None:
    cases = [
        ("sessions", ["done"], 3), ("sessions", ["refused_or_reset"], 1), ("sessions", ["http_5xx"], 1),
        ("sessions", ["tool_calls"], 3), ("sessions", ["after", "all_blocks_free"], False),
        ("sessions", ["after", "integrity", "free"], 9), ("sessions", ["after", "deleted"], 3),
        # Every session refused with a 400 (max_tokens over the context): the phase measured nothing.
        ("disconnects", ["outcomes"], {"http:400": 4}), ("disconnects", ["dropped_mid_stream"], 0),
        ("disconnects", ["after_drop", "leaked_blocks"], 2), ("disconnects", ["after_drop", "running"], 1),
        ("disconnects", ["still_usable", "done"], 3),
        ("kill", ["sessions_lost"], 1), ("kill", ["mid_turn_at_kill"], 0), ("kill", ["interrupted_sessions_intact"], 1),
        ("kill", ["next_message_done"], 3), ("kill", ["engine_processes_left_behind"], 1),
        ("kill", ["finished_sessions_intact"], 1),
        ("schemathesis", ["exit_code"], 1), ("schemathesis", ["http_5xx"], 2), ("schemathesis", ["timed_out"], True),
        ("schemathesis", ["requests"], 10),
        ("balanced", ["http_5xx"], 1), ("balanced", ["sessions_by_replica"], {"r1": 4}),
        ("balanced", ["after", "replicas", "r2", "running"], 1),
        ("failover", ["sessions_lost"], 1), ("failover", ["cut_mid_stream"], 0), ("failover", ["cut_sessions_intact"], 0),
        ("failover", ["finished_sessions_intact"], 1), ("failover", ["next_message_done"], 3),
        ("failover", ["statuses", "http_5xx_not_503"], 1), ("failover", ["statuses", "http_503_without_retry_after"], 1),
        ("rolling", ["sessions_lost"], 1), ("rolling", ["turns_done"], 8), ("rolling", ["restarts"], [{"exit_code": 1}]),
        ("rolling", ["sessions_with_every_turn"], 2), ("rolling", ["statuses", "http_5xx_not_503"], 2),
        ("idle", ["opened"], 99), ("idle", ["rss_growth_mb"], 4096.0), ("idle", ["read_back", "not_200"], 1),
        ("idle", ["next_message_done"], 4),
    ]
    for phase, path, value in cases:
        v = load_verdict.judge(phase, bad(phase, path, value))
        assert not v["pass"] and len(v["failures"]) >= 1, (phase, path, value)
        assert "FAIL" in load_verdict.line(phase, v)


def test_a_phase_that_did_not_finish_fails() -> None:
    v = load_verdict.judge("kill", {"sessions_lost": 0})
    assert not v["pass"] and "did not run to the end" in v["failures"][0]
    v = load_verdict.judge("sessions", {"error": "RuntimeError: server not ready"})
    assert v == {"pass": False, "failures": ["the phase failed: RuntimeError: server not ready"]}


def test_long_turns_fit_the_loadtest_context() -> None:
    # The disconnect and kill clients' sessions must be accepted (max_tokens within max_model_len).
    assert 16 < long_turn_tokens(MAX_MODEL_LEN) < MAX_MODEL_LEN
    assert 16 < DISCONNECT_TURN_TOKENS < MAX_MODEL_LEN
