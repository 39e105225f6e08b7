"""Run signals: the optional store capability of waking a process when there is news for it.

Two waits, for the two processes of a fleet that would otherwise poll:

- a worker waits for **work**: an append left a live run without an owner (a queued start, a
  run released as it began to wait, a delivery to a waiting run);
- a process waiting for a result waits for **a run's end**.

A signal is a hint, never the truth: a waiter looks at the store once woken, may be woken for
nothing, and still looks now and then without one (a signal can be lost with a connection).
`SignalBoard` is the in-process half every store here uses; `PostgresStore` also passes signals
between processes with `LISTEN`/`NOTIFY` (`runfold.stores.postgres.feed`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from runfold.kernel import LIVE_RUN_STATUSES, RunIndex

__all__ = ["BoardSignals", "RunSignals", "SignalBoard", "Tidings", "tidings_of"]


@runtime_checkable
class RunSignals(Protocol):
    """The optional store capability of waking waiters on news: work for a fleet, a run's end.

    Offered by all three stores: within a process on each, across processes on PostgreSQL.
    """

    async def wait_for_work(self, timeout: float) -> bool:
        """True soon after an append leaves a live run without an owner.

        False after `timeout` seconds without one. May return True for nothing.
        """
        ...

    async def wait_for_end(self, run_id: str, timeout: float) -> bool:
        """True soon after an append ends run `run_id`; False after `timeout` s without one.

        May return True for nothing (the run may not have ended).

        The wait counts from the call, before its first suspension: a caller may start it as a
        task, read the run, and then await it, missing no end in between.
        """
        ...


class Tidings:
    """What appends told since the last signal: work for the fleet, and the runs that ended."""

    __slots__ = ("ended", "work")

    def __init__(self, work: bool = False, ended: Iterable[str] = ()) -> None:
        self.work = work
        self.ended: set[str] = set(ended)

    def add(self, other: Tidings) -> None:
        """Fold `other` in."""
        self.work = self.work or other.work
        self.ended |= other.ended

    def __bool__(self) -> bool:
        return self.work or bool(self.ended)


_WORK = Tidings(work=True)
_NOTHING = Tidings()
"""The tidings of most appends, shared (read only): no allocation on the append path."""


def tidings_of(index: RunIndex) -> Tidings:
    """What an append that wrote `index` tells waiters: the kernel's projection says it all.

    The result is read, never changed (it may be shared).
    """
    summary = index.summary
    if summary.status in LIVE_RUN_STATUSES:
        return _WORK if summary.owner_id is None else _NOTHING
    return Tidings(ended=(summary.run_id,))


class SignalBoard:
    """The waiters of one store in this process, woken by `post` (`RunSignals`' in-process half).

    Used from the event loop only: a waiter is a future of the running loop.
    """

    def __init__(self) -> None:
        self._work: set[asyncio.Future[None]] = set()
        self._work_unseen = False  # work posted while nobody waited: the next wait sees it
        self._ends: dict[str, set[asyncio.Future[None]]] = {}

    def post(self, tidings: Tidings, *, every_end: bool = False) -> None:
        """Wake the waiters `tidings` concern (with `every_end`, every waiter for an end)."""
        if tidings.work:
            self._work_unseen = not self._work
            _wake(self._work)
        ended = list(self._ends) if every_end else tidings.ended
        for run_id in ended:
            waiters = self._ends.get(run_id)
            if waiters:
                _wake(waiters)

    def wake_all(self) -> None:
        """Wake every waiter (the store closes, or signals may have been missed)."""
        _wake(self._work)
        for waiters in self._ends.values():
            _wake(waiters)

    async def wait_for_work(self, timeout: float) -> bool:
        """`RunSignals.wait_for_work`, within this process.

        True at once for work posted since the last wait ended: a worker between two waits
        misses nothing.
        """
        if self._work_unseen:
            self._work_unseen = False
            return True
        return await _wait(self._work, timeout)

    async def wait_for_end(self, run_id: str, timeout: float) -> bool:
        """`RunSignals.wait_for_end`, within this process."""
        waiters = self._ends.setdefault(run_id, set())
        try:
            return await _wait(waiters, timeout)
        finally:
            if not waiters:
                self._ends.pop(run_id, None)


def _wake(waiters: set[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
    waiters.clear()


async def _wait(waiters: set[asyncio.Future[None]], timeout: float) -> bool:
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters.add(waiter)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter), max(timeout, 0.0))
        return waiter.done()
    finally:
        waiters.discard(waiter)


class BoardSignals:
    """`RunSignals` through a store's `SignalBoard` (`_signals`): the in-process stores' half."""

    _signals: SignalBoard

    def _post(self, index: RunIndex) -> None:
        """Wake the waiters an append that wrote `index` concerns."""
        self._signals.post(tidings_of(index))

    async def wait_for_work(self, timeout: float) -> bool:
        """`RunSignals.wait_for_work` (woken by appends of this process)."""
        return await self._signals.wait_for_work(timeout)

    async def wait_for_end(self, run_id: str, timeout: float) -> bool:
        """`RunSignals.wait_for_end` (woken by appends of this process)."""
        return await self._signals.wait_for_end(run_id, timeout)
