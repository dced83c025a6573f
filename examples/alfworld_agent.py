"""The agent plays an ALFWorld household task (the ALFWorld tool: one game per session, in ALFWorld's
TextWorld-PDDL environment) until it wins or reaches the step limit, printing every action and
observation.

    .venv/bin/python examples/alfworld_agent.py [--url http://127.0.0.1:8000] [--max-steps 30]
"""

from __future__ import annotations

from common import connect, parser, show

from gateway.client import ApiError


def main() -> int:
    p = parser(__doc__ or "")
    p.add_argument("--max-steps", type=int, default=30, help="game actions before giving up")
    args = p.parse_args()
    c = connect(args)
    s = c.create_session(tools=["alfworld"], max_tokens=64)
    steps, won, message = 0, False, "Play the household task until you win. Start by looking around."
    while steps < args.max_steps and not won:
        try:
            # Each message forces one game action (tool_choice); the model may chain more itself.
            done = show(c.stream_message(s, message, tool_choice={"name": "ALFWorld"}), args.quiet)
        except ApiError as e:
            if e.status == 413:
                print(f"\nthe context is full ({e.message}); stopping")
                break
            raise
        info = c.get_session(s)
        calls = [x for x in info["calls"] if x["tool"] == "ALFWorld"]
        won = any("You won!" in (x["result"] or "") for x in calls)
        new_steps = len(calls) - steps
        steps = len(calls)
        if done.name == "error" or new_steps == 0:
            message = "Use the ALFWorld tool: write Action: ALFWorld[a command]."
        else:
            message = "Choose the next command from the list to reach the goal."
    print(f"\nresult: {'WON' if won else 'not won'} after {steps} game actions")
    stats = c.get_session(s)["intercepts"]
    by_policy: dict[str, int] = {}
    for i in stats:
        by_policy[f"{i['type']}/{i['policy']}"] = by_policy.get(f"{i['type']}/{i['policy']}", 0) + 1
    print(f"intercepts by type/policy: {by_policy}")
    c.close_session(s)
    c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
