"""vLLM's step order (`engine_adapter/intercept/step.py`), the one rule the engine's port and the simulator
both build the core's `StepView` with: exact block counts on constructed queues (16-token blocks)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

from engine_adapter.intercept.state import StepView
from engine_adapter.intercept.step import Admission, StepLimits, StepRequest, admission, arrival_index, new_first, step_view

BS = 16


def limits(budget: int, *, max_model_len: int = 1000, full: bool = True, lookahead: int = 0) -> StepLimits:
    return StepLimits(token_budget=budget, block_size=BS, max_model_len=max_model_len, reserve_full_isl=full,
                      lookahead_tokens=lookahead)


def req(rid: str, computed: int, tokens: int, blocks: int) -> StepRequest:
    return StepRequest(rid, computed, tokens, blocks)


# a decodes inside its 7th block; b's next token opens an 8th; c is a 200-token prompt.
RUNNING = [req("a", 100, 101, 7), req("b", 112, 113, 7), req("c", 0, 200, 0)]


def test_running_requests_share_the_budget_in_order_and_the_head_waits_when_none_is_left() -> None:
    v = step_view(RUNNING, [req("h", 0, 50, 0)], limits(64))
    # a: 0 blocks, b: 1, c: 62 tokens of its prompt (4 blocks); no budget left for h, still named.
    # Ahead: c's whole prompt (13 blocks) and h's (4).
    # The step computes the whole budget: a's and b's decode tokens and 62 of c's prompt.
    assert v == StepView(blocks_needed=5, head_waiting="h", head_blocks=0, running_requests=3, running_tokens=212,
                         blocks_ahead=0 + 1 + 13 + 4, step_tokens=64)


def test_the_head_is_admitted_only_when_its_whole_sequence_fits_under_reserve_full_isl() -> None:
    head = [req("h", 0, 500, 0)]
    # The running requests take 2 + 200 tokens of 300; h gets a 98-token chunk (7 blocks) but vLLM admits
    # it only when its 500 tokens (32 blocks) fit.
    v = step_view(RUNNING, head, limits(300))
    assert (v.blocks_needed, v.head_blocks, v.blocks_ahead) == (1 + 13 + 32, 32, 1 + 13 + 32)
    assert v.step_tokens == 202  # the running requests' only: whether h is admitted depends on free blocks
    v = step_view(RUNNING, head, limits(300, full=False))
    assert (v.blocks_needed, v.head_blocks, v.blocks_ahead) == (1 + 13 + 7, 7, 1 + 13 + 32)


def test_a_session_resumed_in_place_needs_only_the_blocks_past_those_it_holds() -> None:
    # 300 tokens computed in 19 blocks (304 slots), 30 appended: 330 tokens need 21 blocks.
    v = step_view([], [req("s", 300, 330, 19)], limits(64))
    assert (v.head_waiting, v.head_blocks, v.blocks_needed, v.blocks_ahead) == ("s", 2, 2, 2)
    assert v.running_requests == 0 and v.running_tokens == 0


def test_speculative_tokens_count_in_a_running_requests_step() -> None:
    # Decoding at 110 computed in 7 blocks (112 slots): the sampled token alone fits, with 3 draft tokens
    # (vLLM's num_tokens_with_spec = 114) the step needs an 8th block.
    assert step_view([req("d", 110, 111, 7)], [], limits(64)).blocks_needed == 0
    assert step_view([req("d", 110, 114, 7)], [], limits(64)).blocks_needed == 1


def test_lookahead_slots_are_allocated_with_the_new_tokens() -> None:
    # 109 computed + 1 new + 2 lookahead = 112 slots: 7 blocks; 3 lookahead: 113, an 8th.
    assert step_view([req("e", 109, 110, 7)], [], limits(64, lookahead=2)).blocks_needed == 0
    assert step_view([req("e", 109, 110, 7)], [], limits(64, lookahead=3)).blocks_needed == 1
    # A request that gets no token this step allocates nothing, lookahead included.
    v = step_view([req("x", 0, 64, 0), req("e", 109, 110, 7)], [], limits(64, lookahead=3))
    assert (v.blocks_needed, v.blocks_ahead) == (5 + 0, 5 + 1)  # x: 64 + 3 slots, 5 blocks


def test_max_model_len_caps_a_running_request_and_the_heads_sequence() -> None:
    # max_model_len 120: a running request computes up to position 119 (one slot for its sample): 1 new block,
    # not the 2 its 130 tokens with spec would take; the head's whole sequence is capped at 120 tokens.
    v = step_view([req("f", 100, 130, 7)], [req("h", 0, 300, 0)], limits(200, max_model_len=120))
    assert v.blocks_needed == 1 + 8 and v.head_blocks == 8 and v.blocks_ahead == 1 + 8


def test_only_the_first_admissible_request_is_read() -> None:
    def queue() -> Iterator[StepRequest]:
        yield req("first", 0, 16, 0)
        raise AssertionError("read past the head")

    assert step_view([], queue(), limits(64)).head_waiting == "first"
    assert step_view([], [], limits(64)) == StepView(0, None)


def test_admission_checks_the_whole_sequence_against_free_blocks_and_the_chunk_beside_reservations() -> None:
    a = admission(0, 160, 64, 0, limits(64))  # 10 blocks in all, 4 for this chunk
    assert a == Admission(full_blocks=10, chunk_blocks=4) and a.blocks == 10
    assert a.fits(10) and not a.fits(9)
    assert a.fits(10, reserved_blocks=6) and not a.fits(10, reserved_blocks=7)
    assert admission(0, 160, 64, 0, limits(64, full=False)) == Admission(0, 4)
    # An asynchronous KV load computes nothing this step and gets no lookahead: blocks for what it loads.
    assert admission(300, 330, 0, 0, limits(64, lookahead=3)) == Admission(21, 19)


def test_a_requeued_request_goes_after_everyone_who_arrived_no_later() -> None:
    q = [SimpleNamespace(arrival_time=t) for t in (1.0, 2.0, 2.0, 5.0)]
    assert [arrival_index(q, t) for t in (0.5, 2.0, 3.0, 9.0)] == [0, 3, 3, 4]
    assert arrival_index([], 1.0) == 0


def test_new_requests_pass_a_resumed_head_only_when_it_does_not_fit() -> None:
    lim = limits(256)
    head = req("resumed", 0, 640, 0)  # a recompute of 640 tokens: 40 blocks for its whole sequence
    assert new_first(head, ["n1", "n2"], free_blocks=39, limits=lim) == ["n1", "n2"]  # in queue order
    assert new_first(head, ["n1", "n2"], free_blocks=40, limits=lim) == []  # it fits: first come, first served
    assert new_first(head, [], free_blocks=0, limits=lim) == []  # nobody to pass it
    assert new_first(req("n0", 0, 640, 0), ["n0", "n1"], free_blocks=0, limits=lim) == []  # the head is new itself
    assert new_first(None, ["n1"], free_blocks=0, limits=lim) == []
    # Without reserve_full_isl only this step's chunk must fit (16 blocks of a 256-token budget).
    assert new_first(head, ["n1"], free_blocks=16, limits=limits(256, full=False)) == []
    assert new_first(head, ["n1"], free_blocks=15, limits=limits(256, full=False)) == ["n1"]
