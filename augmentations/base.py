"""The executor protocol every augmentation implements, and what it returns.

Tool-call syntax is not an executor's business (the gateway parses calls); an executor gets the call's
argument text and returns text for the model plus optional artifacts (images, audio) for the client.
Heavy work belongs in a thread or process pool the executor owns, never on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class ToolError(Exception):
    """Bad arguments or a failed call; the message is shown to the model as the observation."""


@dataclass(frozen=True)
class Artifact:
    kind: str  # "image" | "audio" | ...
    mime: str
    data: bytes


@dataclass(frozen=True)
class ToolResult:
    content: str  # what the model reads as the observation
    artifacts: tuple[Artifact, ...] = ()
    error: bool = False  # content is an error message (the call failed, the session goes on)


@dataclass
class CallContext:
    """Per-call facts an executor may use (session id, a deadline); extensible without breaking executors."""

    session_id: str | None = None
    timeout_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Augmentation(Protocol):
    name: str  # the tool name the model writes, e.g. "Calculator"
    aug_type: str  # the paper's augmentation type: math, qa, ve, chat, image, tts, or a custom one
    description: str  # one line for the prompt template

    async def run(self, args: str, ctx: CallContext) -> ToolResult: ...

    async def close(self) -> None: ...
