"""The ReAct prompt the gateway writes for the model, and the text it appends at each step.

A session's context is one growing token sequence (the engine keeps it across tool calls):

    <system: instructions + one line per tool>  <few-shot examples, one per tool, as chat turns>
    <user: question>  <assistant: Thought: ... Action: Tool[args]>  \\nObservation: result\\n
    Thought: ... Answer: ...<eos>  <user: next message>  <assistant: ...

Rendering goes through the model's own chat template (vLLM's tokenizer), so a different chat model
gets its own markup; observations are appended inside the assistant's message, as in ReAct. Models
without a chat template get the plain `Question:/Thought:/Action:` layout the template-free few-shot
uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INSTRUCTIONS = (
    "You are a helpful agent. Answer in steps. Write 'Thought:' with your reasoning, then either "
    "'Action: Tool[input]' to use a tool and wait for its 'Observation:', or 'Answer:' with the final answer. "
    "Use a tool whenever it helps; never invent an observation."
)

# One worked example per tool (question, assistant steps with observations). Keyed by the executors'
# names; the observations are what the real tools return, shortened.
EXAMPLES: dict[str, tuple[str, str] | list[tuple[str, str]]] = {
    "Calculator": [
        ("A box holds 15 apples. How many apples are in 4 boxes?",
         "Thought: I need to multiply 15 by 4.\nAction: Calculator[15*4]\nObservation: 60\nAnswer: 60"),
        ("Tom has 120 dollars and spends 45. How much is left?",
         "Thought: I need to subtract 45 from 120.\nAction: Calculator[120-45]\nObservation: 75\nAnswer: 75"),
        ("A class has 18 girls and 17 boys. How many children are in the class?",
         "Thought: I need to add 18 and 17.\nAction: Calculator[18+17]\nObservation: 35\nAnswer: 35"),
    ],
    "Wikipedia": (
        "Who wrote the play Hamlet?",
        "Thought: I should look up Hamlet.\nAction: Wikipedia[Hamlet]\n"
        "Observation: Hamlet: The Tragedy of Hamlet, Prince of Denmark, is a tragedy written by William Shakespeare.\n"
        "Answer: William Shakespeare",
    ),
    # A real ALFWorld game (a generated pick-and-place task), shortened: the tool's own text.
    "ALFWorld": (
        "Play the household task until you win.",
        "Thought: I should see where I am and what the task is.\nAction: ALFWorld[look]\n"
        "Observation: You are in the middle of a room. Looking quickly around you, you see a armchair 1, a bed 1, "
        "a drawer 1, a dresser 1, and a sidetable 1. Your task is to: put a keychain in armchair.\n"
        "Thought: A keychain may be on the dresser.\nAction: ALFWorld[go to dresser 1]\n"
        "Observation: You arrive at dresser 1. On the dresser 1, you see a book 2, a keychain 2, and a mug 1.\n"
        "Thought: I take the keychain.\nAction: ALFWorld[take keychain 2 from dresser 1]\n"
        "Observation: You pick up the keychain 2 from the dresser 1.\n"
        "Thought: Now I bring it to the armchair.\nAction: ALFWorld[go to armchair 1]\n"
        "Observation: You arrive at armchair 1. On the armchair 1, you see a remotecontrol 1.\n"
        "Action: ALFWorld[move keychain 2 to armchair 1]\n"
        "Observation: You move the keychain 2 to the armchair 1. You won!\nAnswer: I won: the keychain is in the armchair.",
    ),
    "Image": (
        "Draw a cat on a sofa.",
        "Thought: I should make a picture.\nAction: Image[a cat sitting on a sofa]\n"
        "Observation: An image of a cat sitting on a sofa (64x64 PNG).\nAnswer: Here is your picture of a cat on a sofa.",
    ),
    "TTS": (
        "Say good morning out loud.",
        "Thought: I should speak.\nAction: TTS[Good morning!]\nObservation: Spoke 2 words (1.0 s of audio).\n"
        "Answer: I said good morning.",
    ),
    "AskHuman": (
        "Book a table for dinner.",
        "Thought: I need to know the time.\nAction: AskHuman[For what time should I book?]\nObservation: 7 pm\n"
        "Answer: I will book a table for 7 pm.",
    ),
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    example: tuple[str, str] | None = None  # (question, assistant steps)


def generic_example(spec: ToolSpec) -> tuple[str, str]:
    """A worked example for a tool we know only by name and description (a client's function)."""
    what = spec.description.rstrip(".") or f"use {spec.name}"
    return (
        f"I need you to {what[0].lower() + what[1:]}: the first item.",
        f"Thought: I should call {spec.name}.\nAction: {spec.name}[the first item]\n"
        f"Observation: (the result from {spec.name})\nAnswer: Done; {spec.name} answered.",
    )


def tool_line(spec: ToolSpec) -> str:
    return f"- {spec.name}[input]: {spec.description}"


class PromptBuilder:
    """Turns a session's messages into token ids with the model's tokenizer."""

    SENTINEL = "\x00INFERCEPT\x00"

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.has_template = bool(getattr(tokenizer, "chat_template", None))

    def system_text(self, system: str | None, tools: Sequence[ToolSpec]) -> str:
        parts = [system.strip()] if system else []
        if tools:
            parts.append(INSTRUCTIONS)
            parts.append("Tools:\n" + "\n".join(tool_line(t) for t in tools))
        return "\n\n".join(parts) or "You are a helpful assistant."

    def few_shot(self, tools: Sequence[ToolSpec]) -> list[dict[str, str]]:
        msgs: list[dict[str, str]] = []
        for t in tools:
            ex = t.example or EXAMPLES.get(t.name) or generic_example(t)
            for question, steps in ex if isinstance(ex, list) else [ex]:
                msgs += [{"role": "user", "content": question}, {"role": "assistant", "content": steps}]
        return msgs

    def render(self, messages: Sequence[Mapping[str, str]], generation_prompt: bool = True) -> str:
        if self.has_template:
            return self.tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
        out = []
        for m in messages:
            role = m["role"]
            if role == "system":
                out.append(m["content"] + "\n\n")
            elif role == "user":
                out.append(f"Question: {m['content']}\n")
            else:
                out.append(m["content"] + "\n\n")
        if generation_prompt:
            out.append("")
        return "".join(out)

    def opening(self, system: str | None, tools: Sequence[ToolSpec], history: Sequence[Mapping[str, str]], content: str) -> str:
        """The whole text of a session's first turn: system, examples, earlier messages, the question."""
        msgs = [{"role": "system", "content": self.system_text(system, tools)}, *self.few_shot(tools), *history]
        msgs.append({"role": "user", "content": content})
        return self.render(msgs)

    def user_delta(self, content: str) -> str:
        """The text between the end of an assistant message's content and the start of the next
        assistant message's content, with a user message in between (for this chat template)."""
        base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": self.SENTINEL}]
        before = self.render(base, generation_prompt=False)
        after = self.render([*base, {"role": "user", "content": content}])
        cut = before.index(self.SENTINEL) + len(self.SENTINEL)
        if after[:cut] != before[:cut]:
            raise ValueError("chat template does not extend conversations by appending")
        return after[cut:]

    def message(self, content: str, *, first: bool, system: str | None, tools: Sequence[ToolSpec], after_eos: bool) -> str:
        """The text a user message appends to a session: its whole opening (system, examples, the
        question) for the first one, else the chat template's turn change and the message. After a turn
        that ended on EOS that token is still pending in the session (the engine re-sends it), so the
        template's copy of it is left out."""
        if first:
            return self.opening(system, tools, [], content)
        delta = self.user_delta(content)
        eos = self.eos_text()
        if after_eos and eos and delta.startswith(eos):
            delta = delta[len(eos):]
        return delta

    def eos_text(self) -> str:
        eos = getattr(self.tok, "eos_token", None)
        return str(eos) if eos else ""

    @staticmethod
    def observation(content: str) -> str:
        return f"\nObservation: {content.strip()}\n"
