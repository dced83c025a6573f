"""Session lifecycle on the real engine: closing mid-generation, bad input, context limits."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine_adapter.engine import InterceptEngine
from engine_adapter.events import (
    ContextTooLong,
    EngineError,
    SessionBusy,
    SessionClosed,
    TurnEnd,
)
from engine_adapter.intercept.reports import STEP_PARTS
from tests.conftest import TINY_MAX_LEN
from tests.engine.helpers import wait_all_free
from tests.waiting import wait_until


async def test_close_while_generating_aborts_and_frees(policy_engine: InterceptEngine) -> None:
    engine = policy_engine
    s = engine.open_session(max_tokens=300)
    events: list[object] = []

    async def consume() -> None:
        async for ev in s.turn(engine.encode("Tell me a long story about a door.")):
            events.append(ev)

    task = asyncio.create_task(consume())
    await wait_until(lambda: len(events) >= 3, 60, "the first tokens of the story")
    with pytest.raises(SessionBusy):
        async for _ in s.turn("more"):
            pass
    await s.close()
    await asyncio.wait_for(task, timeout=30)
    assert isinstance(events[-1], TurnEnd) and events[-1].reason == "aborted"
    assert 3 <= len(events[-1].token_ids) < 300
    counts = await wait_all_free(engine)
    assert counts.free == counts.total, counts
    with pytest.raises(SessionClosed):
        async for _ in s.turn("again"):
            pass
    assert s.id not in engine.sessions


async def test_context_limit_and_empty_first_turn(policy_engine: InterceptEngine) -> None:
    engine = policy_engine
    s = engine.open_session(max_tokens=50)
    with pytest.raises(ContextTooLong) as err:
        async for _ in s.turn([100] * TINY_MAX_LEN):
            pass
    assert err.value.limit == TINY_MAX_LEN
    with pytest.raises(EngineError):
        async for _ in s.turn([]):
            pass
    # A turn near the limit is capped so the context never exceeds it.
    end = None
    async for ev in s.turn([100] * (TINY_MAX_LEN - 10)):
        if isinstance(ev, TurnEnd):
            end = ev
    assert end is not None and end.reason == "length" and len(end.token_ids) == 10
    await s.close()
    counts = await wait_all_free(engine)
    assert counts.free == counts.total


@pytest.mark.policies("discard", "vllm-apc", "improved-discard")  # the policies that free the KV at the pause
async def test_a_pause_without_kv_leaves_the_engine_idle(policy_engine: InterceptEngine) -> None:
    """A paused request whose KV was freed still sits in vLLM's KV-holding queue; the engine must not
    count it as work (it would step empty iterations for as long as the call lasts)."""
    engine = policy_engine
    s = engine.open_session(max_tokens=4)
    async for _ in s.turn(engine.encode("Tell me about doors.")):
        pass
    before = (await engine.stats()).steps
    await asyncio.sleep(0.5)
    after = (await engine.stats()).steps
    assert after - before <= 1, f"{after - before} empty steps while only a freed pause existed"
    await s.close()


@pytest.mark.policies("preserve")  # the scheduler subclass times its steps the same under every policy
async def test_the_engine_times_the_parts_of_its_steps_besides_the_forward_pass(policy_engine: InterceptEngine) -> None:
    """A step's time outside the forward pass, by part (`STEP_PARTS`), summed over the steps with tokens:
    each part grows while the engine works, and with the forward pass they fit in the wall time the turn
    took. While the turn is paused nothing is scheduled, so only `empty` may grow."""
    engine = policy_engine
    st0 = await engine.stats()
    assert st0.step_parts_s is not None and set(st0.step_parts_s) == set(STEP_PARTS)
    t0 = time.perf_counter()
    s = engine.open_session(max_tokens=16, ignore_eos=True)
    async for _ in s.turn(engine.encode("Count the doors in the hall.")):
        pass
    wall = time.perf_counter() - t0
    st1 = await engine.stats()
    assert st1.step_parts_s is not None
    busy = [k for k in STEP_PARTS if k != "empty"]
    grew = {k: st1.step_parts_s[k] - st0.step_parts_s[k] for k in busy}
    assert all(v > 0 for v in grew.values()), grew
    assert sum(grew.values()) + st1.waste.forward_s - st0.waste.forward_s < wall
    await asyncio.sleep(0.3)  # paused (`preserve` keeps its KV): no step schedules tokens
    st2 = await engine.stats()
    assert st2.step_parts_s is not None
    assert {k: st2.step_parts_s[k] for k in busy} == {k: st1.step_parts_s[k] for k in busy}
    assert st2.step_parts_s["empty"] >= st1.step_parts_s["empty"]
    await s.close()


@pytest.mark.policies("discard")  # the paused request's KV goes: vLLM has no request and its loop blocks
async def test_an_idle_engine_is_not_counted_as_a_busy_gap_between_steps(policy_engine: InterceptEngine) -> None:
    """`between` is the gap from one step with tokens to the next while vLLM has requests; a call's wait,
    during which the engine core blocks on its input queue, must not land in it."""
    engine = policy_engine
    s = engine.open_session(max_tokens=8, ignore_eos=True)
    async for _ in s.turn(engine.encode("Count the doors in the hall.")):
        pass
    before = (await engine.stats()).step_parts_s
    await asyncio.sleep(0.5)
    async for _ in s.turn(engine.encode(" And the windows?")):
        pass
    after = (await engine.stats()).step_parts_s
    assert before is not None and after is not None
    assert 0 < after["between"] - before["between"] < 0.25, (before, after)
    await s.close()


@pytest.mark.policies("preserve")  # the trigger is the same under every policy
async def test_a_model_written_observation_ends_the_turn(policy_engine: InterceptEngine) -> None:
    """Only tools write observations: the engine stops the turn at the token that completes a
    model-written "Observation:" (the `observation` trigger), with nothing sampled past it."""
    engine = policy_engine
    s = engine.open_session(max_tokens=40)
    end = None
    async for ev in s.turn(engine.encode("Question: 2+2?\n"), regex=r"Thought: add\nObservation: [a-z]{10}"):
        if isinstance(ev, TurnEnd):
            end = ev
    assert end is not None and end.reason == "tool_call" and end.call is not None
    assert end.call.trigger == "observation" and end.call.tool is None
    assert end.text == "Thought: add\nObservation:"
    assert end.intercept is not None and end.intercept.trigger == "observation"
    await s.close()


@pytest.mark.policies("preserve")
async def test_new_requests_waiting_for_a_slot_are_metered(policy_engine: InterceptEngine) -> None:
    """More new sessions than running slots: those beyond the slots wait, and the admission meter charges
    their wait to the slots (what the benchmark reads to tell why new requests' first tokens come late)."""
    engine = policy_engine
    before = (await engine.stats()).admission  # None until the scheduler has run a step
    waited0, admitted0 = (before.wait_s["slots"], before.admitted) if before else (0.0, 0)
    n = engine.config.max_num_seqs + 2

    async def one(i: int) -> None:
        s = engine.open_session(max_tokens=24, ignore_eos=True)
        try:
            async for _ in s.turn(engine.encode(f"Session {i}: count the doors in the hall.")):
                pass
        finally:
            await s.close()  # a paused session keeps its slot (preserve): closing gives it back

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), timeout=120)
    after = (await engine.stats()).admission
    assert after is not None
    assert after.admitted - admitted0 == n
    assert after.wait_s["slots"] > waited0, (before, after)
    assert set(after.wait_s) == {"slots", "budget", "blocks", "behind_resumed"}
    await wait_all_free(engine)


@pytest.mark.policies("preserve")
async def test_the_profilers_prefill_beside_a_decode_measures_a_step_and_leaves_the_engine_empty(policy_engine: InterceptEngine) -> None:
    # `infercept profile`'s `extra.chunk_step_s`, which the simulator charges per prefilled request: it needs
    # the decoding request's tokens one by one and a prompt arriving while it decodes. Its value is this
    # machine's; what must hold is that it is a measured, finite time and that both sessions are gone.
    import math

    from engine_adapter.profiler import chunk_step_s

    extra = await chunk_step_s(policy_engine, context=64, rounds=2, steps=12)
    assert math.isfinite(extra) and 0.0 <= extra < 1.0
    counts = await wait_all_free(policy_engine)
    assert counts.free == counts.total, counts
