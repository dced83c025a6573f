"""Waiting in tests: a condition polled until a deadline, never a bare sleep standing in for
synchronization and never a loop without an end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(cond: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.01) -> None:
    """Return once `cond()` is true; fail the test naming `what` if it is not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(every_s)
