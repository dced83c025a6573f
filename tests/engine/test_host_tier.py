"""vLLM's host KV tier for real (policy `vllm-offload`): a paused request's KV is freed on the device as
under `vllm-apc`, other traffic evicts its blocks from the device's prefix cache, and the resume loads
them back from the host tier, giving the same tokens as an engine without any KV reuse."""

from __future__ import annotations

from engine_adapter.engine import InterceptEngine
from tests.conftest import TINY_KV_BLOCKS, tiny_config
from tests.engine.helpers import fill_kv, run_turn, wait_all_free

PROMPT = (
    "You are an agent in a text world. You can search, open doors and count things. "
    "Think step by step and use one tool per step.\nQuestion: is the kitchen door open?\nThought:"
)
OBSERVATION = "\nObservation: the door is locked.\n"
HOST_BLOCKS = 64
BLOCK_BYTES = 32 * 1024  # tiny model: 1 KiB of KV per token, 32-token blocks


async def test_resume_loads_evicted_blocks_from_the_host_tier(uses_engine: None) -> None:
    engine = InterceptEngine(tiny_config("vllm-offload", swap_space_gib=HOST_BLOCKS * BLOCK_BYTES / 2**30))
    await engine.start()
    try:
        block = (await engine.stats()).block_size
        prompt = engine.encode(PROMPT * 2)
        a = engine.open_session()
        first = await run_turn(a, prompt, max_tokens=12)
        [rec] = await engine.intercepts(a.id)
        assert (rec.action, rec.kv_fate) == ("discard", "discard")  # the request ends at the call: its blocks are freed
        context = len(prompt) + 11  # the last sampled token is re-sent with the next turn
        full_blocks = context // block
        assert full_blocks >= 3

        # Two other sessions that together need every KV block at once: A's freed blocks are reused, so the
        # device's prefix cache no longer has them.
        usable = TINY_KV_BLOCKS - 1
        b, c = await fill_kv(engine, (15 * block - 8, 1000, 500), ((usable - 15) * block - 8, 3000, 700))
        before = (await engine.stats()).host_tier
        assert before is not None and before.host_blocks == HOST_BLOCKS
        assert before.blocks_stored >= full_blocks + 15 + (usable - 15) - 2  # A's, B's and C's full blocks
        assert before.loads == 0

        appended = engine.encode(OBSERVATION)
        resumed = await run_turn(a, appended, max_tokens=10)
        stats = await engine.stats()
        tier = stats.host_tier
        assert tier is not None and tier.loads == 1
        # Every full block of A's context came back from the host (none was left in the device cache).
        assert tier.tokens_loaded == full_blocks * block, (tier, context)
        [rec] = [r for r in await engine.intercepts(a.id) if r.intercept_id == rec.intercept_id]
        assert rec.restored_by == "partial-prefix-cache", rec  # the partly filled last block is recomputed
        assert rec.tokens_recomputed == context - full_blocks * block, rec

        for s in (a, b, c):
            await s.close()
        counts = await wait_all_free(engine)
        assert counts.free == counts.total, counts
        first_ids, resumed_ids = first.token_ids, resumed.token_ids
    finally:
        await engine.shutdown()

    # The reference: an engine without prefix caching or a host tier recomputes the whole context.
    ref = InterceptEngine(tiny_config("discard"))
    await ref.start()
    try:
        s = ref.open_session()
        assert (await run_turn(s, prompt, max_tokens=12)).token_ids == first_ids
        assert (await run_turn(s, appended, max_tokens=10)).token_ids == resumed_ids
        await s.close()
    finally:
        await ref.shutdown()
