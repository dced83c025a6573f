"""Request bodies checked against their pydantic models, and the models' errors as the API's 400s.

`parse(request, Model)` reads the JSON body (400 `invalid_json` if it is not JSON, 400
`invalid_request` if it is not an object) and validates it in strict mode (no coercion: `"yes"` is not a
boolean, `true` not an integer). Every problem is named by its field path as a client would write it
(`messages[0].content`) with why; the first few go into the message, all of them into `errors`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from gateway.http import ApiError, read_json

M = TypeVar("M", bound=BaseModel)

# pydantic's wording where a shorter one says the same.
_WORDING = {
    "missing": "is required",
    "extra_forbidden": "is not a field of this request",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "list_type": "must be a list",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
}


def field_path(loc: Sequence[int | str], body: Any) -> str:
    """A pydantic error location as a client writes it, without pydantic's union member tags (a tag is
    a location step that is not a key of the input at that point)."""
    out, node = "", body
    for step in loc:
        if isinstance(step, int):
            out += f"[{step}]"
            node = node[step] if isinstance(node, list) and step < len(node) else None
        elif isinstance(node, dict) and step in node:
            out += ("." if out else "") + step
            node = node[step]
        elif isinstance(node, dict) and not _is_member(step, node):
            out += ("." if out else "") + step  # a key the input lacks
            node = None
        # else: a union member or tag (pydantic's own steps), not part of the client's path
    return out or "body"


_PRIMITIVES = {"str", "int", "float", "bool", "none", "bytes"}


def _is_member(step: str, node: dict[str, Any]) -> bool:
    tags = {v for k, v in node.items() if k in ("role", "type") and isinstance(v, str)}
    return "[" in step or step[:1].isupper() or step in _PRIMITIVES or step in tags


def errors_of(e: ValidationError, body: Any) -> list[dict[str, str]]:
    out = []
    for err in e.errors(include_url=False):
        msg = _WORDING.get(err["type"], err["msg"])
        if err["type"] == "value_error" and msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        path = field_path(err["loc"], body)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # name the discriminator field itself
            tag = str(err.get("ctx", {}).get("discriminator", "")).strip("'")
            path = f"{path}.{tag}" if path != "body" else tag
            if err["type"] == "union_tag_not_found":
                msg = "is required"
            else:
                msg = f"must be one of {err['ctx']['expected_tags']} (got {err['ctx']['tag']!r})"
        same = next((o for o in out if o["field"] == path), None)
        if same is None:
            out.append({"field": path, "message": msg})
        elif msg not in same["message"]:  # one field, several union members: "must be a string or must be a list"
            same["message"] += f" or {msg}"
    return out


def invalid(problems: list[dict[str, str]]) -> ApiError:
    text = "; ".join(f"'{p['field']}' {p['message']}" if p["field"] != "body" else p["message"] for p in problems[:3])
    if len(problems) > 3:
        text += f" (and {len(problems) - 3} more)"
    return ApiError(400, "invalid_request", text, errors=problems)


def validate(model: type[M], body: Any) -> M:
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as e:
        raise invalid(errors_of(e, body)) from None


async def parse(request: web.Request, model: type[M]) -> M:
    body = await read_json(request)
    return validate(model, body)


__all__ = ["errors_of", "field_path", "invalid", "parse", "validate"]
