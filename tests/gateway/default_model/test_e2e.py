"""End to end on the offline default model (SmolLM2-135M-Instruct): a real question, a real tool call
written by the model, the real calculator, the engine's intercept, and the model reading the result."""

from __future__ import annotations

from openai import AsyncOpenAI

from augmentations.calculator import Calculator
from augmentations.registry import Registry
from gateway.calls import run_server_tool

from gateway.client import AsyncClient, Event


async def test_calculator_question_streams_call_intercept_result_resume_done(default_url: str) -> None:
    async with AsyncClient(default_url) as c:
        s = await c.create_session(tools=["calculator"])
        events: list[Event] = [ev async for ev in c.stream_message(s, "What is 29 times 13?")]
        order = [ev.name for ev in events if ev.name != "token"]
        assert order == ["tool_call", "intercept", "tool_result", "resume", "done"], order
        by = {ev.name: ev.data for ev in events}
        assert (by["tool_call"]["tool"], by["tool_call"]["arguments"]) == ("Calculator", "29*13")
        assert by["intercept"]["type"] == "math" and by["intercept"]["engine_policy"] == "infercept"
        assert by["intercept"]["policy"] == "preserve"  # a sub-millisecond call: keeping the KV wastes least
        assert by["tool_result"]["content"] == "377" and not by["tool_result"]["error"]
        assert by["resume"]["restored_by"] == "preserve" and by["resume"]["tokens_recomputed"] == 0
        assert by["done"]["reply"] == "377"
        assert events[0].name == "token"  # tokens stream before the call
        info = await c.get_session(s)
        [rec] = [i for i in info["intercepts"] if i["tool"] == "Calculator"]
        assert rec["tokens_preserved"] == rec["context_tokens"] and rec["tokens_recomputed"] == 0
        await c.close_session(s)


async def test_official_openai_client_with_a_server_tool(default_url: str) -> None:
    async with AsyncOpenAI(base_url=default_url + "/v1", api_key="unused", max_retries=0) as oai:
        r = await oai.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "What is 29 times 13?"}], max_tokens=64,
            tools=[{"type": "function", "function": {"name": "calculator", "description": "arithmetic"}}],
        )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert "Action: Calculator[29*13]\nObservation: 377\n" in (msg.content or "")
    assert r.model_extra["infercept"]["reply"] == "377"  # type: ignore[index]
    assert r.model_extra["infercept"]["intercepts"][0]["type"] == "math"  # type: ignore[index]


async def test_the_model_never_supplies_its_own_observation(default_url: str) -> None:
    """A question this model answers by writing "Observation: 23 boxes * 19 pens = 429 pens" itself when
    nothing stops it (it is 437). Whatever it writes now, a model-written "Observation:" ends its turn
    at once (nothing more of it is generated), and the gateway re-prompts or answers with what came
    before; only the calculator's results follow an "Observation:" as observations."""
    async with AsyncClient(default_url) as c:
        s = await c.create_session(tools=["calculator"])
        events = [ev async for ev in c.stream_message(s, "A shop sells 23 boxes of 19 pens. How many pens?")]
        model, after_model = "", []
        for ev in events:
            if ev.name == "token":
                model += ev["text"]
            else:
                if model.rstrip().endswith("Observation:"):
                    after_model.append(ev.name)  # what followed a model-written "Observation:"
                model = ""
        assert events[-1].name == "done"
        assert all(name in ("reprompt", "done") for name in after_model), after_model
        assert events[-1]["reprompts"] == sum(1 for ev in events if ev.name == "reprompt")
        calls = {ev["call_id"]: ev["arguments"] for ev in events if ev.name == "tool_call"}
        for ev in events:
            if ev.name == "tool_result":  # observations are the calculator's own results for the call
                expected = await run_server_tool(Registry([Calculator()]), "Calculator", calls[ev["call_id"]], "t", 5.0)
                assert ev["content"] == expected.content
        await c.close_session(s)
