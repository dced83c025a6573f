"""The OpenAI-compatible routes, driven by the official `openai` package against the real server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from openai import AsyncOpenAI, AuthenticationError, BadRequestError, NotFoundError

from tests.gateway.conftest import API_KEY, Served

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALC = {"type": "function", "function": {"name": "calculator", "description": "arithmetic"}}


@pytest.fixture
async def oai(served: Served) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=served.url + "/v1", api_key=API_KEY, max_retries=0) as client:
        yield client


async def no_sessions_left(served: Served) -> bool:
    for _ in range(100):
        if not any(sid.startswith("chatcmpl") for sid in served.gw.sessions):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_models_and_plain_completion(served: Served, oai: AsyncOpenAI) -> None:
    models = await oai.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    r = await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
    assert r.object == "chat.completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    assert await no_sessions_left(served)


async def test_client_function_is_returned_as_tool_calls_and_resumed(served: Served, oai: AsyncOpenAI) -> None:
    msgs: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = await oai.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER], max_tokens=48,  # type: ignore[list-item]
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert list(args) == ["city"]  # the single parameter gets the argument text
    intercepts = r.model_extra["infercept"]["intercepts"]  # type: ignore[index]
    assert intercepts[0]["tool"] == "get_weather" and intercepts[0]["policy"] == "preserve"
    msgs.append(choice.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"})
    r2 = await oai.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER], max_tokens=8)  # type: ignore[arg-type]
    assert r2.choices[0].finish_reason in ("stop", "length")
    assert await no_sessions_left(served)
    counts = await served.gw.engine.check_integrity()
    assert counts.free == counts.total  # request-scoped sessions free their KV


async def test_server_tool_runs_inside_the_request_streaming(served: Served, oai: AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2+2?"}], tools=[CALC],  # type: ignore[list-item]
                                               tool_choice="required", max_tokens=48, stream=True)
    text, reasons = [], []
    async for chunk in stream:
        if chunk.choices:
            if chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
            if chunk.choices[0].finish_reason:
                reasons.append(chunk.choices[0].finish_reason)
    full = "".join(text)
    assert "Action: Calculator[" in full and "\nObservation: " in full
    assert reasons == [reasons[0]] and reasons[0] in ("stop", "length")
    assert await no_sessions_left(served)


async def test_openai_errors(served: Served, oai: AsyncOpenAI) -> None:
    with pytest.raises(NotFoundError):
        await oai.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(BadRequestError):
        await oai.chat.completions.create(model="tiny", messages=[])
    with pytest.raises(BadRequestError):
        await oai.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])  # type: ignore[list-item]
    with pytest.raises(BadRequestError):
        await oai.chat.completions.create(model="tiny", messages=[{"role": "tool", "content": "x", "tool_call_id": "a"}])
    with pytest.raises(BadRequestError):
        await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(AuthenticationError):
        await AsyncOpenAI(base_url=served.url + "/v1", api_key="wrong", max_retries=0).models.list()
    async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {API_KEY}"}) as raw:
        r = await raw.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "seven " * 3000}]})
        assert r.status_code == 413 and r.json()["error"]["type"] == "context_too_long"
    assert await no_sessions_left(served)


async def test_the_raw_stream_is_what_openapi_documents(served: Served) -> None:
    """Data-only messages (no `event:` line): chunks, then `[DONE]`; comments (`: ping`) aside."""
    from gateway.schemas_openai import ChatCompletionChunk

    async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as raw:
        doc = (await raw.get("/openapi.json")).json()
        schema = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
        assert [item["title"] for item in schema["oneOf"]] == ["chunk", "error", "done"]
        body = {"messages": [{"role": "user", "content": "2+2?"}], "tools": [CALC], "tool_choice": "required",
                "max_tokens": 48, "stream": True}
        async with raw.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines()]
    assert not any(line.startswith("event:") for line in lines)
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    for d in data[:-1]:
        ChatCompletionChunk.model_validate_json(d)
    assert {line for line in lines if line and not line.startswith("data: ")} <= {": ping"}
    assert await no_sessions_left(served)
