"""Deadlines of SQLite store calls: every call ends by its deadline, or raises `StoreTimeout`.

A call runs on the connection's thread, behind the calls queued before it, and may wait there
for another connection's write lock (`busy_timeout`). `bounded` keeps both within the call's
deadline:

- on the thread, a call that starts past its deadline, or that its caller gave up on, does
  nothing and raises `StoreTimeout`; one that starts in time waits for a lock at most until its
  deadline (the connection's `busy_timeout` is lowered for it), and a lock still taken then is
  `StoreTimeout` (for an append: rolled back, nothing written);
- on the event loop, a call still queued at its deadline is given up (it will do nothing), and
  one still running `LATE_GRACE` after it is answered without waiting longer: `StoreTimeout`
  for a read, `CommitUnknown` for an append (its transaction may yet commit; a reader of the run
  settles it, as `CommandHandler` does).

SQLite has no statement timeout of its own; an interrupt (`sqlite3_interrupt`) could stop a
`ROLLBACK` too, so a statement that is running is never interrupted: it is only no longer waited
for. Written by hand because neither SQLite nor the driver bounds a queued call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import aiosqlite

from runfold.kernel import StoreClosed, StoreError, StoreTimeout, StoreUnavailable
from runfold.stores.sqlite.thread import on_thread, result_code

__all__ = ["LATE_GRACE", "Budget", "Ticket", "bounded", "call_on_thread", "call_timeout"]

T = TypeVar("T")

LATE_GRACE = 0.5
"""Seconds past its deadline a call that had started is still waited for."""

_override: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "runfold_sqlite_call_timeout", default=None
)
_LOCK_WAIT = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_CLOSED = frozenset({"no active connection", "Connection closed"})
"""What aiosqlite's `ValueError` says of a connection that is closed."""
_QUEUED, _RUNNING, _ABANDONED = 0, 1, 2


@contextlib.contextmanager
def call_timeout(seconds: float) -> Iterator[None]:
    """Calls made in this block (by this task and those it starts) have `seconds` each."""
    if not seconds > 0:
        raise ValueError("a call timeout must be a positive number of seconds")
    token = _override.set(seconds)
    try:
        yield
    finally:
        _override.reset(token)


class Budget:
    """A store's deadlines: its default `seconds` per call, and its lock wait (`busy_ms`)."""

    __slots__ = ("busy_ms", "current_ms", "seconds")

    def __init__(self, seconds: float, busy_ms: int) -> None:
        self.seconds = seconds
        self.busy_ms = busy_ms
        self.current_ms = busy_ms
        """The connection's `busy_timeout` now (read and set on its thread only)."""

    def deadline(self) -> float:
        """The `time.monotonic()` by which a call starting now must end."""
        override = _override.get()
        return time.monotonic() + (self.seconds if override is None else override)


class Ticket:
    """One call's deadline, and whether the thread started it or its caller gave it up."""

    __slots__ = ("at", "lock", "state")

    def __init__(self, at: float) -> None:
        self.at = at
        self.lock = threading.Lock()
        self.state = _QUEUED

    def start(self) -> bool:
        """On the thread: take the call on, unless its caller gave it up."""
        with self.lock:
            if self.state == _ABANDONED:
                return False
            self.state = _RUNNING
            return True

    def give_up(self) -> bool:
        """On the loop: give the call up if the thread has not started it (then it never will)."""
        with self.lock:
            if self.state == _QUEUED:
                self.state = _ABANDONED
                return True
            return False


def on_deadline(
    conn: sqlite3.Connection,
    budget: Budget,
    ticket: Ticket,
    what: str,
    fn: Callable[..., T],
    *args: Any,
) -> T:
    """On the connection thread: `fn(conn, *args)`, its lock waits ending by `ticket.at`."""
    if not ticket.start():
        raise StoreTimeout(f"SQLite: {what} was given up before it started (its deadline passed)")
    left_ms = int((ticket.at - time.monotonic()) * 1000)
    if left_ms <= 0:
        raise StoreTimeout(f"SQLite: {what} did not start by its deadline")
    wait_ms = min(budget.busy_ms, left_ms)
    if wait_ms != budget.current_ms:
        conn.execute(f"PRAGMA busy_timeout = {wait_ms:d}")
        budget.current_ms = wait_ms
    try:
        return fn(conn, *args)
    except sqlite3.OperationalError as exc:
        if result_code(exc) in _LOCK_WAIT and wait_ms < budget.busy_ms:
            # The lock was waited for until the deadline, not for the whole busy_timeout.
            raise StoreTimeout(
                f"SQLite: {what} found the file's write lock taken until its deadline: {exc}"
            ) from None
        raise


async def bounded(
    run: Callable[[Ticket], Awaitable[T]],
    ticket: Ticket,
    what: str,
    *,
    late: Callable[[str], Exception] | None = None,
) -> T:
    """`await run(ticket)` (a call queued to the thread with `ticket`), ended by its deadline.

    Past `ticket.at` a call still queued is given up (`StoreTimeout`); one running is waited for
    `LATE_GRACE` more, then answered `StoreTimeout`, or `late(reason)` (a write's
    `CommitUnknown`).
    """
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    cancelling = task.cancelling()
    struck: list[str] = []
    timers: list[asyncio.TimerHandle] = []

    def expire() -> None:
        if ticket.give_up():
            struck.append("queued")
            task.cancel()
        elif not struck:
            struck.append("running")
            timers.append(loop.call_later(LATE_GRACE, expire))
        else:
            struck.append("late")
            task.cancel()

    timers.append(loop.call_later(max(ticket.at - time.monotonic(), 0.0), expire))
    try:
        return await run(ticket)
    except asyncio.CancelledError:
        if struck and struck[-1] in ("queued", "late") and task.uncancel() <= cancelling:
            if struck[-1] == "queued":
                raise StoreTimeout(
                    f"SQLite: {what} waited for the calls before it past its deadline; "
                    "it was not made"
                ) from None
            reason = f"SQLite: {what} was still running past its deadline"
            if late is not None:
                raise late(reason) from None
            raise StoreTimeout(f"{reason}; it was not waited for") from None
        raise
    finally:
        timers[-1].cancel()


async def call_on_thread(
    db: aiosqlite.Connection,
    budget: Budget,
    location: str,
    fn: Callable[..., T],
    *args: Any,
    deadline: float | None = None,
    late: Callable[[str], Exception] | None = None,
) -> T:
    """`fn(connection, *args)` on `db`'s thread by `deadline` (`bounded`), its errors runfold's.

    `deadline` is a `time.monotonic()`, by default the budget's from now.
    """
    ticket = Ticket(budget.deadline() if deadline is None else deadline)
    what = f"the call {getattr(fn, '__name__', 'to the file')}"

    def queued(ticket: Ticket) -> Awaitable[T]:
        return on_thread(db, on_deadline, budget, ticket, what, fn, *args)

    try:
        return await bounded(queued, ticket, what, late=late)
    except sqlite3.OperationalError as exc:
        raise StoreUnavailable(f"SQLite store {location!r}: {exc}") from None
    except ValueError as exc:
        if str(exc) in _CLOSED:
            raise StoreClosed(f"the SQLite store {location!r} is closed: {exc}") from None
        # Not a closed store (a text the driver cannot bind, say): never taken for one.
        raise StoreError(f"SQLite store {location!r}: {exc!r}") from exc
