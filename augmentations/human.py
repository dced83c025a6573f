"""`human` (type chat): `AskHuman[question]` asks the person at the other end of the session.

The call pauses the session until the human's next message, which becomes the observation. The
gateway owns the channel to the human: it passes `ctx.extra["ask_human"]`, an async function that
delivers the question and returns the answer. Without one (a batch job, a benchmark) the call fails
with an observation saying so, and the model goes on.

(The other chat intercept, the end of each assistant turn, needs no executor: the engine pauses the
session as type `chat` until the next message.)
"""

from __future__ import annotations

from augmentations.base import CallContext, ToolError, ToolResult


class AskHuman:
    name = "AskHuman"
    aug_type = "chat"
    description = "ask the user a question and wait for the answer; the argument is the question"

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        ask = ctx.extra.get("ask_human")
        if ask is None:
            raise ToolError("no human is attached to this session")
        question = args.strip()
        if not question:
            raise ToolError("AskHuman needs a question")
        answer = await ask(question)
        return ToolResult(str(answer))

    async def close(self) -> None:
        return None
