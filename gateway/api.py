"""Routes declared with their contract, and the OpenAPI 3.1 document built from those declarations.

    api = Api("sessions")
    @api.route("POST", "/v1/sessions", "Open a session", body=CreateSession, ok={201: SessionCreated},
               errors=(400, 429, 503))
    async def create_session(request): ...

Each declaration adds the handler to the module's aiohttp route table and its contract to the
document (`openapi`): request body and response schemas from the pydantic models, the session-token
header, the error statuses the route can answer (each a `{"error": {...}}` body; 429/503 with
`Retry-After`), and for streaming routes the Server-Sent Events each event name carries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.schemas import ErrorBody

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REF = "#/components/schemas/{model}"
ERRORS = {
    400: "The body is not valid JSON, or a field is missing, of the wrong type or out of range (the message names it)",
    401: "Missing or wrong `Authorization: Bearer <key>` (when the server has an API key)",
    403: "Missing or wrong X-Session-Token for this session",
    404: "No such session, call, artifact or model",
    409: "The session is busy, or waits for something else",
    410: "The session was closed while the request ran",
    413: "The body, the message or the resulting context is too long",
    429: "The server holds `server.max_sessions` sessions in memory, none of them idle",
    500: "A server fault (never expected: reported as a bug)",
    503: "Not ready (engine starting or restarting), draining for shutdown, or over `server.max_queued_turns`",
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    tag: str
    body: type[BaseModel] | None = None
    ok: Mapping[int, type[BaseModel] | str | None] = field(default_factory=dict)  # a model, a media type, or no body
    errors: tuple[int, ...] = ()
    session: bool = False  # needs X-Session-Token
    # SSE messages of a streamed 200: name -> the model of its data, or a constant data string
    events: Mapping[str, type[BaseModel] | str] | None = None
    description: str = ""
    # OpenAPI links from the success response: name -> (method, path, {parameter: runtime expression})
    links: Mapping[str, tuple[str, str, Mapping[str, str]]] = field(default_factory=dict)
    named_events: bool = True  # each SSE message has an `event:` line (False: `data:` only, as OpenAI's streams)


class Api:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.routes = web.RouteTableDef()
        self.operations: list[Operation] = []

    def route(self, method: str, path: str, summary: str, *, body: type[BaseModel] | None = None,
              ok: Mapping[int, type[BaseModel] | str | None], errors: Iterable[int] = (), session: bool = False,
              events: Mapping[str, type[BaseModel] | str] | None = None, description: str = "",
              links: Mapping[str, tuple[str, str, Mapping[str, str]]] | None = None,
              named_events: bool = True) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes.route(method, path)(handler)
            self.operations.append(Operation(method, path, summary, self.tag, body, dict(ok), tuple(sorted(set(errors))),
                                             session, events, description or (handler.__doc__ or "").strip(), dict(links or {}),
                                             named_events))
            return handler

        return register


def _models(ops: list[Operation]) -> list[type[BaseModel]]:
    seen: dict[type[BaseModel], None] = {ErrorBody: None}
    for op in ops:
        for m in [op.body, *op.ok.values(), *(op.events or {}).values()]:
            if isinstance(m, type) and issubclass(m, BaseModel):
                seen[m] = None
    return list(seen)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _events_schema(events: Mapping[str, type[BaseModel] | str], named: bool = True) -> dict[str, Any]:
    def data(model: type[BaseModel] | str) -> dict[str, Any]:
        # A `data:` line is text: a constant, or JSON whose content the model describes (JSON Schema's
        # contentMediaType/contentSchema, which SSE validators such as schemathesis' check).
        if isinstance(model, str):
            return {"const": model}
        return {"type": "string", "contentMediaType": "application/json", "contentSchema": _ref(model)}

    if not named:
        return {
            "description": "Server-Sent Events without event names: each message is a single `data: <JSON>` line (no "
                           "`event:` line), and the stream always ends with the message `data: [DONE]`. Comment lines "
                           "(`: ping`) keep a quiet stream open. Each item below is one message as {data}, titled by "
                           "what it is.",
            "oneOf": [{"type": "object", "title": name, "required": ["data"], "properties": {"data": data(model)}}
                      for name, model in events.items()],
        }
    return {
        "description": "Server-Sent Events: each message is `event: <name>` and `data: <JSON>`; the stream ends after "
                       "`done` or `error`. Comment lines (`: ping`) keep a quiet stream open. Each item below is one "
                       "message as {event, data}.",
        "oneOf": [{"type": "object", "title": name, "required": ["event", "data"],
                   "properties": {"event": {"const": name}, "data": data(model)}} for name, model in events.items()],
    }


def operation_id(method: str, path: str) -> str:
    return f"{method.lower()}_{path.strip('/').replace('/', '_').replace('{', '').replace('}', '')}"


def _operation(op: Operation, api_key: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"summary": op.summary, "tags": [op.tag], "operationId": operation_id(op.method, op.path)}
    if op.description:
        out["description"] = op.description
    params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
              for p in _path_params(op.path)]
    if op.session:
        params.append({"name": "X-Session-Token", "in": "header", "required": True, "schema": {"type": "string"},
                       "description": "the token returned when the session was created"})
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(op.body)}}}
    responses: dict[str, Any] = {}
    for status, model in op.ok.items():
        resp: dict[str, Any] = {"description": "OK" if status != 201 else "Created"}
        if isinstance(model, type):
            resp["content"] = {"application/json": {"schema": _ref(model)}}
        elif isinstance(model, str):
            resp["content"] = {model: {"schema": {"type": "string"} if model.startswith("text/") else
                                       {"type": "string", "contentMediaType": model}}}
        if op.events and status == 200:
            resp["content"]["text/event-stream"] = {"schema": _events_schema(op.events, op.named_events)}
        if op.links and status < 300:
            resp["links"] = {name: {"operationId": operation_id(method, path), "parameters": dict(params)}
                             for name, (method, path, params) in op.links.items()}
        responses[str(status)] = resp
    errors = set(op.errors)
    if api_key and op.path.startswith("/v1/") and not op.path.startswith("/v1/artifacts/"):
        errors.add(401)
        out["security"] = [{"bearer": []}]
    for status in sorted(errors):
        resp = {"description": ERRORS[status], "content": {"application/json": {"schema": _ref(ErrorBody)}}}
        if status in (429, 503):
            resp["headers"] = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
        responses[str(status)] = resp
    out["responses"] = responses
    return out


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


def openapi(apis: Iterable[Api], *, title: str, version: str, api_key: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every declared route."""
    ops = [op for api in apis for op in api.operations]
    _, defs = models_json_schema([(m, "validation") for m in _models(ops)], ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, api_key)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "Agent sessions with tool calls and intercepts over REST and SSE, and OpenAI-compatible routes."},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return doc


def set_integer_maximum(schema: dict[str, Any], maximum: int) -> None:
    """Give the integer branch of a (possibly nullable) property schema a maximum."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "integer":
            branch["maximum"] = maximum


def set_string_enum(schema: dict[str, Any], values: list[str]) -> None:
    """Restrict the string items of a (possibly nullable) list property schema to `values`."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "array":
            branch["items"] = {"type": "string", "enum": values}


__all__ = ["Api", "Operation", "openapi", "operation_id", "set_integer_maximum", "set_string_enum"]
