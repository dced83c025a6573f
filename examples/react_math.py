"""Arithmetic word problems with and without the calculator: prints each trace and the accuracy.

    .venv/bin/python examples/react_math.py [--url http://127.0.0.1:8000] [--limit N]
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from common import connect, parser, show

QUESTIONS = Path(__file__).resolve().parent / "data" / "math_questions.json"


def number_in(reply: str | None) -> float | None:
    found = re.findall(r"-?\d[\d,]*\.?\d*", reply or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


def main() -> int:
    p = parser(__doc__ or "")
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    items = json.loads(QUESTIONS.read_text())[: args.limit]
    c = connect(args)
    scores, invented, accepted = {}, {}, {}
    for mode, tools in (("with calculator", ["calculator"]), ("without tools", [])):
        right = invented[mode] = accepted[mode] = 0
        print(f"\n===== {mode} =====")
        for item in items:
            s = c.create_session(tools=tools, max_tokens=96)
            print(f"\nQ: {item['question']}  (expected {item['answer']})")
            done = show(c.stream_message(s, item["question"], step_format=args.format), args.quiet)
            invented[mode] += done.data["model_observations"] > 0
            accepted[mode] += done.data["accepted_observations"] > 0
            got = number_in(done.data.get("reply"))
            ok = got is not None and abs(got - item["answer"]) < 1e-6
            right += ok
            print(f"  -> {'RIGHT' if ok else 'WRONG'} (read {got})")
            c.close_session(s)
        scores[mode] = right
    for mode, right in scores.items():
        print(f"accuracy {mode}: {right}/{len(items)}; replies where the model began an observation itself: "
              f"{invented[mode]}/{len(items)}, where it went on to write one: {accepted[mode]}/{len(items)}")
    c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
