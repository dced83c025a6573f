"""A tool's worker after a hang or a crash: replaced, and the next call runs on a fresh one."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from augmentations.workers import WorkerCrashed, WorkerPool
from tests.waiting import wait_until


def _thread() -> threading.Thread:
    return threading.current_thread()  # the object itself: thread idents are reused once a thread ends


STARTED = threading.Event()  # set by a _block call once it runs (the test that waits for it clears it first)


def _block(event: threading.Event) -> str:
    STARTED.set()
    event.wait(30)
    return "late"


def _exit_thread() -> None:
    raise SystemExit(3)


def _pid() -> int:
    return os.getpid()


def _die() -> None:
    os._exit(7)


async def test_a_hung_call_does_not_block_the_next_one() -> None:
    pool = WorkerPool("t")
    release = threading.Event()
    first = await pool.run(_thread)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.run(_block, release), 0.2)
    assert pool.replaced == 1
    # The stuck thread still holds its call; the next call runs on a new thread all the same.
    second = await pool.run(_thread)
    assert second is not first and second.name == "t-worker" and first.is_alive()
    release.set()
    pool.close()


async def test_a_queued_call_that_is_cancelled_does_not_replace_the_worker() -> None:
    pool = WorkerPool("q")
    release = threading.Event()
    STARTED.clear()
    running = asyncio.ensure_future(pool.run(_block, release))
    await wait_until(STARTED.is_set, 10, "the first call to start on the worker")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.run(_thread), 0.1)  # waited behind the running call, never started
    assert pool.replaced == 0
    release.set()
    assert await running == "late"
    pool.close()


async def test_a_thread_that_dies_is_replaced() -> None:
    pool = WorkerPool("d")
    before = await pool.run(_thread)
    with pytest.raises(WorkerCrashed, match="SystemExit"):
        await pool.run(_exit_thread)
    assert pool.replaced == 1
    after = await pool.run(_thread)
    assert after is not before and not before.is_alive()
    pool.close()


async def test_a_process_that_dies_is_replaced() -> None:
    pool = WorkerPool("p", kind="process")
    first = await pool.run(_pid)
    with pytest.raises(WorkerCrashed, match="died under the call"):
        await pool.run(_die)
    assert pool.replaced == 1
    second = await pool.run(_pid)
    assert second != first and second != os.getpid()
    pool.close()
