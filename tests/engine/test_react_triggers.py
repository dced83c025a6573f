"""The offline default model (SmolLM2-135M-Instruct) on a few-shot ReAct prompt: the engine ends the
turn exactly at the completed `Action: Tool[args]` (a multi-token trigger, detected in the engine core),
tags the intercept with the tool's augmentation type, and the resume continues exactly as an
uninterrupted request over the same context would."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from augmentations.base import CallContext
from augmentations.calculator import Calculator
from augmentations.registry import Registry
from engine_adapter.config import EngineConfig
from engine_adapter.engine import InterceptEngine
from engine_adapter.events import TokenDelta, TurnEnd

FEW_SHOT = """Answer the question. Use the calculator for arithmetic.

Question: What is 12 times 7?
Thought: I need to multiply 12 by 7.
Action: Calculator[12*7]
Observation: 84
Answer: 84

Question: A box holds 15 apples. How many apples are in 4 boxes?
Thought: I need to multiply 15 by 4.
Action: Calculator[15*4]
Observation: 60
Answer: 60

Question: Tom has 120 dollars and spends 45. How much is left?
Thought: I need to subtract 45 from 120.
Action: Calculator[120-45]
Observation: 75
Answer: 75

Question: {question}
Thought:"""


@pytest_asyncio.fixture(scope="module")
async def smol(uses_default_model: None) -> AsyncIterator[InterceptEngine]:
    engine = InterceptEngine(EngineConfig(model="default", dtype="float32", policy="preserve", max_model_len=1024, max_num_seqs=4))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


async def test_react_call_pauses_at_the_trigger_and_resumes_exactly(smol: InterceptEngine) -> None:
    engine = smol
    tools = Registry([Calculator()])
    s = engine.open_session(max_tokens=48, tools=tools.hints())
    prompt = engine.encode(FEW_SHOT.format(question="What is 29 times 13?"))
    end = None
    streamed = []
    async for ev in s.turn(prompt):
        if isinstance(ev, TurnEnd):
            end = ev
        elif isinstance(ev, TokenDelta):
            streamed.append(ev.text)
    assert end is not None and end.reason == "tool_call"
    assert end.call is not None and end.call.tool == "Calculator" and end.call.trigger == "react"
    # Nothing was sampled past the "]" that completed the call, and the stream carried all of it.
    assert end.text.endswith(end.call.text) and end.text.endswith("]")
    assert "".join(streamed) == end.text
    assert engine.decode(end.token_ids) == end.text

    [rec] = await engine.intercepts(s.id)
    assert (rec.trigger, rec.tool, rec.aug_type) == ("react", "Calculator", "math")
    assert rec.expected_duration_s == tools.hints()["Calculator"].expected_s  # Table 1's math mean
    assert rec.context_tokens == len(prompt) + len(end.token_ids) - 1

    # The real calculator runs on the arguments the model wrote.
    result = await tools.get(end.call.tool).run(end.call.arguments, CallContext(session_id=s.id))
    assert (end.call.arguments, result.content, result.error) == ("29*13", "377", False)
    observation = engine.encode(f"\nObservation: {result.content}\n")
    resumed = None
    async for ev in s.turn(observation, max_tokens=16):
        if isinstance(ev, TurnEnd):
            resumed = ev
    assert resumed is not None
    assert resumed.text.startswith("Answer: 377")  # the model reads the observation

    fresh = engine.open_session(max_tokens=16)
    ref = None
    async for ev in fresh.turn(prompt + end.token_ids + observation):
        if isinstance(ev, TurnEnd):
            ref = ev
    assert ref is not None and ref.token_ids == resumed.token_ids
    await s.close()
    await fresh.close()


async def test_json_tool_call_trigger(smol: InterceptEngine) -> None:
    engine = smol
    prompt = (
        'Call tools as <tool_call>{"name": ..., "arguments": ...}</tool_call>.\n'
        'User: say hello out loud\nAssistant: <tool_call>{"name": "tts", "arguments": {"text": "hello"}}</tool_call>\n'
        'User: say good night out loud\nAssistant: <tool_call>{"name": "tts", "arguments": {"text": "good night"}}</tool_call>\n'
        "User: say thank you out loud\nAssistant:"
    )
    s = engine.open_session(max_tokens=40)
    end = None
    async for ev in s.turn(prompt):
        if isinstance(ev, TurnEnd):
            end = ev
    assert end is not None and end.reason == "tool_call", end
    assert end.call is not None and end.call.trigger == "tool_call"
    assert end.text.endswith("</tool_call>")
    assert '"name": "tts"' in end.call.arguments
    await s.close()
    counts = await engine.check_integrity()
    assert counts.free == counts.total
