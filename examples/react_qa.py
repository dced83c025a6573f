"""Questions answered with Wikipedia retrieval (the offline corpus by default), some needing two
lookups. Prints each trace and the accuracy (an answer counts when it contains the expected words).

    .venv/bin/python examples/react_qa.py [--url http://127.0.0.1:8000] [--limit N]
"""

from __future__ import annotations

import json
from pathlib import Path

from common import connect, parser, show

QUESTIONS = Path(__file__).resolve().parent / "data" / "qa_questions.json"


def main() -> int:
    p = parser(__doc__ or "")
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    items = json.loads(QUESTIONS.read_text())[: args.limit]
    c = connect(args)
    right = invented = accepted = 0
    for item in items:
        s = c.create_session(tools=["wikipedia"], max_tokens=96)
        print(f"\nQ: {item['question']}  (expected {item['answer']!r})")
        done = show(c.stream_message(s, item["question"], step_format=args.format), args.quiet)
        invented += done.data["model_observations"] > 0
        accepted += done.data["accepted_observations"] > 0
        reply = (done.data.get("reply") or "").lower()
        ok = all(w.lower() in reply for w in item["answer"].split())
        right += ok
        print(f"  -> {'RIGHT' if ok else 'WRONG'}")
        c.close_session(s)
    print(f"\naccuracy: {right}/{len(items)}; replies where the model began an observation itself: {invented}/{len(items)}, "
          f"where it went on to write one: {accepted}/{len(items)}")
    c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
