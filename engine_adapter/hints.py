"""What travels with a session to the engine core in vLLM's `kv_hints` (a `KvHintsEnvelope`).

* `message_id`: the session id (vLLM may rename the request id; the session id is ours).
* an action of type `infercept.tools` whose payload maps tool names to their augmentation type and
  expected call duration: `{"Calculator": {"type": "math", "expected_s": 0.0001}, ...}`, plus the
  optional key `"__turn_end__"` for a turn that ends without a tool call (waiting for the human).

With this table the scheduler knows the augmentation type at the very token that completes a call,
with no round trip to the front end; `InterceptEngine.tag` can refine it afterwards. This module
imports no vLLM at its top (the tool registry uses `ToolHint` without an engine); only `build_hints`
needs vLLM's envelope classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = "1"
TOOLS_ACTION = "infercept.tools"
TURN_END_KEY = "__turn_end__"
DEFAULT_TYPE = "default"


@dataclass(frozen=True)
class ToolHint:
    aug_type: str
    expected_s: float | None = None


def build_hints(session_id: str, tools: Mapping[str, ToolHint]) -> Any:
    """The `KvHintsEnvelope` for a session's request."""
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    payload = {name: {"type": h.aug_type, "expected_s": h.expected_s} for name, h in tools.items()}
    action = KvHintAction(action_id=f"{session_id}-tools", action_type=TOOLS_ACTION,
                          action_version=PROTOCOL_VERSION, payload=payload)
    return KvHintsEnvelope(protocol_version=PROTOCOL_VERSION, message_id=session_id, actions=[action])


@dataclass(frozen=True)
class SessionHints:
    session_id: str | None = None
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def tool_info(self, tool: str | None) -> tuple[str, float | None]:
        """(augmentation type, expected seconds) for a tool name; unknown tools are `default`."""
        info = self.tools.get(tool or "") or {}
        expected = info.get("expected_s")
        return str(info.get("type", DEFAULT_TYPE)), (None if expected is None else float(expected))


def parse_hints(env: Any) -> SessionHints:
    """A request's `kv_hints` envelope (or None) as the session id and tool table."""
    if env is None:
        return SessionHints()
    tools: dict[str, Mapping[str, Any]] = {}
    for action in env.actions:
        if action.action_type == TOOLS_ACTION:
            tools.update(action.payload)
    return SessionHints(session_id=env.message_id, tools=tools)
