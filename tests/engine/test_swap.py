"""Swap for real: a paused request's KV goes to the host buffer, its device blocks are reused by
other requests, and the swap-in restores it exactly (swap and infercept policies)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine_adapter.engine import RESERVED_CPU_ENV, InterceptEngine, reserved_cpu_cores
from gateway.metrics import GatewayMetrics
from tests.conftest import TINY_KV_BLOCKS, tiny_config
from tests.engine.helpers import fill_kv, fresh_output, run_turn, wait_all_free

PROMPT = (
    "You are an agent in a text world. You can search, open doors and count things. "
    "Think step by step and use one tool per step.\nQuestion: is the kitchen door open?\nThought:"
)


@pytest.mark.policies("swap", "infercept", "infercept-prefetch", "infercept-apc")  # the policies that swap at a pause
async def test_swapped_kv_survives_block_reuse(policy_engine: InterceptEngine) -> None:
    engine = policy_engine
    prompt = engine.encode(PROMPT)
    a = engine.open_session()
    first = await run_turn(a, prompt, max_tokens=12)

    # Two other sessions that together need every KV block at once: A's old blocks must be reused.
    block = (await engine.stats()).block_size
    usable = TINY_KV_BLOCKS - 1
    b, c = await fill_kv(engine, (15 * block - 8, 1000, 500), ((usable - 15) * block - 8, 3000, 700))
    [rec] = await engine.intercepts(a.id)
    assert rec.kv_fate == "swap", rec
    counts = await engine.check_integrity()  # also: host buffer contents == what the scheduler expects
    assert counts.host_tokens >= len(prompt) + 11

    appended = engine.encode("\nObservation: the door is locked.\n")
    resumed = await run_turn(a, appended, max_tokens=10)
    assert resumed.token_ids == await fresh_output(engine, prompt + first.token_ids + appended, 10)

    [rec] = [r for r in await engine.intercepts(a.id) if r.intercept_id == rec.intercept_id]
    context = len(prompt) + 11
    assert context % block, "the context must end in a partial block: it travels too"
    assert rec.restored_by == "swap"
    assert rec.tokens_swapped_in == context and rec.tokens_recomputed == 0

    stats = await engine.stats()
    assert stats.swap.tokens_in >= rec.tokens_swapped_in
    # The gateway's gauge counts the bytes really copied: whole blocks, the partly filled one too.
    metrics = GatewayMetrics()
    metrics.refresh(stats, [])
    moved_in = stats.swap.blocks_in * block * stats.swap.kv_bytes_per_token
    assert moved_in > stats.swap.tokens_in * stats.swap.kv_bytes_per_token
    assert metrics.registry.get_sample_value("infercept_swap_bytes", {"direction": "in"}) == moved_in
    # Per iteration, what moved stayed within that iteration's budget (block granularity: a budget
    # under one block still moves one block, so copies always finish).
    budgets, moved = stats.swap.recent_budgets, stats.swap.moved
    assert len(budgets) == len(moved) > 0
    for bud, mv in zip(budgets, moved):
        assert mv["out"] <= max(bud["out"], block) and mv["in"] <= max(bud["in"], block)
        assert mv["out"] + mv["in"] <= max(bud["limit"], 2 * block)
    for s in (a, b, c):
        await s.close()
    counts = await wait_all_free(engine)
    assert counts.free == counts.total and counts.host_tokens == 0, counts


@pytest.mark.policies("infercept-apc")
async def test_a_resume_takes_the_blocks_still_cached_and_loads_only_the_rest(policy_engine: InterceptEngine) -> None:
    """With vLLM's prefix cache on, a swapped context's freed blocks keep their hashes. Two other sessions
    then take every block but A's first ones (vLLM reuses a freed partial block first and cached blocks
    last, a request's tail before its head), and the resume hits those on the device and loads the other
    blocks from the host, continuing exactly as a fresh request over the same tokens did before any of it."""
    engine = policy_engine
    prompt = engine.encode(PROMPT * 3)
    a = engine.open_session()
    first = await run_turn(a, prompt, max_tokens=12)
    block = (await engine.stats()).block_size
    context = len(prompt) + 11
    a_blocks = -(-context // block)
    assert a_blocks >= 4 and context % block, "the context must span hits and a load, and end mid-block"
    appended = engine.encode("\nObservation: the door is locked.\n")
    # The reference now, while A's blocks hold what A computed: afterwards it would read what the load
    # wrote (its blocks would be cached hits), and check nothing.
    expected = await fresh_output(engine, prompt + first.token_ids + appended, 10)

    # B runs beside A, then C needs every block but A's first a_blocks - 2: A is swapped out under the
    # pressure (not dropped: B is running), its blocks freed into the prefix cache, and C takes the
    # others and A's partial last block and the full one before it.
    usable = TINY_KV_BLOCKS - 1
    # tokens no other test uses: a block cached by another test would be a hit, not a block taken
    b, c = await fill_kv(engine, (15 * block - 8, 2100, 450), ((usable - 15 - a_blocks + 2) * block - 8, 2600, 400))
    [rec] = await engine.intercepts(a.id)
    assert rec.kv_fate == "swap", rec
    await b.close()
    await c.close()

    blocks_in = (await engine.stats()).swap.blocks_in
    resumed = await run_turn(a, appended, max_tokens=10)
    assert resumed.token_ids == expected
    [rec] = [r for r in await engine.intercepts(a.id) if r.intercept_id == rec.intercept_id]
    assert rec.restored_by == "swap" and rec.tokens_recomputed == 0
    assert rec.tokens_prefix_hit == (a_blocks - 2) * block  # the blocks C did not take
    assert rec.tokens_swapped_in == context - rec.tokens_prefix_hit
    assert (await engine.stats()).swap.blocks_in == blocks_in + 2  # only those were copied
    await a.close()
    counts = await wait_all_free(engine)
    assert counts.free == counts.total and counts.host_tokens == 0, counts


@pytest.mark.policies("swap", "preserve")
async def test_a_kv_connector_leaves_the_engine_core_its_core(policy_engine: InterceptEngine) -> None:
    """vLLM's CPU backend binds the worker's OpenMP threads to all cores but those it reserves for the engine
    core; with a KV connector it reserves one more per rank, and on 2 cores then none, so that the worker's
    second OpenMP thread spins on the engine core's core (`cpu_cores_reserved_as_without_connector`). With or
    without the swap connector, the worker's threads leave the same cores free."""
    import psutil

    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2 or os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" \
            or RESERVED_CPU_ENV in os.environ:
        pytest.skip("needs 2 or more cores and vLLM's automatic thread binding")
    # Every engine worker of this process (this engine's, and any other a test left running: all must hold).
    workers = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::Worker")]
    assert workers
    for w in workers:
        used: set[int] = set()
        for t in w.threads():
            used |= os.sched_getaffinity(t.id)
        assert len(allowed - used) == reserved_cpu_cores(1), (w.pid, sorted(allowed), sorted(used))


async def test_full_swap_space_falls_back_to_discard(uses_engine: None) -> None:
    # Room for exactly two blocks on the host (block_size 32, 1 KiB of KV per token, tiny model).
    two_blocks_gib = 2 * 32 * 1024 / 2**30
    engine = InterceptEngine(tiny_config("swap", swap_space_gib=two_blocks_gib))
    await engine.start()
    try:
        prompt = engine.encode(PROMPT)
        sessions = [engine.open_session() for _ in range(3)]
        firsts = [await run_turn(s, prompt, max_tokens=12) for s in sessions]
        assert 32 < len(prompt) + 11 < 64  # two blocks per context, the second partly filled
        stats = await engine.stats()
        assert stats.swap.host_slots == 2
        fates = [r.kv_fate for s in sessions for r in await engine.intercepts(s.id)]
        # The first pause takes the whole host buffer (its copy starts with the next step, so it may
        # still be on its way); the later ones fall back to discard.
        assert fates[1:] == ["discard", "discard"], fates
        assert stats.swap.fallbacks == 2
        appended = engine.encode("\nObservation: ok.\n")
        for s, f in zip(sessions, firsts):
            resumed = await run_turn(s, appended, max_tokens=6)
            assert resumed.token_ids == await fresh_output(engine, prompt + f.token_ids + appended, 6)
            await s.close()
        counts = await wait_all_free(engine)
        assert counts.free == counts.total and counts.host_tokens == 0
    finally:
        await engine.shutdown()


async def test_swap_in_spans_steps_under_a_small_budget(tmp_path: Path, uses_engine: None) -> None:
    # A profile whose swap link needs 40 ms per 32-token block against 10 ms iterations: N_i is a
    # fraction of a block (even if the engine's online refinement stretches T_fwd a few times), so
    # every step moves the one-block minimum and a context comes back over several steps.
    import json

    block_bytes = 32 * 1024
    (tmp_path / "p.json").write_text(json.dumps({
        "model": "tiny", "device": "cpu", "fwd_tokens": [1, 4096], "fwd_seconds": [0.01, 0.01],
        "saturation_tokens": 256, "kv_bytes_per_token": 1024,
        "swap_out_bytes_per_s": block_bytes / 0.04, "swap_in_bytes_per_s": block_bytes / 0.04,
    }))
    engine = InterceptEngine(tiny_config("swap", profile=str(tmp_path / "p.json")))
    await engine.start()
    try:
        prompt = engine.encode(PROMPT * 3)  # several full blocks
        a = engine.open_session()
        first = await run_turn(a, prompt, max_tokens=12)
        other = engine.open_session()
        await run_turn(other, engine.encode(PROMPT), max_tokens=40)  # steps, so A's copy-out runs
        [rec] = await engine.intercepts(a.id)
        assert rec.kv_fate == "swap"
        appended = engine.encode("\nObservation: the door is locked.\n")
        resumed = await run_turn(a, appended, max_tokens=8)
        assert resumed.token_ids == await fresh_output(engine, prompt + first.token_ids + appended, 8)
        stats = await engine.stats()
        steps = [(b, m) for b, m in zip(stats.swap.recent_budgets, stats.swap.moved) if m["in"]]
        blocks = -(-(len(prompt) + 11) // 32)
        assert blocks >= 3 and sum(m["in"] for _, m in steps) == 32 * blocks  # every block once
        assert len(steps) >= 2  # over several steps
        assert all(m["in"] <= max(b["in"], 32) for b, m in steps)  # each within its step's budget
        assert all(m["out"] <= max(b["out"], 32) for b, m in zip(stats.swap.recent_budgets, stats.swap.moved))
        for s in (a, other):
            await s.close()
        counts = await wait_all_free(engine)
        assert counts.free == counts.total and counts.host_tokens == 0
    finally:
        await engine.shutdown()
