"""`Stalls`: the SQLite file's stalls, recorded in it for every process, and the leases they spare.

SQLite lets one connection at a time write the file. A process that stops while it holds the
write lock (SIGSTOP, a VM pause, a disk that hangs in its commit) stalls every other writer, so
no worker can renew its lease until it resumes: every lease that lapses meanwhile lapses through
no fault of its holder, whose renewal is waiting for the lock. Taking such a lease's runs over at
once re-runs the step bodies of live workers.

So lease time does not run while the file is stalled, for every process that shares it: a
wait for the write lock of `STALL_MIN` or more is a stall, recorded in the file's `stalls` table
by the write transaction that waited (`Stalls.begin`: a claim or a lease renewal), and every
judgment of a lapse reads that table, so a process started after the stall, which never saw it,
spares the same leases as those that waited through it. A store's own calls that took that long
(its process may have been the one stopped holding the lock) are stalls for its own judgments
only: a process paused outside the lock is no evidence that the file stalled for others. A lease
that lapsed during a stall, or no later after it than its length, holds that much longer. The
stalls are wall-clock microseconds, as the file's times are; a lapse judged on another clock (a
test's) meets none of them.

What it may cost: a lapsed lease's runs taken over a stall's length later, and only when the
lease lapsed during (or just after) a stall; a process that was itself paused sees its pause as
a stall, and is only slower to take runs over for it.
PostgreSQL has no such stall: its writers lock rows, not the database, so a stopped holder
blocks only the rows it wrote, never another worker's lease.
"""

from __future__ import annotations

import collections
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["STALL_MIN", "Stalls", "lapsed_by"]

T = TypeVar("T")

STALL_MIN = 0.5
"""Seconds a call must take to be a stall.

SQLite's transactions take milliseconds (a loaded machine's lock waits, tenths of a second), and
a lease renewed every third of its duration lapses only after a stall of two thirds of it.
"""
STALLS_KEPT = 3600 * 1_000_000
"""Microseconds a recorded stall is kept past the end of the time it spares.

A lease that lapsed in a stall an hour old was spared long ago: its record serves no judgment.
"""
_KEPT = 32
"""How many of its latest long calls, and of its lock waits not recorded yet, a store keeps."""

_RECORD = "INSERT OR IGNORE INTO stalls (ended_at, started_at) VALUES (?, ?)"
_PRUNE = "DELETE FROM stalls WHERE 2 * ended_at - started_at < ?"
_NEAR = (
    "SELECT started_at, ended_at FROM stalls "
    "WHERE started_at < ?1 AND 2 * ended_at - started_at >= ?1"
)
"""The stalls a lease until `?1` lapsed in, or no later after than their length."""


class Stalls:
    """The stalls one store saw: its own long calls, and its lock waits still to record."""

    __slots__ = ("_pending", "_seen")

    def __init__(self) -> None:
        # Appended from the connection thread and the event loop: a deque's append and popleft
        # are atomic.
        self._seen: collections.deque[tuple[int, int]] = collections.deque(maxlen=_KEPT)
        self._pending: collections.deque[tuple[int, int]] = collections.deque(maxlen=_KEPT)

    def took(self, since: float) -> tuple[int, int] | None:
        """Note a call that began at monotonic `since` and ends now; the stall it was, if any."""
        took = time.monotonic() - since
        if took < STALL_MIN:
            return None
        end = time.time_ns() // 1000
        stall = (end - int(took * 1_000_000), end)
        self._seen.append(stall)
        return stall

    def timed(self, fn: Callable[..., T]) -> Callable[..., T]:
        """`fn`, noting the call as a stall when it takes `STALL_MIN` or more."""

        def call(*args: Any) -> T:
            since = time.monotonic()
            try:
                return fn(*args)
            finally:
                self.took(since)

        call.__name__ = getattr(fn, "__name__", "call")
        return call

    def begin(self, conn: sqlite3.Connection) -> None:
        """`BEGIN IMMEDIATE`, recording in the transaction a long wait for the lock it made.

        A wait that ends in an error (the lock still taken at the busy timeout) is recorded by
        the next transaction that begins here; a transaction that rolls back (a claim or a
        renewal that failed) loses the waits it recorded.
        """
        since = time.monotonic()
        try:
            conn.execute("BEGIN IMMEDIATE")
        finally:
            waited = self.took(since)
            if waited is not None:
                self._pending.append(waited)
        if self._pending:
            waits = []
            while self._pending:
                waits.append(self._pending.popleft())
            conn.executemany(_RECORD, [(end, start) for start, end in waits])
            conn.execute(_PRUNE, (waits[-1][1] - STALLS_KEPT,))

    def any(self, conn: sqlite3.Connection) -> bool:
        """Whether any stall may spare a lease: one this store saw, or one the file records."""
        if self._seen:
            return True
        return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM stalls)").fetchone()[0])

    def lapsed(self, conn: sqlite3.Connection, lease_until: int | None, now: int) -> bool:
        """Whether an owner's lease until `lease_until` (None: it has none) lapsed by `now`.

        The lease is spared the stalls it lapsed in: those the file records, and those of this
        store's own calls.
        """
        if lease_until is None:
            return True
        recorded = conn.execute(_NEAR, (lease_until,)).fetchall()
        return lapsed_by(lease_until, now, [*recorded, *self._seen])


def lapsed_by(lease_until: int, now: int, stalls: Iterable[tuple[int, int]]) -> bool:
    """Whether a lease until `lease_until` lapsed by `now`, the `stalls` it lapsed in spared.

    It is spared the time those stalls cover, counted once where they overlap (several processes
    record the same stall, each as long as it waited).
    """
    if lease_until > now:
        return False
    spared, reach = 0, None
    for start, end in sorted(stalls):
        if not start < lease_until <= end + (end - start):
            continue
        if reach is None or start > reach:
            spared += end - start
        elif end > reach:
            spared += end - reach
        reach = end if reach is None else max(reach, end)
    return lease_until + spared <= now
