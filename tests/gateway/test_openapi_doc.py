"""The OpenAPI document built from the route declarations alone (no engine, no server): the OpenAI
chat-completions stream is documented as what is really sent (data-only messages, the error chunk, the
final `[DONE]`), the session stream as named events."""

from __future__ import annotations

from gateway.api import openapi
from gateway.routes_admin import api as admin_api
from gateway.routes_openai import api as openai_api
from gateway.routes_sessions import api as session_api
from gateway.schemas import EVENTS

REF = "#/components/schemas/"


def json_of(ref: str) -> dict[str, object]:
    return {"type": "string", "contentMediaType": "application/json", "contentSchema": {"$ref": ref}}


def test_the_chat_completions_stream_is_documented_as_sent() -> None:
    doc = openapi([session_api, openai_api, admin_api], title="t", version="0", api_key=True)
    schema = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    items = {item["title"]: item for item in schema["oneOf"]}
    assert list(items) == ["chunk", "error", "done"]
    for item in items.values():
        assert item["required"] == ["data"] and "event" not in item["properties"]  # no `event:` line is sent
    # Each `data:` line is a JSON text whose content is the model (what an SSE validator checks).
    assert items["chunk"]["properties"]["data"] == json_of(REF + "ChatCompletionChunk")
    assert items["error"]["properties"]["data"] == json_of(REF + "ErrorBody")
    assert items["done"]["properties"]["data"] == {"const": "[DONE]"}
    assert "[DONE]" in schema["description"] and "without event names" in schema["description"]

    msg = doc["paths"]["/v1/sessions/{sid}/messages"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert [e["properties"]["event"]["const"] for e in msg["oneOf"]] == list(EVENTS)
    assert all(e["required"] == ["event", "data"] for e in msg["oneOf"])
    assert {e["properties"]["data"]["contentSchema"]["$ref"] for e in msg["oneOf"]} == {REF + m.__name__ for m in EVENTS.values()}
