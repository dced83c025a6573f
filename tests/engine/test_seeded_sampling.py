"""Seeded sampling over a prompt longer than the token budget (prefilled in chunks).

On vLLM's CPU backend this killed the engine core: after each partial-prefill step the model runner
rewinds the request's generator by a CUDA-only offset ("CPU Generator does not use offset"). The
`vllm.general_plugins` entry point (engine_adapter/vllm_plugin.py) restores the generator's state
instead. A seeded request must then draw the same tokens whether its prompt was prefilled in chunks
(first request) or in one step (the same prompt again, its full blocks now prefix-cache hits).
"""

from __future__ import annotations

import random

from engine_adapter.engine import InterceptEngine
from tests.conftest import tiny_config
from tests.engine.helpers import run_turn, wait_all_free

BUDGET = 64  # tokens per step: a 300-token prompt takes five steps, four of them discard their sample


async def test_a_seeded_request_survives_chunked_prefill_and_draws_the_same_tokens() -> None:
    engine = InterceptEngine(tiny_config("vllm-apc", max_num_batched_tokens=BUDGET))
    await engine.start()
    try:
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
    finally:
        await engine.shutdown()
