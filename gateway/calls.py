"""Running tool calls: how a call's tool name resolves (a server tool, the human, a client function, or
nothing), and running a server tool under its timeout. The call's record is `gateway.records.CallRecord`;
parsing a call out of the model's text is `gateway.call_parser`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from augmentations.base import CallContext, ToolError, ToolResult
from augmentations.registry import Registry, UnknownTool, find_tool
from gateway.records import CallKind

log = logging.getLogger("infercept.gateway")
HUMAN_TOOL = "AskHuman"


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


__all__ = ["HUMAN_TOOL", "resolve_call", "run_server_tool"]
