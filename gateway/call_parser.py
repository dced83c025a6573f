"""Tool calls in the model's text: which tool, with what argument text; and the structured-output regex
that makes the model call one (`tool_choice`). Parsing only: running a call is `gateway.calls`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from augmentations.registry import find_tool

ToolChoice = str | dict[str, Any]  # "auto" | "required" | "none" | {"name": tool}


class ToolChoiceError(ValueError):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class CallParser:
    """Turns a trigger's match into (tool name, argument text). ReAct calls come parsed by the trigger;
    JSON calls go through vLLM's Hermes tool parser (the format's reference implementation), built
    on first use from the model's tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._hermes: Any = None

    def json_calls(self, text: str) -> list[tuple[str, str]]:
        """(name, JSON arguments) of every `<tool_call>` in `text`."""
        if self._hermes is None:
            from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

            self._hermes = ToolParserManager.get_tool_parser("hermes")(self.tokenizer)
        info = self._hermes.extract_tool_calls(text, request=None)
        return [(c.function.name, c.function.arguments) for c in info.tool_calls] if info.tools_called else []

    def parse(self, trigger: str, tool: str | None, arguments: str) -> tuple[str, str]:
        if trigger != "tool_call":
            return (tool or "").strip(), arguments.strip()
        calls = self.json_calls(f"<tool_call>{arguments}</tool_call>")
        if not calls:
            return "unparsable", arguments
        name, args = calls[0]
        return name, json_args_to_text(args)


def json_args_to_text(args: str) -> str:
    """A JSON arguments object as the text an executor takes: the value of a single argument, or the
    JSON itself when there are several."""
    try:
        obj = json.loads(args)
    except (TypeError, ValueError):
        return str(args)
    if isinstance(obj, dict) and len(obj) == 1:
        (value,) = obj.values()
        return value if isinstance(value, str) else json.dumps(value)
    return obj if isinstance(obj, str) else json.dumps(obj)


def react_step_regex(tools: Sequence[str]) -> str:
    """One ReAct step, nothing else: a thought, then a call of one of `tools` or the answer. Used as the
    structured output of every model turn of a message that asks for `format: react`, so the model can
    neither invent an observation nor drift out of the format."""
    line = r"[^\n]{1,200}"
    answer = rf"Answer: {line}"
    if not tools:
        return rf"Thought: {line}\n{answer}"
    alts = "|".join(re.escape(n) for n in tools)
    return rf"Thought: {line}\n(Action: ({alts})\[[^\n\]\[]{{1,200}}\]|{answer})"


def choice_regex(tool_choice: ToolChoice, tools: Sequence[str]) -> str | None:
    """The structured-output regex that enforces `tool_choice` on a message's first model turn:
    `auto` none; `required` a ReAct step calling one of `tools`; {"name": X} a step calling X; `none` a
    step that answers without a tool."""
    line = r"[^\s\]\[][^\n\]\[]{0,59}"
    if tool_choice == "auto":
        return None
    if tool_choice == "none":
        return rf"Thought: {line}\nAnswer: {line}"
    names = list(tools)
    if tool_choice == "required":
        if not names:
            raise ToolChoiceError("invalid_request", "tool_choice 'required' but the session has no tools")
    else:
        wanted = str(tool_choice.get("name", "")) if isinstance(tool_choice, dict) else ""
        match = find_tool(wanted, names)
        if match is None:
            raise ToolChoiceError("unknown_tool", f"tool_choice names {wanted!r}; the session's tools: {', '.join(names) or 'none'}")
        names = [match]
    alts = "|".join(re.escape(n) for n in names)
    return rf"Thought: {line}\nAction: ({alts})\[{line}\]"
