"""The session API's bodies as pydantic models: requests (validated, strict), responses and the SSE
events (documented in `/openapi.json`; the tests check real responses against them). The OpenAI routes'
models are in `gateway.schemas_openai`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, WrapValidator

from gateway.validation import one_message

TOOL_NAME = r"^[A-Za-z][A-Za-z0-9_-]*$"


class Body(BaseModel):
    """A request body: unknown fields are errors (a typo is reported, not ignored)."""

    model_config = ConfigDict(extra="forbid")


class Out(BaseModel):
    """A response body (new fields may be added)."""

    model_config = ConfigDict(extra="allow")


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


class CallInfo(Out):
    call_id: str
    tool: str
    arguments: str
    kind: Literal["server", "human", "client", "unknown"]
    aug_type: str | None = None
    policy: str | None = None
    context_tokens: int | None = None
    started_s: float
    duration_s: float | None = None
    result: str | None = None
    error: bool = False
    artifacts: list[str] = Field(default_factory=list)
    restored_by: str | None = None
    intercept_id: int | None = None


class TranscriptEntry(Out):
    role: Literal["user", "assistant", "tool"]
    content: str
    call_id: str | None = None
    answers: str | None = Field(None, description="the AskHuman call this user message answers")
    reply: str | None = None
    tool: str | None = None
    interrupted: bool | None = Field(None, description="the turn ended before its done event (disconnect, restart, engine death)")
    reason: str | None = None


class InterceptInfo(Out):
    intercept_id: int
    type: str
    tool: str | None = None
    trigger: str | None = None
    policy: str | None = None
    engine_policy: str | None = None
    kv_fate: str | None = None
    context_tokens: int
    expected_duration_s: float | None = None
    duration_s: float | None = None
    restored_by: str | None = None
    tokens_preserved: int | None = None
    tokens_swapped: int | None = None
    tokens_recomputed: int | None = None
    tokens_prefix_hit: int | None = None


# ---------------------------------------------------------------------- SSE events
class TokenEvent(Out):
    text: str


class ToolCallEvent(Out):
    call_id: str
    tool: str
    arguments: str
    executor: Literal["server", "human", "client", "unknown"]


class InterceptEvent(Out):
    call_id: str
    tool: str
    type: str | None
    policy: str | None
    engine_policy: str | None
    context_tokens: int | None
    expected_duration_s: float | None


class ToolResultEvent(Out):
    call_id: str
    tool: str
    content: str
    error: bool
    artifacts: list[str]
    duration_s: float


class ResumeEvent(Out):
    call_id: str | None
    tool: str | None
    restored_by: str = Field(description="preserve | swap | recompute (recompute after a disconnect or a restart)")
    policy: str | None
    kv_fate: str | None
    tokens_recomputed: int | None
    tokens_swapped_in: int | None
    after: Literal["restart"] | None = Field(None, description="the context was rebuilt after a restart")


class RepromptEvent(Out):
    text: str


class DoneEvent(Out):
    reply: str | None
    finish_reason: str = Field(description="stop | length | tool_calls (a client tool is due) | ask_human")
    state: Literal["awaiting_user", "in_tool"]
    usage: Usage | None
    pending_call: CallInfo | None = None
    reprompts: int | None = None


class ErrorEvent(Out):
    type: str = Field(description="context_too_long | engine_error | engine_died | internal_error | session_closed | shutting_down | client_disconnected")
    message: str


EVENTS: dict[str, type[Out]] = {
    "token": TokenEvent, "tool_call": ToolCallEvent, "intercept": InterceptEvent, "tool_result": ToolResultEvent,
    "resume": ResumeEvent, "reprompt": RepromptEvent, "done": DoneEvent, "error": ErrorEvent,
}


# ---------------------------------------------------------------------- responses
class ErrorDetail(Out):
    type: str
    message: str
    retry_after: int | None = Field(None, description="seconds; also the Retry-After header")


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
    pending_call: CallInfo | None
    transcript: list[TranscriptEntry]
    calls: list[CallInfo]
    intercepts: list[InterceptInfo]


class MessageResult(Out):
    reply: str | None
    state: str | None
    finish_reason: str | None
    usage: Usage | None
    pending_call: CallInfo | None
    text: str
    events: list[dict[str, Any]] = Field(description="every event but the tokens, each with its name under 'event'")


class Health(Out):
    status: Literal["ok", "starting", "restarting", "draining", "failed"]
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
    store: dict[str, Any]
    ranks: list[RankStats]  # one per data-parallel rank (the fields above sum over them)
