"""The session API's bodies as pydantic models: requests (validated, strict), responses and the SSE
events. The handlers build every response and event from these models and send their dump, so
`/openapi.json` documents what is sent (a field a model does not name cannot be sent). The tool-call and
intercept records are `gateway.records`; the OpenAI routes' models are in `gateway.schemas_openai`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from engine_adapter.intercept.records import InterceptRecord
from gateway.records import CallRecord, Intercept, Record


def one_message(message: str) -> Callable[[Any, ValidatorFunctionWrapHandler], Any]:
    """A wrap validator that reports any failure of a union field as one precise message (instead of
    one error per union member)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("value_error", message) from None

    return check


TOOL_NAME = r"^[A-Za-z][A-Za-z0-9_-]*$"


class Body(BaseModel):
    """A request body: unknown fields are errors (a typo is reported, not ignored)."""

    model_config = ConfigDict(extra="forbid")


class Out(Record):
    """A response body or an event's data: built by the handlers from this model and dumped
    (`model_dump(mode="json")`), so the schema in `/openapi.json` is what is sent. Unknown fields are
    errors, on the server's side too: a handler cannot send a field the document does not name."""


class Sparse(Out):
    """An `Out` whose optional fields are sent only when they were given (a transcript entry has the
    keys of its kind of entry; an event has its extras only when they apply)."""

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if k in self.model_fields_set}


# ---------------------------------------------------------------------- requests
class ClientTool(Body):
    name: str = Field(pattern=TOOL_NAME, max_length=64, description="letters, digits, '_' and '-', starting with a letter")
    description: str | None = Field(None, max_length=2000)
    type: str | None = Field(None, max_length=32, description="augmentation type (math, qa, ve, chat, image, tts, ...)")
    expected_s: float | None = Field(None, ge=0, le=1e6, description="expected call duration, seconds (the intercept policy uses it)")


class NamedTool(Body):
    name: str


class FunctionName(Body):
    name: str


class FunctionChoice(Body):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Annotated[
    Literal["auto", "required", "none"] | NamedTool | FunctionChoice,
    WrapValidator(one_message('must be "auto", "required", "none", {"name": TOOL} or {"type": "function", "function": {"name": TOOL}}')),
]


def _item_kind(value: Any) -> str:
    return "Name" if isinstance(value, str) else "Object"


# A name, or an object: only the matching form reports errors (the tags are capitalized so that error
# paths leave them out, see gateway.validation.field_path).
ClientToolItem = Annotated[
    Annotated[Annotated[str, Field(pattern=TOOL_NAME, max_length=64)], Tag("Name")] | Annotated[ClientTool, Tag("Object")],
    Discriminator(_item_kind),
]


class CreateSession(Body):
    system: str | None = Field(None, max_length=20000, description="a system prompt before the tool instructions")
    tools: list[str] | None = Field(None, description="server tools by name or config key; default: all enabled")
    client_tools: list[ClientToolItem] = Field(
        default_factory=list, description="tools the client runs itself: the session pauses until their result is posted")
    max_tokens: int | None = Field(None, ge=1, description="per model turn; at most the model's context length")
    temperature: float = Field(0.0, ge=0, le=2)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    ignore_eos: bool = Field(False, description="every model turn runs to max_tokens or a tool call, past the end "
                                                "token (load tests that need fixed output lengths)")


class PostMessage(Body):
    content: str = Field(description="the user's message, or the answer to a pending AskHuman")
    stream: bool = Field(True, description="Server-Sent Events (true) or one JSON response")
    tool_choice: ToolChoice = Field("auto", description="constrains the message's first model turn")
    format: Literal["free", "react"] = Field("free", description="react: every model turn is one ReAct step")


class PostToolResult(Body):
    call_id: str
    content: str
    stream: bool = True


# ---------------------------------------------------------------------- records
class Usage(Out):
    prompt_tokens: int
    completion_tokens: int
    context_tokens: int | None = None


class TranscriptEntry(Sparse):
    role: Literal["user", "assistant", "tool"]
    content: str
    call_id: str | None = None
    answers: str | None = Field(None, description="the AskHuman call this user message answers")
    reply: str | None = None
    tool: str | None = None
    interrupted: bool | None = Field(None, description="the turn ended before its done event (disconnect, restart, engine death)")
    reason: str | None = None


# ---------------------------------------------------------------------- SSE events
class EventData(Sparse):
    """The data of one SSE event; `name` is its `event:` line."""

    name: ClassVar[str]


class TokenEvent(EventData):
    name = "token"
    text: str


class ToolCallEvent(EventData):
    name = "tool_call"
    call_id: str
    tool: str
    arguments: str
    executor: Literal["server", "human", "client", "unknown"]

    @classmethod
    def of(cls, call: CallRecord) -> ToolCallEvent:
        return cls(call_id=call.call_id, tool=call.tool, arguments=call.arguments, executor=call.kind)


class InterceptEvent(EventData):
    name = "intercept"
    call_id: str
    tool: str
    type: str | None
    policy: str | None
    engine_policy: str | None
    context_tokens: int | None
    expected_duration_s: float | None
    ttl_s: float | None = None  # TTL policies (continuum, ttl): how long the KV is kept before it goes

    @classmethod
    def of(cls, call: CallRecord, rec: InterceptRecord | None) -> InterceptEvent:
        """A call's pause, as its record keeps it (`CallRecord.paused`), with the engine's policy."""
        return cls(call_id=call.call_id, tool=call.tool, type=call.aug_type, policy=call.policy,
                   engine_policy=rec.policy if rec else None, context_tokens=call.context_tokens,
                   expected_duration_s=rec.expected_duration_s if rec else None, ttl_s=rec.ttl_s if rec else None)


class ToolResultEvent(EventData):
    name = "tool_result"
    call_id: str
    tool: str
    content: str
    error: bool
    artifacts: list[str]
    duration_s: float

    @classmethod
    def of(cls, call: CallRecord) -> ToolResultEvent:
        """A finished call (`CallRecord.finished`)."""
        return cls(call_id=call.call_id, tool=call.tool, content=call.result or "", error=call.error,
                   artifacts=list(call.artifacts), duration_s=round(call.duration_s or 0.0, 4))


class ResumeEvent(EventData):
    name = "resume"
    call_id: str | None
    tool: str | None
    restored_by: str = Field(description="preserve | swap | recompute (recompute after a disconnect or a restart)")
    policy: str | None
    kv_fate: str | None
    tokens_recomputed: int | None
    tokens_swapped_in: int | None
    after: Literal["restart", "hibernation", "takeover"] | None = Field(
        None, description="the context was rebuilt after a restart, after the session left memory while idle, or "
                          "on another replica that took the session over")

    @classmethod
    def of(cls, call: CallRecord | None, rec: InterceptRecord | None, after: str | None = None) -> ResumeEvent:
        """How the paused context came back. Without a record the engine request was opened anew (after an
        abort or a restart), which recomputes the whole context."""
        restored = rec.restored_by.value if rec is not None and rec.restored_by is not None else "recompute"
        ev = cls(call_id=call.call_id if call else None, tool=call.tool if call else None, restored_by=restored,
                 policy=rec.action if rec else None, kv_fate=rec.kv_fate.value if rec else None,
                 tokens_recomputed=rec.tokens_recomputed if rec else None,
                 tokens_swapped_in=rec.tokens_swapped_in if rec else None)
        if after is not None:
            ev.after = after  # type: ignore[assignment]
        return ev


class RepromptEvent(EventData):
    name = "reprompt"
    text: str


class DoneEvent(EventData):
    name = "done"
    reply: str | None
    finish_reason: str = Field(description="stop | length | tool_calls (a client tool is due) | ask_human")
    state: Literal["awaiting_user", "in_tool"]
    usage: Usage | None
    pending_call: CallRecord | None = None
    reprompts: int | None = None


class ErrorEvent(EventData):
    name = "error"
    type: str = Field(description="context_too_long | engine_error | engine_died | internal_error | session_closed | "
                                  "shutting_down | client_disconnected | store_unavailable | session_moved")
    message: str
    tokens: int | None = Field(None, description="context_too_long: the context's tokens")
    limit: int | None = Field(None, description="context_too_long: the model's context length")


EVENTS: dict[str, type[EventData]] = {m.name: m for m in (
    TokenEvent, ToolCallEvent, InterceptEvent, ToolResultEvent, ResumeEvent, RepromptEvent, DoneEvent, ErrorEvent)}


# ---------------------------------------------------------------------- responses
class FieldProblem(Out):
    field: str
    message: str


class ErrorDetail(Sparse):
    type: str
    message: str
    retry_after: int | None = Field(None, description="seconds; also the Retry-After header")
    errors: list[FieldProblem] | None = Field(None, description="invalid_request: every problem, by field")
    call_id: str | None = Field(None, description="awaiting_tool_result: the call the session waits for")
    tokens: int | None = Field(None, description="context_too_long: the context's tokens")
    limit: int | None = Field(None, description="context_too_long: the model's context length")
    events: list[dict[str, Any]] | None = Field(None, description="a turn that failed (`stream: false`): its events")


class ErrorBody(Out):
    error: ErrorDetail


class SessionCreated(Out):
    id: str
    token: str = Field(description="send it as X-Session-Token on every call about this session; shown only here")
    tools: list[str]
    client_tools: list[str]
    state: str


class SessionCounts(Out):
    sessions: int
    by_state: dict[str, int]


class SessionInfo(Out):
    id: str
    state: Literal["generating", "in_tool", "awaiting_user"]
    tools: list[str]
    client_tools: list[str]
    created: float
    context_tokens: int
    usage: dict[str, int]
    pending_call: CallRecord | None
    transcript: list[TranscriptEntry]
    calls: list[CallRecord]
    intercepts: list[Intercept]


class MessageResult(Out):
    reply: str | None
    state: str | None
    finish_reason: str | None
    usage: Usage | None
    pending_call: CallRecord | None
    text: str
    events: list[dict[str, Any]] = Field(description="every event but the tokens, each with its name under 'event'")


HealthStatus = Literal["ok", "starting", "restarting", "draining", "failed"]


class Health(Sparse):
    status: HealthStatus
    model: str
    policy: str
    error: str | None = None


class ToolInfo(Out):
    name: str
    type: str
    description: str
    expected_s: float | None
    timeout_s: float | None


class ToolList(Out):
    tools: list[ToolInfo]


class RankStats(Out):
    """One data-parallel rank (engine core): its own KV cache and intercept core."""

    rank: int
    sessions: int  # open sessions pinned to this rank
    blocks: dict[str, int]
    paused: int
    running: int
    waiting: int
    integrity: dict[str, int]


class Stats(Out):
    blocks: dict[str, int]
    block_size: int
    policy: str
    totals: dict[str, Any]
    waste: dict[str, Any]
    paused: int
    running: int
    waiting: int
    sessions: int
    turns_in_progress: int
    integrity: dict[str, int] = Field(description="KV block counts over the ranks (free + running + preserved == total)")
    store: dict[str, Any]
    ranks: list[RankStats]  # one per data-parallel rank (the fields above sum over them)
