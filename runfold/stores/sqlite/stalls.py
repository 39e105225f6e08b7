"""`Stalls`: the times this process saw the SQLite file stalled, and the leases they spare.

SQLite lets one connection at a time write the file. A process that stops while it holds the
write lock (SIGSTOP, a VM pause, a disk that hangs in its commit) stalls every other writer, so
no worker can renew its lease until it resumes: every lease that lapses meanwhile lapses through
no fault of its holder, whose renewal is waiting for the lock. Taking such a lease's runs over at
once re-runs the step bodies of live workers.

So lease time does not run while the store is stalled, as far as this process saw it: a call
on the connection (or an inline append) that took `STALL_MIN` or more is a stall, from its
start to its end; a lease that lapsed during one of them, or no later after it than its length,
holds that much longer when this process judges it (`lapsed_by`). A claim's own wait for the
write lock counts as soon as it got the lock. The stalls are wall-clock microseconds, as the
file's times are; a lapse judged on another clock (a test's) meets none of them.

What it may cost: a lapsed lease's runs taken over a stall's length later, and only when the
lease lapsed during (or just after) a stall this process saw; a process that was itself paused
sees its pause as a stall, and is only slower to take runs over for it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["STALL_MIN", "Stalls"]

T = TypeVar("T")

STALL_MIN = 0.5
"""Seconds a call must take to be a stall.

SQLite's transactions take milliseconds (a loaded machine's lock waits, tenths of a second), and
a lease renewed every third of its duration lapses only after a stall of two thirds of it.
"""
_KEPT = 32
"""How many of the latest stalls a process remembers."""


class Stalls:
    """The latest stalls this process saw, as (start, end) wall-clock microseconds."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        # Appended from the connection thread and the event loop: a deque's append is atomic.
        self._seen: collections.deque[tuple[int, int]] = collections.deque(maxlen=_KEPT)

    def took(self, since: float) -> float:
        """Note a call that began at monotonic `since` and ends now; the seconds it took."""
        took = time.monotonic() - since
        if took >= STALL_MIN:
            end = time.time_ns() // 1000
            self._seen.append((end - int(took * 1_000_000), end))
        return took

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

    def __bool__(self) -> bool:
        return bool(self._seen)

    def lapsed_by(self, lease_until: int, now: int) -> bool:
        """Whether a lease until `lease_until` lapsed by `now`, the stalls it lapsed in spared.

        It is spared the time those stalls cover, counted once where they overlap (a claim's
        wait for the lock is a stall, and so is the whole call it is part of).
        """
        if lease_until > now:
            return False
        spared, reach = 0, None
        for start, end in sorted(self._seen):
            if not start < lease_until <= end + (end - start):
                continue
            if reach is None or start > reach:
                spared += end - start
            elif end > reach:
                spared += end - reach
            reach = end if reach is None else max(reach, end)
        return lease_until + spared <= now
