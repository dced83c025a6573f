"""Intercept triggers: text patterns that end a generation turn at a tool call.

A trigger is a regular expression over the text a turn has generated so far, plus the characters one
of its matches can end with. The engine core checks triggers after every sampled token (inside the
scheduler, so no token past the trigger is ever sampled into the context); the front end re-runs the
same pattern over the turn's text to extract the call (tool name, arguments).

Matching is incremental and cheap: a token whose text holds none of the triggers' end characters
cannot complete a match (checked with a precomputed set of token ids); only then is a bounded
window of the turn's last tokens decoded and searched.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Trigger:
    name: str
    pattern: str
    # Characters a completed match can end with (its last literal). Used as a prefilter.
    end_chars: str
    flags: int = re.DOTALL
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.end_chars:
            raise ValueError("a trigger needs a name and at least one end character")
        try:
            object.__setattr__(self, "_regex", re.compile(self.pattern, self.flags))
        except re.error as e:
            raise ValueError(f"trigger {self.name!r}: bad pattern {self.pattern!r}: {e}") from e

    @property
    def regex(self) -> re.Pattern[str]:
        return self._regex

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "pattern": self.pattern, "end_chars": self.end_chars, "flags": int(self.flags)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trigger:
        return cls(name=d["name"], pattern=d["pattern"], end_chars=d["end_chars"], flags=int(d.get("flags", re.DOTALL)))


# A ReAct step: "Action: Calculator[3*4]". The call ends at the first "]" on the line.
REACT = Trigger(
    name="react",
    pattern=r"Action:[ \t]*(?P<tool>[A-Za-z_][\w\-]*)[ \t]*\[(?P<args>[^\]\n]*)\]",
    end_chars="]",
)
# Hermes/Qwen-style JSON tool calls: <tool_call>{"name": ..., "arguments": ...}</tool_call>
TOOL_CALL = Trigger(name="tool_call", pattern=r"<tool_call>(?P<args>.*?)</tool_call>", end_chars=">")
# A model-written observation: in ReAct only tools write observations, so generation stops where the model
# begins one itself (as ReAct implementations stop at "\nObservation:"); the gateway re-prompts. Tool
# results are appended as input, never generated, so this fires only on invented ones.
OBSERVATION = Trigger(name="observation", pattern=r"(?:^|\n)[ \t]*Observation:", end_chars=":")
DEFAULT_TRIGGERS: tuple[Trigger, ...] = (REACT, TOOL_CALL, OBSERVATION)


@dataclass(frozen=True)
class TriggerMatch:
    trigger: str
    text: str  # the whole matched call text
    tool: str | None
    arguments: str | None
    start: int  # offsets in the turn's text
    end: int


def find_call(triggers: Sequence[Trigger], name: str, text: str) -> TriggerMatch | None:
    """The last match of trigger `name` in a turn's text (the one that ended the turn)."""
    for trig in triggers:
        if trig.name != name:
            continue
        last = None
        for last in trig.regex.finditer(text):
            pass
        if last is None:
            return None
        groups = last.groupdict()
        return TriggerMatch(
            trigger=name,
            text=last.group(0),
            tool=groups.get("tool"),
            arguments=groups.get("args"),
            start=last.start(),
            end=last.end(),
        )
    return None


class TriggerMatcher:
    """Decides, token by token, whether the newest token completed a trigger.

    `decode` turns token ids into text (the model's tokenizer); `vocab_texts` is the text of every token
    id, used once to build the prefilter.
    """

    def __init__(
        self,
        triggers: Sequence[Trigger],
        decode: Callable[[list[int]], str],
        vocab_texts: Sequence[str],
        window_tokens: int = 96,
    ) -> None:
        self.triggers = tuple(triggers)
        self.decode = decode
        self.window_tokens = window_tokens
        ends = set("".join(t.end_chars for t in self.triggers))
        self._may_end = frozenset(i for i, s in enumerate(vocab_texts) if ends.intersection(s))

    def check(self, output_token_ids: Sequence[int], enabled: frozenset[str] | None = None) -> str | None:
        """Name of the trigger the last token completed, or None.

        `output_token_ids` is the current turn's output; `enabled` limits the triggers (None = all).
        A match counts only if it ends inside the newest token's text, so each call fires once.
        """
        if not output_token_ids or output_token_ids[-1] not in self._may_end:
            return None
        window = list(output_token_ids[-self.window_tokens :])
        full = self.decode(window)
        before = self.decode(window[:-1]) if len(window) > 1 else ""
        fresh_from = len(before) if full.startswith(before) else 0
        for trig in self.triggers:
            if enabled is not None and trig.name not in enabled:
                continue
            for m in trig.regex.finditer(full):
                if m.end() > fresh_from:
                    return trig.name
        return None
