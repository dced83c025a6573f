"""Tool calls as the gateway records and runs them: the record of one call, how a call's tool name
resolves (a server tool, the human, a client function, or nothing), running a server tool under its
timeout, and the API's view of an intercept."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from augmentations.base import CallContext, ToolError, ToolResult
from augmentations.registry import Registry, UnknownTool, find_tool
from engine_adapter.intercept.records import InterceptRecord

log = logging.getLogger("infercept.gateway")
HUMAN_TOOL = "AskHuman"
CallKind = Literal["server", "human", "client", "unknown"]


@dataclass
class CallRecord:
    call_id: str
    tool: str
    arguments: str
    kind: CallKind
    aug_type: str | None = None
    policy: str | None = None
    context_tokens: int | None = None
    started_s: float = field(default_factory=time.time)
    duration_s: float | None = None
    result: str | None = None
    error: bool = False
    artifacts: list[str] = field(default_factory=list)
    restored_by: str | None = None
    intercept_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def resolve_call(tool: str, server_tools: list[str], client_tools: Mapping[str, Any]) -> tuple[CallKind, str]:
    """(kind, the tool's name as the session spells it) for a tool name the model wrote."""
    client = find_tool(tool, client_tools)
    if client is not None:
        return "client", client
    server = find_tool(tool, server_tools)
    if server is None:
        return "unknown", tool
    return ("human" if server == HUMAN_TOOL else "server"), server


async def run_server_tool(registry: Registry, name: str, arguments: str, session_id: str, timeout_s: float) -> ToolResult:
    """A server tool's result; its errors and its timeout become the observation, never an exception."""
    try:
        ex = registry.get(name)
        return await asyncio.wait_for(ex.run(arguments, CallContext(session_id=session_id, timeout_s=timeout_s)), timeout_s)
    except (ToolError, UnknownTool) as e:
        return ToolResult(f"Error: {e}", error=True)
    except TimeoutError:
        return ToolResult(f"Error: {name} timed out after {timeout_s:g} s.", error=True)
    except Exception as e:
        log.exception("tool %s failed", name)
        return ToolResult(f"Error: {name} failed ({type(e).__name__}: {e}).", error=True)


def intercept_json(rec: InterceptRecord) -> dict[str, Any]:
    """An intercept as the API shows it (session info, `intercept`/`resume` events, OpenAI extras)."""
    restored = rec.restored_by.value if rec.restored_by is not None else None
    return {
        "intercept_id": rec.intercept_id, "type": rec.aug_type, "tool": rec.tool, "trigger": rec.trigger,
        "policy": rec.action, "engine_policy": rec.policy, "kv_fate": rec.kv_fate.value,
        "context_tokens": rec.context_tokens, "expected_duration_s": rec.expected_duration_s,
        "duration_s": rec.call_duration_s, "restored_by": restored,
        "tokens_preserved": rec.tokens_kept if restored in ("preserve", None) else 0,
        "tokens_swapped": rec.tokens_swapped_in, "tokens_recomputed": rec.tokens_recomputed,
        "tokens_prefix_hit": rec.tokens_prefix_hit,
    }


def intercept_event(call: CallRecord, rec: InterceptRecord | None) -> dict[str, Any]:
    """The `intercept` event of a call: what the engine decided at the pause (and the call records it)."""
    if rec is not None:
        call.aug_type, call.policy = rec.aug_type, rec.action
        call.context_tokens, call.intercept_id = rec.context_tokens, rec.intercept_id
    return {"call_id": call.call_id, "tool": call.tool, "type": call.aug_type, "policy": call.policy,
            "engine_policy": rec.policy if rec else None, "context_tokens": call.context_tokens,
            "expected_duration_s": rec.expected_duration_s if rec else None}


def resume_event(call: CallRecord | None, rec: InterceptRecord | None) -> dict[str, Any]:
    """The `resume` event: how the paused context came back (the call, if any, records it). Without a
    record the engine request was opened anew (after an abort), which recomputes the whole context."""
    restored = rec.restored_by.value if rec is not None and rec.restored_by is not None else "recompute"
    if call is not None:
        call.restored_by = restored
    return {"call_id": call.call_id if call else None, "tool": call.tool if call else None,
            "restored_by": restored, "policy": rec.action if rec else None,
            "kv_fate": rec.kv_fate.value if rec else None,
            "tokens_recomputed": rec.tokens_recomputed if rec else None,
            "tokens_swapped_in": rec.tokens_swapped_in if rec else None}
