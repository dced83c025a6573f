"""Waiting in tests: on an event, or on a condition polled up to a deadline; never a bare sleep that
hopes the other side got there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], object], timeout_s: float = 10.0, what: str = "the condition",
                interval_s: float = 0.01) -> None:
    """Return once `condition()` is true; fail, naming `what`, if it is not within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(interval_s)
