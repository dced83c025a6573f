"""The gateway's two records, one shape each wherever they go: a tool call (`CallRecord`) and an
intercept as the API shows it (`Intercept`).

A `CallRecord` is what the session store journals (`{"k": "call", **record}`, `gateway.durable`), what
`GET /v1/sessions/{sid}` lists under `calls` and `pending_call`, what a `done` event names as its
`pending_call`, and what the OpenAI route's `infercept.calls` carries: one pydantic model, dumped the
same way for all of them, validated (unknown fields refused) when a stored session is read back.
An `Intercept` is built from the engine core's `InterceptRecord` (the engine's own bookkeeping) for the
session's `intercepts` and the OpenAI route's `infercept.intercepts`; the `intercept` and `resume`
events are projections of a call and its intercept (`gateway.schemas`).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine_adapter.intercept.records import InterceptRecord

CallKind = Literal["server", "human", "client", "unknown"]


class Record(BaseModel):
    """A body the server sends (or stores): exactly these fields, nothing else."""

    model_config = ConfigDict(extra="forbid")


class CallRecord(Record):
    """One tool call of a session. Mutable: the loop fills in the intercept, the result and how the
    context came back as they happen, and journals the whole record after each change."""

    call_id: str
    tool: str
    arguments: str
    kind: CallKind
    aug_type: str | None = None
    policy: str | None = Field(None, description="the intercept policy's action at the pause")
    context_tokens: int | None = None
    started_s: float = Field(default_factory=time.time)
    duration_s: float | None = None
    result: str | None = None
    error: bool = False
    artifacts: list[str] = Field(default_factory=list)
    restored_by: str | None = None
    intercept_id: int | None = None

    def dump(self) -> dict[str, Any]:
        """The record as JSON (the store's row, the API's object): every field, always."""
        return self.model_dump(mode="json")

    def paused(self, rec: InterceptRecord | None) -> None:
        """What the engine decided at the call's pause (None: the request did not pause)."""
        if rec is not None:
            self.aug_type, self.policy = rec.aug_type, rec.action
            self.context_tokens, self.intercept_id = rec.context_tokens, rec.intercept_id

    def resumed(self, restored_by: str) -> None:
        """How the paused context came back after the call (preserve, swap, recompute)."""
        self.restored_by = restored_by

    def finished(self, content: str, error: bool, artifacts: list[str]) -> None:
        self.result, self.error, self.artifacts = content, error, artifacts
        self.duration_s = time.time() - self.started_s


class Intercept(Record):
    """One intercept as the engine core recorded it (what became of the paused context)."""

    intercept_id: int
    type: str
    tool: str | None = None
    trigger: str | None = None
    policy: str | None = Field(None, description="the policy's action at the pause")
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

    @classmethod
    def of(cls, rec: InterceptRecord) -> Intercept:
        restored = rec.restored_by.value if rec.restored_by is not None else None
        return cls(intercept_id=rec.intercept_id, type=rec.aug_type, tool=rec.tool, trigger=rec.trigger,
                   policy=rec.action, engine_policy=rec.policy, kv_fate=rec.kv_fate.value,
                   context_tokens=rec.context_tokens, expected_duration_s=rec.expected_duration_s,
                   duration_s=rec.call_duration_s, restored_by=restored,
                   tokens_preserved=rec.tokens_kept if restored in ("preserve", None) else 0,
                   tokens_swapped=rec.tokens_swapped_in, tokens_recomputed=rec.tokens_recomputed,
                   tokens_prefix_hit=rec.tokens_prefix_hit)


__all__ = ["CallKind", "CallRecord", "Intercept", "Record"]
