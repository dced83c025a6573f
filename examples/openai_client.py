"""The official `openai` package against infercept's /v1/chat/completions: a server-side tool (the
calculator runs inside the request, with an intercept) and a client function (returned as tool_calls,
executed here, and sent back as a tool message).

    .venv/bin/python examples/openai_client.py [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import json

from common import parser
from openai import OpenAI

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "arithmetic"}}


def get_weather(city: str) -> str:
    return f"Sunny and 21 C in {city}."  # the client's own function


def main() -> int:
    args = parser(__doc__ or "").parse_args()
    client = OpenAI(base_url=args.url + "/v1", api_key=args.api_key or "unused")
    model = client.models.list().data[0].id
    print(f"model: {model}")

    print("\n1. server tool (runs inside the request)")
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 29 times 13?"}],
                                       tools=[CALCULATOR], max_tokens=64)  # type: ignore[list-item]
    print(r.choices[0].message.content)
    extra = r.model_extra or {}
    print(f"answer: {extra['infercept']['reply']!r}; intercepts: " + ", ".join(
        f"{i['tool']} {i['type']}:{i['policy']}->{i['restored_by']}" for i in extra["infercept"]["intercepts"]))

    print("\n2. client function (streamed; tool_choice names it)")
    msgs: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER], max_tokens=64,  # type: ignore[arg-type]
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = r.choices[0].message
    print(f"finish_reason={r.choices[0].finish_reason} tool_calls={[(t.function.name, t.function.arguments) for t in msg.tool_calls or []]}")
    msgs.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls or []:
        result = get_weather(**json.loads(call.function.arguments))
        print(f"ran get_weather -> {result!r}")
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": result})
    stream = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER], max_tokens=64, stream=True)  # type: ignore[arg-type]
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
