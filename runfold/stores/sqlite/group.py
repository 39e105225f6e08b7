"""SQLite's group commit: appends made while one is being written share the next transaction.

While a transaction of appends is in flight, appends wait in a queue, and a writer task writes
them together in the next one on the driver's thread, each with its own outcome. Appends that
find none in flight are written on the event loop's own thread, through the inline connection
(`inline`), when nothing else is ready to run there meanwhile: alone, or several made at the same
moment (concurrent runs woken together by the last commit). The event loop would only wait for
the driver's thread then, and the hand-offs to it and back cost about as much as the commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from runfold.kernel import CommitUnknown, Envelope, Event, RunIndex, StoreClosed
from runfold.stores.sqlite.deadline import Budget
from runfold.stores.sqlite.inline import append_inline
from runfold.stores.sqlite.known import KnownRuns
from runfold.stores.sqlite.stalls import Stalls
from runfold.stores.sqlite.writer import Append, append_batch, settle

__all__ = ["GroupCommits"]


def _others_ready() -> bool:
    """Whether a callback other than this task's may run before it if it yields now.

    asyncio's own loop runs the callbacks already scheduled (`_ready`) before the one a
    `sleep(0)` schedules, and those that I/O readiness schedules only after it: with none
    scheduled, yielding lets no other append join, and costs a turn of the loop. A loop
    without `_ready` (another implementation) is assumed to have some.
    """
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    return ready is None or bool(ready)


class GroupCommits:
    """The appends of `SQLiteStore` (a mixin: the store sets its fields up in `__init__`)."""

    _budget: Budget
    _closed: bool
    _idle: asyncio.Event
    _inline: sqlite3.Connection | None
    _known: KnownRuns
    _known_inline: KnownRuns
    _path: str
    _queue: list[Append]
    _stalls: Stalls
    _writer: asyncio.Task[None] | None
    _call: Callable[..., Any]  # `SQLiteStore._call`: a function run on the driver's thread
    _post: Callable[[RunIndex], None]  # `BoardSignals._post`: wakes the waiters of an append

    async def _append_if_sequence(
        self,
        run_id: str,
        expected_sequence: int,
        events: Sequence[Event],
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None,
        /,
    ) -> list[Envelope]:
        """Append `events` if the run's head is `expected_sequence`, all or nothing.

        `EventStore.append_if_sequence`, with its errors. Appends made while a transaction is
        in flight are written together in the next one, each with its own outcome; each written
        one wakes the waiters its index rows concern (`_post`) as it is settled.
        """
        if self._closed:
            raise StoreClosed(f"the SQLite store {self._path!r} is closed")
        request = Append(run_id, expected_sequence, events, index, recorded_at, expected_position)
        request.deadline = self._budget.deadline()
        self._queue.append(request)
        if self._idle.is_set():
            self._idle.clear()
            try:
                if _others_ready():
                    await asyncio.sleep(0)  # appends made at this same moment join this one
            except BaseException:
                self._write_queue_or_rest()  # those joined wait for it; this one goes too
                raise
            if self._inline is not None and (len(self._queue) == 1 or not _others_ready()):
                # Alone, or several with nothing else to run while they commit: written here,
                # sparing the hand-offs to and from the driver's thread (the event loop would
                # only wait for them). With the write lock taken, they stay queued for the
                # driver's thread.
                try:
                    self._write_here()
                finally:
                    self._write_queue_or_rest()
                return await request.future
            if len(self._queue) == 1:
                # Alone, without an inline connection: this task hands it to the driver's thread
                # itself, sparing the writer task. If cancelled meanwhile, it leaves; the
                # connection thread still finishes the transaction and runs whatever comes next
                # only after it.
                self._queue = []
                try:
                    written: list[list[Envelope] | BaseException] = await self._call(
                        append_batch,
                        [request],
                        self._known,
                        deadline=request.deadline,
                        late=request.unknown,
                    )
                    (outcome,) = written
                finally:
                    self._write_queue_or_rest()
                if isinstance(outcome, BaseException):
                    raise outcome
                self._post(index)
                return outcome
            self._write_queue_or_rest()
        # A caller that is cancelled leaves (cancelling the future, which `settle` then skips);
        # its append stays in the batch, as if shielded, without a shield's extra future.
        return await request.future

    def _write_here(self) -> None:
        """Write the queued appends through the inline connection, on this thread, and settle
        them; they stay queued (nothing written) if another connection holds the write lock."""
        assert self._inline is not None
        batch = self._queue
        since = time.monotonic()
        try:
            outcomes = append_inline(self._inline, batch, self._path, self._known_inline)
        except BaseException as exc:  # the whole transaction failed: all of it
            self._queue = []
            for request in batch:
                settle(request, exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._stalls.took(since)
        if outcomes is not None:
            self._queue = []
            self._settle(batch, outcomes)

    def _write_queue_or_rest(self) -> None:
        """Start the writer task for the queued appends, or, with none, mark the store idle."""
        if self._queue:
            self._writer = asyncio.create_task(self._write_queued())
        else:
            self._idle.set()

    async def _write_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                outcomes = await self._call(
                    append_batch,
                    batch,
                    self._known,
                    deadline=min(request.deadline for request in batch),
                    late=batch[0].unknown,
                )
            except BaseException as exc:  # the whole transaction failed: all of it
                for request in batch:
                    if isinstance(exc, CommitUnknown):  # each of its own append
                        settle(request, request.unknown(exc.reason))
                    else:
                        settle(request, exc)
                if not isinstance(exc, Exception):
                    self._idle.set()
                    raise
                continue
            self._settle(batch, outcomes)
        self._idle.set()

    def _settle(self, batch: list[Append], outcomes: list[list[Envelope] | BaseException]) -> None:
        """Hand each append of `batch` its outcome, and post each written one's index.

        Posted here rather than by each caller once it resumes: a caller is one coroutine
        frame fewer to resume, and an append written for a caller cancelled meanwhile is
        posted too.
        """
        post = self._post
        for request, outcome in zip(batch, outcomes, strict=True):
            settle(request, outcome)
            if not isinstance(outcome, BaseException):
                post(request.index)
