"""`Lease`: what a worker of a fleet holds, and how long it may still act on it.

A worker holds one lease in the store (`WorkerLeases.renew_lease`), renewed while it lives, and
owns runs through their histories (`ClaimRun`). Before each append on a run it owns, the engine
asks the lease whether it still `holds`: judged by this process's monotonic clock, from the
moment the last renewal was sent, so a process that was paused (SIGSTOP, a long GC, a laptop
lid) past its lease knows it on waking, before it writes anything, even though the store would
also fence it (`OwnershipLost`) once another worker took its runs over. While a renewal is on
its way to the store, an append that finds the lease lapsed waits for it (`settled`): a store
that was busy (a SQLite file whose write lock a stopped process held) takes it late, and the
worker, renewing again at once, holds the lease again by its own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

__all__ = ["DEFAULT_LEASE", "Lease", "new_worker_id"]

DEFAULT_LEASE = timedelta(seconds=15)
"""How long a worker's lease holds without a renewal.

A worker renews it every third of that, and another worker takes its runs over once it lapsed
(so within about twice this after a worker dies)."""


def new_worker_id(prefix: str | None = None) -> str:
    """A worker id unique to this process: `prefix` (default: the host name), pid, random."""
    head = prefix if prefix else socket.gethostname() or "worker"
    return f"{head}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """A worker's lease as this process sees it: its worker id and until when it holds.

    Args:
        worker_id: The worker's id in the store; ids are never reused after a lapse.
        duration: How long the lease holds after each renewal.
    """

    __slots__ = ("_renewing", "_until", "duration", "worker_id")

    def __init__(self, worker_id: str, duration: timedelta = DEFAULT_LEASE) -> None:
        if duration <= timedelta(0):
            raise ValueError("a lease's duration must be positive")
        self.worker_id = worker_id
        self.duration = duration
        self._until = float("-inf")
        self._renewing: asyncio.Event | None = None  # set once the renewal on its way is done

    def holds(self, margin: float = 0.0) -> bool:
        """Whether the lease holds by this process's clock (the last renewal + duration).

        With `margin`, whether it holds for that many seconds more.
        """
        return time.monotonic() + margin < self._until

    def renewed(self, sent_at: float) -> None:
        """The store took a renewal sent at monotonic time `sent_at`."""
        self._until = max(self._until, sent_at + self.duration.total_seconds())

    @contextlib.contextmanager
    def renewing(self) -> Iterator[None]:
        """A renewal is on its way to the store while in the block (`settled` waits for it)."""
        done = self._renewing = asyncio.Event()
        try:
            yield
        finally:
            self._renewing = None
            done.set()

    async def settled(self) -> None:
        """Return once the lease holds, or no renewal is on its way that could make it hold."""
        while not self.holds() and self._renewing is not None:
            await self._renewing.wait()

    def lapse(self, new_worker_id: str) -> None:
        """The lease lapsed: it holds no more, and the worker goes on under a new id."""
        self._until = float("-inf")
        self.worker_id = new_worker_id
