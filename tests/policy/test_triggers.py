"""Trigger matching with the real SmolLM2 tokenizer: fires on exactly the token that completes a call."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine_adapter.models import prepare
from engine_adapter.triggers import (
    DEFAULT_TRIGGERS,
    REACT,
    TOOL_CALL,
    Trigger,
    TriggerMatcher,
    find_call,
)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(prepare("tiny")))


@pytest.fixture(scope="module")
def matcher(tok: PreTrainedTokenizerBase) -> TriggerMatcher:
    vocab = tok.batch_decode([[i] for i in range(len(tok))])
    return TriggerMatcher(DEFAULT_TRIGGERS, tok.decode, vocab)


def first_fire(matcher: TriggerMatcher, ids: list[int], enabled: frozenset[str] | None = None) -> tuple[int, str] | None:
    for k in range(1, len(ids) + 1):
        name = matcher.check(ids[:k], enabled)
        if name is not None:
            return k, name
    return None


@pytest.mark.parametrize(
    "text, trigger, call",
    [
        (" I need to multiply.\nAction: Calculator[29*13]\nObservation:", "react", "Action: Calculator[29*13]"),
        ("Thought: look it up\nAction: Wikipedia[Alan Turing] and more", "react", "Action: Wikipedia[Alan Turing]"),
        ('Sure. <tool_call>{"name": "tts", "arguments": {"text": "hi"}}</tool_call> done', "tool_call",
         '<tool_call>{"name": "tts", "arguments": {"text": "hi"}}</tool_call>'),
    ],
)
def test_fires_on_the_completing_token(tok: PreTrainedTokenizerBase, matcher: TriggerMatcher, text: str, trigger: str, call: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    fired = first_fire(matcher, ids)
    assert fired is not None
    k, name = fired
    assert name == trigger
    prefix = tok.decode(ids[:k])
    # The call is complete with token k and was not complete one token earlier.
    assert call in prefix
    assert call not in tok.decode(ids[: k - 1])
    m = find_call(DEFAULT_TRIGGERS, name, prefix)
    assert m is not None and m.text == call
    if trigger == "react":
        assert m.tool == call.split(":")[1].strip().split("[")[0]


def test_no_fire_without_a_complete_call(tok: PreTrainedTokenizerBase, matcher: TriggerMatcher) -> None:
    for text in ["Action: Calculator[29*13", "The array a[3] is set. Action needed.", "<tool_call>{...}"]:
        assert first_fire(matcher, tok.encode(text, add_special_tokens=False)) is None


def test_only_enabled_triggers_fire(tok: PreTrainedTokenizerBase, matcher: TriggerMatcher) -> None:
    ids = tok.encode("Action: Calculator[1+1]", add_special_tokens=False)
    assert first_fire(matcher, ids, frozenset({"tool_call"})) is None
    assert first_fire(matcher, ids, frozenset({"react"})) is not None


def test_fires_once_per_call(tok: PreTrainedTokenizerBase, matcher: TriggerMatcher) -> None:
    ids = tok.encode("Action: Calculator[1+1]", add_special_tokens=False)
    fired = first_fire(matcher, ids)
    assert fired is not None
    # Tokens after the completed call do not fire again for the same call.
    tail = tok.encode(" and then more words", add_special_tokens=False)
    for k in range(1, len(tail) + 1):
        assert matcher.check(ids + tail[:k]) is None


def test_trigger_validation() -> None:
    with pytest.raises(ValueError, match="bad pattern"):
        Trigger("x", "(unclosed", "]")
    with pytest.raises(ValueError):
        Trigger("x", "a", "")
    assert Trigger.from_dict(REACT.to_dict()) == REACT
    assert TOOL_CALL.regex.search("<tool_call>x</tool_call>")
