"""What a session turn yields (`TokenDelta`, `Resumed`, one `TurnEnd`) and the errors the engine facade
raises for bad use (mapped to 4xx by the gateway)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine_adapter.intercept.records import InterceptRecord
from engine_adapter.triggers import TriggerMatch


class EngineError(RuntimeError):
    """Base class of the errors the facade raises for bad use (mapped to 4xx by the gateway)."""


class ContextTooLong(EngineError):
    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"context of {tokens} tokens exceeds the model's limit of {limit}")
        self.tokens, self.limit = tokens, limit


class EngineDead(EngineError):
    """The engine-core process died under a turn (the gateway restarts the engine)."""


class RequestFailed(EngineError):
    """vLLM ended the turn's request with an error of its own (finish reason `error`: e.g. the turn's
    structured-output grammar did not compile); the session stays usable."""


class SessionBusy(EngineError):
    pass


class SessionClosed(EngineError):
    pass


@dataclass(frozen=True)
class TokenDelta:
    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Resumed:
    """How the context of the previous pause came back (the first event of a turn that resumed a
    paused request; it comes with the turn's first output)."""

    intercept: InterceptRecord


@dataclass(frozen=True)
class TurnEnd:
    # tool_call: a trigger completed (the request is paused under the policy); stop: EOS, the model
    # waits for the next message (also paused); length: max_tokens or the context limit; aborted: the
    # session was closed (or the request aborted) while generating.
    reason: Literal["tool_call", "stop", "length", "aborted"]
    call: TriggerMatch | None
    text: str
    token_ids: list[int]
    context_tokens: int
    # The pause this turn ended in, as the engine core recorded it (type, the policy's action, context
    # tokens, expected duration); None when the request did not pause (aborted, or finished).
    intercept: InterceptRecord | None = None


TurnEvent = TokenDelta | Resumed | TurnEnd
