"""An interactive terminal chat. The session pauses between turns (a chat intercept: the engine keeps,
swaps or frees its KV while you type), and AskHuman questions from the model are answered the same way.

    .venv/bin/python examples/chat.py [--url http://127.0.0.1:8000] [--tools calculator,human]
    .venv/bin/python examples/chat.py --say "Hi" --say "What is 12*12?"     # scripted, no prompt
"""

from __future__ import annotations

from common import connect, parser, show


def main() -> int:
    p = parser(__doc__ or "")
    p.add_argument("--tools", default="calculator,wikipedia,human")
    p.add_argument("--say", action="append", help="send these messages instead of reading the terminal")
    args = p.parse_args()
    c = connect(args)
    s = c.create_session(tools=[t for t in args.tools.split(",") if t], max_tokens=128)
    print(f"session {s.id} with tools {s.tools}; empty line or Ctrl-D ends")
    scripted = list(args.say or [])
    state = "awaiting_user"
    try:
        while True:
            prompt = "you (answering the model)> " if state == "asked" else "you> "
            if args.say is not None:
                if not scripted:
                    break
                line = scripted.pop(0)
                print(prompt + line)
            else:
                try:
                    line = input(prompt)
                except EOFError:
                    break
            if not line.strip():
                break
            done = show(c.stream_message(s, line), args.quiet)
            pending = done.data.get("pending_call") if done.name == "done" else None
            if pending and pending.get("kind") == "human":
                print(f"model asks: {pending['arguments']}  (waiting for you)")
                state = "asked"
            else:
                state = "awaiting_user"
    finally:
        info = c.get_session(s)
        print(f"\n{len(info['intercepts'])} intercepts: " + ", ".join(
            f"{i['type']}:{i['policy']}->{i['restored_by']}" for i in info["intercepts"]))
        c.close_session(s)
        c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
