"""A tool's own worker, which a hung or crashed call cannot take down for good.

Executors run blocking work (diffusion, speech, game engines) off the event loop. With a plain
`ThreadPoolExecutor(max_workers=1)` one call that hangs holds the only thread forever: every later call
queues behind it and times out too, and the interpreter cannot exit (its threads are joined at exit). A
`WorkerPool` replaces its worker instead:

* a call abandoned while it runs (its timeout passed, or its session went away): a thread worker is
  retired (a daemon thread; it ends by itself when the call returns, and is never given more work), a
  process worker is killed; the next call gets a fresh worker at once;
* a worker that dies under a call (a thread ended by `SystemExit`, a process that exited or crashed):
  the call fails with `WorkerCrashed` and the next call gets a fresh worker.

`on_replace` lets the executor drop state the old worker owned (a pipeline that is not thread-safe).
Process workers need picklable functions and start with "spawn" (forking a process that runs vLLM's
threads is unsafe).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from augmentations.base import ToolError

log = logging.getLogger("infercept.tools")


class WorkerCrashed(ToolError):
    """The worker died under the call (the message is the observation; the worker was replaced)."""


class _Thread:
    """One daemon thread that runs jobs in order until it is retired."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]] | None] = queue.SimpleQueue()
        self.retired = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        fut: Future[Any] = Future()
        self.jobs.put((fn, args, fut))
        return fut

    def _run(self) -> None:
        while not self.retired:
            job = self.jobs.get()
            if job is None:
                return
            fn, args, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except Exception as e:
                fut.set_exception(e)
            except BaseException as e:  # SystemExit & co. end this thread: report it as a crash
                fut.set_exception(WorkerCrashed(f"the worker thread ended ({type(e).__name__}: {e})"))
                self.retired = True
                return

    def retire(self) -> None:
        self.retired = True
        self.jobs.put(None)  # wakes an idle thread so it ends


class WorkerPool:
    def __init__(self, name: str, kind: Literal["thread", "process"] = "thread",
                 on_replace: Callable[[], None] | None = None) -> None:
        self.name, self.kind, self.on_replace = name, kind, on_replace
        self.replaced = 0  # workers replaced after a hang or a crash
        self._worker: _Thread | ProcessPoolExecutor | None = None
        # One call in the worker at a time: later calls wait here, where waiting is cancellable, so a
        # call is either running in the worker or not in it at all.
        self._lock = asyncio.Lock()

    def _current(self) -> _Thread | ProcessPoolExecutor:
        if self._worker is None:
            if self.kind == "thread":
                self._worker = _Thread(f"{self.name}-worker")
            else:
                self._worker = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._worker

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._lock:
            return await self._run_one(fn, args)

    async def _run_one(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        worker = self._current()
        if isinstance(worker, _Thread):
            if worker.retired:  # it crashed under an earlier call
                self._replace(worker, "crashed")
                worker = self._current()
            cfut = worker.submit(fn, args)
        else:
            try:
                cfut = worker.submit(fn, *args)
            except BrokenProcessPool:
                self._replace(worker, "crashed")
                worker = self._current()
                cfut = worker.submit(fn, *args)
        try:
            return await asyncio.wrap_future(cfut)
        except BrokenProcessPool as e:
            self._replace(worker, "crashed")
            raise WorkerCrashed(f"the {self.name} worker process died under the call ({e}); it was replaced") from e
        except WorkerCrashed:
            self._replace(worker, "crashed")
            raise
        except asyncio.CancelledError:
            if not cfut.cancel():  # already running: the worker is stuck with a call nobody waits for
                self._replace(worker, "hung")
            raise

    def _replace(self, worker: _Thread | ProcessPoolExecutor, why: str) -> None:
        if worker is not self._worker:
            return
        self._worker = None
        self.replaced += 1
        log.warning("tool worker %s (%s) %s; replaced", self.name, self.kind, why)
        if isinstance(worker, _Thread):
            worker.retire()
        else:
            for proc in pool_processes(worker):
                proc.kill()  # a process can be stopped; a thread cannot
            worker.shutdown(wait=False, cancel_futures=True)
        if self.on_replace is not None:
            self.on_replace()

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if isinstance(worker, _Thread):
            worker.retire()
        elif worker is not None:
            worker.shutdown(wait=False, cancel_futures=True)


__all__ = ["WorkerCrashed", "WorkerPool"]


def pool_processes(pool: ProcessPoolExecutor) -> list[Any]:
    """A process pool's worker processes. `concurrent.futures` has no public handle on them (`shutdown`
    cannot stop a call that is running), so its private `_processes` (pid -> Process) is read here and
    nowhere else."""
    return list((getattr(pool, "_processes", None) or {}).values())
