"""What the examples share: command-line options and a trace printer over the client's events."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from gateway.client import Client, Event  # noqa: E402

DEFAULT_URL = os.environ.get("INFERCEPT_URL", "http://127.0.0.1:8000")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--url", default=DEFAULT_URL, help=f"the gateway (default {DEFAULT_URL})")
    p.add_argument("--api-key", default=os.environ.get("INFERCEPT_API_KEY"))
    p.add_argument("--quiet", action="store_true", help="print answers only, not the trace")
    p.add_argument("--format", default=None, choices=("free", "react"),
                   help="react: every model turn constrained to one ReAct step (structured outputs)")
    return p


def connect(args: argparse.Namespace) -> Client:
    c = Client(args.url, api_key=args.api_key)
    c.wait_ready(600)
    return c


def show(events: Iterable[Event], quiet: bool = False) -> Event:
    """Print the agent's trace as it streams (thoughts, tool calls, the engine's policy, results);
    return the final done/error event, with `model_observations`: how many times the model itself began an
    observation (only tools should write one), and `accepted_observations`: how many of those it went on
    to write, i.e. that were not stopped there (the gateway stops and re-prompts it at "Observation:")."""
    last = Event("error", {"message": "stream ended early"})
    at_line_start = True
    model_text: list[str] = []
    turn = ""  # the model's text since the last event that was not a token
    accepted = 0
    for ev in events:
        if ev.name != "token":
            accepted += _wrote_past_observation(turn)
            turn = ""
        if ev.name == "token":
            model_text.append(ev["text"])
            turn += ev["text"]
            if not quiet:
                print(ev["text"], end="", flush=True)
                at_line_start = ev["text"].endswith("\n")
            continue
        if not quiet and not at_line_start:
            print()
            at_line_start = True
        if quiet:
            pass
        elif ev.name == "tool_call":
            print(f"  [tool_call] {ev['tool']}[{ev['arguments']}] ({ev['executor']})")
        elif ev.name == "intercept":
            print(f"  [intercept] type={ev['type']} policy={ev['policy']} (engine: {ev['engine_policy']}) "
                  f"context={ev['context_tokens']} tokens, expected {ev['expected_duration_s']} s")
        elif ev.name == "tool_result":
            arts = f" artifacts={ev['artifacts']}" if ev["artifacts"] else ""
            print(f"  [tool_result] {ev['content'][:200]!r} in {ev['duration_s']:.3f} s{arts}")
        elif ev.name == "resume":
            print(f"  [resume] restored_by={ev['restored_by']} recomputed={ev['tokens_recomputed']} swapped_in={ev['tokens_swapped_in']}")
        elif ev.name == "done":
            print(f"  [done] state={ev['state']} finish={ev['finish_reason']} reply={ev['reply']!r}")
        elif ev.name == "reprompt":
            print(f"  [reprompt] the model began an observation itself; the gateway appended {ev['text']!r}")
        elif ev.name == "error":
            print(f"  [error] {ev.data}")
        if ev.terminal:
            last = ev
    last.data["model_observations"] = "".join(model_text).count("Observation:")
    last.data["accepted_observations"] = accepted
    return last


def _wrote_past_observation(text: str) -> int:
    """Model-written observations with content after them in one stretch of model text."""
    parts = text.split("Observation:")
    return sum(1 for after in parts[1:] if after.strip())
