"""End to end on the offline default model (SmolLM2-135M-Instruct): a real question, a real tool call
written by the model, the real calculator, the engine's intercept, and the model reading the result."""

from __future__ import annotations

from openai import AsyncOpenAI

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
