"""`StepThreads`: the threads a Flow runs plain `def` step bodies in, with a lean hand-off.

A body goes to a thread through a queue and its outcome back to the loop through one
`call_soon_threadsafe` that settles an asyncio future: no `concurrent.futures.Future` between
them, whose locks, callbacks and chained future cost as much CPU per step as the rest of the
hand-off. As in a `ThreadPoolExecutor`: at most `size` threads, started as they are needed; a
body whose awaiting task was cancelled before it began is not run; and the interpreter, when it
exits, lets the bodies running and queued finish (after the main thread, before other threads
are joined).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["StepThreads"]

T = TypeVar("T")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]
_RUNNING: weakref.WeakSet[StepThreads] = weakref.WeakSet()
"""The pools of this process, stopped at its exit."""


def _stop_all() -> None:
    """Let every pool's queued bodies finish, and end its threads (at interpreter exit)."""
    for pool in list(_RUNNING):
        pool.shutdown()


# Where `concurrent.futures` registers its own: before the interpreter joins other threads.
_at_exit: Callable[[Callable[[], None]], object] = getattr(
    threading, "_register_atexit", atexit.register
)
_at_exit(_stop_all)


class StepThreads:
    """Up to `size` threads running callables for an event loop (see the module)."""

    def __init__(self, size: int, *, name: str) -> None:
        if size < 1:
            raise ValueError("a pool needs at least one thread")
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by each thread that waits for a job
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        _RUNNING.add(self)

    def run(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """`call()`'s result (or exception), computed in one of the threads."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, call))
        if not self._idle.acquire(blocking=False):
            self._grow()
        return future

    def _grow(self) -> None:
        with self._lock:
            if len(self._threads) >= self._size:
                return
            thread = threading.Thread(
                target=self._work,
                name=f"{self._name}_{len(self._threads)}",
                daemon=True,  # stopped by `_stop_all`, after its queued bodies ran
            )
            self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                jobs.put(None)  # the others stop too
                return
            loop, future, call = job
            if not future.cancelled():
                try:
                    outcome: tuple[bool, Any] = (False, call())
                except BaseException as exc:
                    outcome = (True, exc)
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_settle, future, outcome)
            del job, loop, future, call
            self._idle.release()

    def shutdown(self) -> None:
        """Run what is queued, then end the threads (waiting for them)."""
        self._jobs.put(None)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.cancelled():
        return
    raised, value = outcome
    if raised:
        future.set_exception(value)
    else:
        future.set_result(value)
