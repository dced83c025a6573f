"""`POST /v1/chat/completions` bodies, checked the way OpenAI's API checks them: the message roles and
the fields each role requires, numeric ranges, unknown arguments refused, tools and tool_choice
consistent, and every `tool` message answering a call of the assistant message before it (and every
such call answered). Responses are documented as OpenAI's `chat.completion` / `chat.completion.chunk`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WrapValidator

from gateway.records import CallRecord, Intercept
from gateway.schemas import Out, Sparse, Usage, one_message


class Part(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI adds fields to content parts over time


class TextPart(Part):
    type: Literal["text"]
    text: str


class ImagePart(Part):
    type: Literal["image_url"]
    image_url: dict[str, Any]


class AudioPart(Part):
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


class FilePart(Part):
    type: Literal["file"]
    file: dict[str, Any]


class RefusalPart(Part):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[TextPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. `refusal`, `annotations` echoed back by clients
    name: str | None = None


class SystemMessage(Message):
    role: Literal["system"]
    content: str | list[TextPart]


class DeveloperMessage(Message):
    role: Literal["developer"]
    content: str | list[TextPart]


class UserMessage(Message):
    role: Literal["user"]
    content: str | list[UserPart]


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(Message):
    role: Literal["assistant"]
    content: str | list[AssistantPart] | None = None
    tool_calls: list[ToolCall] | None = Field(None, min_length=1)


class ToolMessage(Message):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str


ChatMessage = Annotated[SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class ChoiceFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: ChoiceFunction


class StreamOptions(BaseModel):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(BaseModel):
    """OpenAI's arguments; those marked accepted-and-ignored are validated but have no effect here."""

    model_config = ConfigDict(extra="forbid")
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=128, description="only 1 is served")
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: Annotated[Literal["none", "auto", "required"] | NamedToolChoice | None, WrapValidator(one_message(
        'must be "none", "auto", "required" or {"type": "function", "function": {"name": NAME}}'))] = None
    parallel_tool_calls: bool | None = None
    # Accepted and ignored (range-checked as OpenAI does):
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, Annotated[int, Field(ge=-100, le=100)]] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    verbosity: str | None = None

    def problems(self) -> list[dict[str, str]]:
        """The cross-field rules OpenAI enforces, as (field, why)."""
        out: list[dict[str, str]] = []

        def bad(field: str, message: str) -> None:
            out.append({"field": field, "message": message})

        if isinstance(self.stop, list) and len(self.stop) > 4:
            bad("stop", "at most 4 stop sequences")
        if self.tool_choice is not None and not self.tools:
            bad("tool_choice", "is only allowed when 'tools' are specified")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools and \
                self.tool_choice.function.name not in {t.function.name for t in self.tools}:
            bad("tool_choice", f"names the function {self.tool_choice.function.name!r}, which is not in 'tools'")
        if self.stream_options is not None and not self.stream:
            bad("stream_options", "is only allowed when 'stream' is true")
        if self.top_logprobs is not None and not self.logprobs:
            bad("top_logprobs", "needs 'logprobs' set to true")
        if self.tools:
            names = [t.function.name for t in self.tools]
            for name in {n for n in names if names.count(n) > 1}:
                bad("tools", f"the function name {name!r} is used twice")
        self._check_conversation(bad)
        return out

    def _check_conversation(self, bad: Any) -> None:
        unanswered: dict[str, int] = {}  # tool_call_id -> index of the assistant message that made it
        for i, m in enumerate(self.messages):
            if isinstance(m, ToolMessage):
                if m.tool_call_id not in unanswered:
                    bad(f"messages[{i}].tool_call_id", "a 'tool' message must answer a tool call of the preceding "
                        f"assistant message; there is no unanswered call {m.tool_call_id!r}")
                unanswered.pop(m.tool_call_id, None)
                continue
            if unanswered:
                ids = ", ".join(unanswered)
                bad(f"messages[{next(iter(unanswered.values()))}].tool_calls", "an assistant message with 'tool_calls' must be "
                    f"followed by tool messages answering each 'tool_call_id'; not answered: {ids}")
                unanswered.clear()
            if isinstance(m, AssistantMessage):
                if m.content is None and not m.tool_calls:
                    bad(f"messages[{i}].content", "an assistant message needs 'content' or 'tool_calls'")
                for call in m.tool_calls or []:
                    unanswered[call.id] = i
            if isinstance(m, UserMessage) and isinstance(m.content, list):
                for j, part in enumerate(m.content):
                    if not isinstance(part, TextPart):
                        bad(f"messages[{i}].content[{j}].type", f"{part.type!r} content is not supported: this model reads text")
        if unanswered:
            bad(f"messages[{next(iter(unanswered.values()))}].tool_calls", "an assistant message with 'tool_calls' must be "
                f"followed by tool messages answering each 'tool_call_id'; not answered: {', '.join(unanswered)}")


# ---------------------------------------------------------------------- responses
class ChoiceMessage(Sparse):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


class Choice(Out):
    index: int
    message: ChoiceMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class CompletionUsage(Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionExtras(Out):
    """What infercept adds to a completion: the final answer alone, and what the engine did at each call."""

    reply: str | None
    intercepts: list[Intercept]
    calls: list[CallRecord]


class ChatCompletion(Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    infercept: CompletionExtras = Field(description="the final answer alone (reply), each intercept and call record")


class ChatCompletionChunk(Sparse):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage | None = Field(None, description="the last chunk: the turn's token counts")
    infercept: dict[str, Any] | None = Field(None, description="an extension event (tool_call, intercept, resume)")


class ModelInfo(Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(Out):
    object: Literal["list"]
    data: list[ModelInfo]
