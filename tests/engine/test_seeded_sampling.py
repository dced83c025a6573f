"""Requests that vLLM itself can fail, on an engine of their own.

Seeded sampling over a prompt longer than the token budget (prefilled in chunks): on vLLM's CPU backend
this killed the engine core (after each partial-prefill step the model runner rewinds the request's
generator by a CUDA-only offset: "CPU Generator does not use offset"). The `vllm.general_plugins` entry
point (engine_adapter/vllm_plugin.py) restores the generator's state instead, so a seeded request draws
the same tokens whether its prompt was prefilled in chunks (first request) or in one step (the same
prompt again, its full blocks now prefix-cache hits).

A turn whose structured-output grammar does not compile (vLLM gives up after
VLLM_REGEX_COMPILATION_TIMEOUT_S; this engine gets 1 s) ends with vLLM's finish reason `error`: the turn
raises `RequestFailed` instead of ending as an empty `stop`, and the session keeps working.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from engine_adapter.engine import InterceptEngine
from engine_adapter.events import RequestFailed
from tests.conftest import tiny_config
from tests.engine.helpers import run_turn, wait_all_free

BUDGET = 64  # tokens per step: a 300-token prompt takes five steps, four of them discard their sample
# Bounded repeats make xgrammar's automaton large: seconds to compile here, far past a 1 s limit.
SLOW_REGEX = r"Thought: [^\n]{1,400}\n(Action: Calculator\[[^\n\]\[]{1,400}\]|Answer: [^\n]{1,400})"


@pytest_asyncio.fixture(scope="module")
async def engine(uses_engine: None) -> AsyncIterator[InterceptEngine]:
    old = os.environ.get("VLLM_REGEX_COMPILATION_TIMEOUT_S")
    os.environ["VLLM_REGEX_COMPILATION_TIMEOUT_S"] = "1"  # read by the engine core, spawned below
    e = InterceptEngine(tiny_config("vllm-apc", max_num_batched_tokens=BUDGET))
    try:
        await e.start()
    finally:
        if old is None:
            os.environ.pop("VLLM_REGEX_COMPILATION_TIMEOUT_S", None)
        else:
            os.environ["VLLM_REGEX_COMPILATION_TIMEOUT_S"] = old
    try:
        yield e
    finally:
        await e.shutdown()


async def test_a_seeded_request_survives_chunked_prefill_and_draws_the_same_tokens(engine: InterceptEngine) -> None:
    rng = random.Random(5)
    prompt = [rng.randrange(1000, 30000) for _ in range(300)]

    async def sample(seed: int) -> list[int]:
        s = engine.open_session(temperature=1.0, seed=seed, ignore_eos=True)
        try:
            return (await run_turn(s, prompt, 16)).token_ids
        finally:
            await s.close()

    chunked = await sample(1234)  # prefilled in chunks of 64
    cached = await sample(1234)  # the same prompt: its full blocks are cache hits, one step
    other = await sample(99)
    greedy_s = engine.open_session(ignore_eos=True)
    greedy = (await run_turn(greedy_s, prompt, 16)).token_ids
    await greedy_s.close()

    assert len(chunked) == 16
    assert chunked == cached, "the seeded stream depends on how the prompt was chunked"
    assert chunked != other and chunked != greedy, "the seed did not reach the sampler"
    counts = await wait_all_free(engine)
    assert counts.free == counts.total


async def test_a_turn_whose_grammar_fails_raises_and_the_session_goes_on(engine: InterceptEngine) -> None:
    s = engine.open_session(max_tokens=8)
    try:
        with pytest.raises(RequestFailed, match="finish reason 'error'"):
            async for _ in s.turn("What is 3 times 4?", regex=SLOW_REGEX):
                pass
        end = await run_turn(s, " Say something.", 8)  # the session still works
        assert end.reason in ("stop", "length") and end.token_ids
    finally:
        await s.close()
    counts = await wait_all_free(engine)
    assert counts.free == counts.total
