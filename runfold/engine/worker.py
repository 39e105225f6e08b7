"""`Worker`: one process of a fleet, serving the runs of its engine's workflows from one store.

Many workers (processes, hosts) share a store. Each holds a lease in it (`WorkerLeases`), renewed
every third of its duration, and drives a run only as its owner (`ClaimRun`, fenced by the
kernel). A worker finds its work in three places:

- due wakeups (timers, delayed retries, deadlines) of runs nobody owns: they were released when
  they began to wait;
- orphans: live runs whose owner's lease lapsed (it died, hung or lost the store), taken over with
  a claim that displaces that owner;
- queued runs: created and not started (`Engine.start(..., queued=True)`), owned by nobody;
- what the process itself starts (`Engine.start` claims the new run in its first append).

It finds them in one store call (`DueWork.claim_due`), which holds each run it hands out for
this worker alone until the hold's end, so polling workers do not go for the same run. Each
run is then driven by one task that first claims it in the run's history: the hold is a
reservation, the history the truth; should two workers still meet (a hold that lapsed), the
store's fenced append lets one claim win, and the other is refused (`RunOwned`) and moves on.
So two live workers never drive a run at once, and a worker paused past its lease records
nothing when it wakes (`OwnershipLost`). It goes on under a new worker id, never renewing the
lapsed lease.

Stopping (`stop()`, or SIGTERM/SIGINT with `install_signal_handlers`): the worker claims nothing
more, lets its drives finish within a grace period, cancels the rest, and drops its lease, so the
runs it still owns are orphans at once and another worker takes them over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta

import attrs

from runfold.engine.engine import Engine
from runfold.engine.errors import RunDefinitionConflict
from runfold.engine.lease import DEFAULT_LEASE, Lease, new_worker_id
from runfold.engine.schedule import Schedule
from runfold.engine.versions import VersionFilter
from runfold.kernel import (
    OwnershipLost,
    RunOwned,
    StoreClosed,
    StoreUnavailable,
    TerminalState,
)
from runfold.stores.due_work import DueWork, Queue
from runfold.stores.leases import WorkerLeases
from runfold.stores.signals import RunSignals

__all__ = ["Worker", "WorkerCounts"]

_log = logging.getLogger("runfold.worker")
_BATCH = 100
"""How many due wakeups, orphans and queued runs a look by listings asks for."""
_RENEWALS = 3
"""How many renewals in a row a heartbeat makes while each is taken too late to hold until the
next heartbeat."""
_RECANCEL = 0.5
"""Seconds a cancelled task of the worker's may take to end before it is cancelled again."""
_WAKE_SPACING = 0.01
"""Seconds between two looks woken by signals (`RunSignals.wait_for_work`)."""


@attrs.define
class WorkerCounts:
    """What a worker did since it started: runs driven, taken over, lost, and failed drives."""

    drives: int = 0
    takeovers: int = 0
    refused: int = 0
    """Claims another worker won (`RunOwned`), or runs lost while driving (`OwnershipLost`)."""
    failures: int = 0
    """Drives that raised something else (logged with the error)."""
    lapses: int = 0
    """Times the worker's lease lapsed and it went on under a new id."""


class Worker:
    """Serves an engine's workflows as one worker of a fleet sharing the engine's store.

    Args:
        engine: Whose runtime runs the workflows; the worker sets its `lease`.
        worker_id: A prefix of the worker's id (default: the host name); the id adds the pid
            and a random part, since an id is never used again after its lease lapsed.
        lease: How long the lease holds without a renewal (renewed every third of it). Another
            worker takes over this one's runs once it lapsed.
        concurrency: How many runs it drives at once.
        poll_interval: Seconds: the longest it sleeps before looking for work again. It wakes
            earlier for the next due wakeup it knows of, on `wake()`, and, on a store with
            `RunSignals`, soon after an append leaves a live run without an owner (from any
            process on PostgreSQL; from this one on SQLite, whose other processes' work waits
            for the poll).
        grace: Seconds `stop` gives running drives to finish before cancelling them.
        schedules: Workflows to start at each tick of a cron expression, once across the fleet.
        queues: The queues it serves (`Queue`, with their limits): runs started on another
            queue are left to the workers that serve it; runs on no queue are served always.
        versions: Claim only runs whose recorded `workflow_version` is one of these (a
            blue/green deploy; `VersionFilter`); default: every run of the served workflows.
            Such a worker looks for work with the store's listings (orphans, queued runs, due
            wakeups) and filters them, since `claim_due` would hold other versions' runs for
            it; it serves no queue.

    Raises:
        TypeError: The engine's store keeps no worker leases or hands out no due work.
        ValueError: `concurrency` below 1, a non-positive `poll_interval`, empty `versions`,
            or both `versions` and `queues`.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        worker_id: str | None = None,
        lease: timedelta = DEFAULT_LEASE,
        concurrency: int = 16,
        poll_interval: float = 1.0,
        grace: float = 30.0,
        schedules: Sequence[Schedule] = (),
        queues: Sequence[Queue] = (),
        versions: Collection[str] | None = None,
    ) -> None:
        store = engine.handler.store
        if not isinstance(store, WorkerLeases):
            raise TypeError(f"{type(store).__name__} keeps no worker leases: a fleet needs one")
        if concurrency < 1 or not poll_interval > 0 or grace < 0:
            raise ValueError("concurrency must be >= 1, poll_interval > 0 and grace >= 0")
        if versions is not None and queues:
            raise ValueError("a worker serving only some versions serves no queue")
        self.engine = engine
        if not isinstance(store, DueWork):
            raise TypeError(f"{type(store).__name__} hands out no due work: a fleet needs it")
        self.leases: WorkerLeases = store
        self.due: DueWork = store
        self.queues = tuple(queues)
        self.prefix = worker_id
        self.lease = Lease(new_worker_id(worker_id), lease)
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.grace = grace
        self.counts = WorkerCounts()
        self.schedules = tuple(schedules)
        self.versions = None if versions is None else VersionFilter(engine.handler, versions)
        self._ticked: datetime | None = None  # when the ticks were last turned into runs
        self._drives: dict[str, asyncio.Task[None]] = {}
        # Runs handed out while a drive of them was ending: driven again once it ended.
        self._again: dict[str, str | None] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        engine.lease = self.lease

    @property
    def worker_id(self) -> str:
        """The id the worker holds its lease under now."""
        return self.lease.worker_id

    @property
    def driving(self) -> frozenset[str]:
        """The ids of the runs it is driving now."""
        return frozenset(self._drives)

    def wake(self) -> None:
        """Look for work now rather than at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        """Begin a graceful stop: `serve` claims nothing more and returns once it stopped."""
        self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT stop the worker gracefully (call inside the event loop)."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)

    # --- the loop -----------------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve until `stop()`: renew the lease, find work, drive it, and stop gracefully.

        Raises:
            StoreClosed: The store was closed under the worker.
        """
        await self._join()
        self._ticked = self.engine.handler.clock()
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"lease {self.worker_id}")
        store = self.engine.handler.store
        listener = (
            asyncio.create_task(self._wake_on_work(store), name=f"signals {self.worker_id}")
            if isinstance(store, RunSignals)
            else None
        )
        _log.info("worker %s serving %s", self.worker_id, sorted(self.engine.workflow_names))
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    pause = await self._look()
                except StoreUnavailable as exc:
                    _log.warning("worker %s cannot reach the store: %s", self.worker_id, exc)
                    pause = self.poll_interval
                if self._stopping.is_set():
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
        finally:
            await self._wind_down()
            await _cancel(task for task in (heartbeat, listener) if task is not None)
            with contextlib.suppress(StoreUnavailable, StoreClosed):
                await self.leases.drop_lease(self.worker_id)
            _log.info("worker %s stopped: %s", self.worker_id, self.counts)

    async def _wake_on_work(self, signals: RunSignals) -> None:
        """Look for work soon after an append anywhere leaves a live run without an owner (a
        queued start, a released run, a delivery), rather than at the next poll."""
        while True:
            try:
                woken = await signals.wait_for_work(self.poll_interval)
            except (StoreUnavailable, StoreClosed):
                woken = False
                await asyncio.sleep(self.poll_interval)
            if woken:
                self._wake.set()
                # Tidings in a burst make one look: the look finds all their work.
                await asyncio.sleep(_WAKE_SPACING)

    async def _look(self) -> float:
        """Claim what there is room for; the seconds to sleep before looking again."""
        room = self.concurrency - len(self._drives)
        now = self.engine.handler.clock()
        await self._tick(now)
        if room <= 0:
            # Full: nothing can be claimed before a drive ends, and a drive that ends wakes the
            # loop, so the store is not asked for the next wakeup (a query per look saved).
            return self.poll_interval
        if self.versions is None:
            more = await self._claim_due(now, room)
        else:
            more = await self._claim_listed(now, room, self.versions)
        if more:
            # More may be due than there was room for: look again as soon as there is room
            # (at once, unless every slot is taken now; then a drive's end wakes the loop).
            return 0.0 if len(self._drives) < self.concurrency else self.poll_interval
        # Sleep until the next wakeup that is not due yet: what is due now was taken, is being
        # driven here, or waits for room (a drive that ends wakes the loop).
        nxt = await self.engine.next_wakeup()
        pause = self.poll_interval
        if nxt is not None:
            ahead = (nxt.due_at - self.engine.handler.clock()).total_seconds()
            if ahead > 0:
                pause = min(pause, ahead)
        return pause

    async def _claim_due(self, now: datetime, room: int) -> bool:
        """Start what `claim_due` hands out; whether more may be due than there was room for.

        One store call hands out orphans, due wakeups and queued runs, each held for this worker
        alone until the hold's end: the claim appended next rarely races.
        """
        due = await self.due.claim_due(
            self.worker_id,
            now,
            hold_until=now + self.lease.duration,
            limit=room,
            workflow_names=self.engine.workflow_names,
            queues=self.queues,
        )
        for item in due:
            if item.run_id not in self._drives:
                self._start(item.run_id, displacing=item.displacing)
            else:
                # Handed out again while its drive ends: input or a due timer reached the run
                # after that drive last read it, as it let the run go. The store now holds the
                # run for this worker alone, so unless it is driven again once that drive
                # ended, nobody drives it before the hold lapses (a lease's length).
                self._again[item.run_id] = item.displacing
        return len(due) >= room

    async def _claim_listed(self, now: datetime, room: int, versions: VersionFilter) -> bool:
        """Start the runs of `versions` the store's listings show due, in a random order (so
        workers that see one list go for different runs); whether more may be due.

        A worker serving only some versions looks this way: `claim_due` would hold other
        versions' runs for it, and their own workers would wait for the holds to lapse. Racing
        claims are settled by the kernel's fenced append, as always.
        """
        names = self.engine.workflow_names
        store = self.engine.handler.store
        orphans = await self.leases.orphaned_runs(now, limit=_BATCH, workflow_names=names)
        kept = set(await versions.keep([s.run_id for s in orphans]))
        for summary in random.sample(orphans, len(orphans)):
            if room <= 0:
                return True
            run_id, owner = summary.run_id, summary.owner_id
            if run_id in kept and owner is not None and run_id not in self._drives:
                self._start(run_id, displacing=owner)
                room -= 1
        for workflow_name in sorted(names):
            page = await store.list_runs(
                workflow_name=workflow_name, status="pending", limit=_BATCH
            )
            queued = await versions.keep(
                [s.run_id for s in page.items if s.owner_id is None and s.queue_name is None]
            )
            for run_id in random.sample(queued, len(queued)):
                if room <= 0:
                    return True
                if run_id not in self._drives:
                    self._start(run_id)
                    room -= 1
        due = await store.due_wakeups(now, limit=_BATCH, workflow_names=names)
        runs = await versions.keep(list(dict.fromkeys(w.run_id for w in due)))
        for run_id in random.sample(runs, len(runs)):
            if room <= 0:
                return True
            if run_id not in self._drives:
                self._start(run_id)
                room -= 1
        return bool(runs) and len(due) >= _BATCH and room > 0

    async def _tick(self, now: datetime) -> None:
        """Record a queued run for each tick of each schedule since the last look.

        The ticks count as turned into runs only once every run is recorded: a store that
        could not be reached leaves them all to the next look (a tick's run is made once
        however often it is started), or a tick would be passed over while the worker lives.
        """
        after = self._ticked
        if after is None:
            self._ticked = now
            return
        try:
            for schedule in self.schedules:
                for tick in schedule.ticks(after, now):
                    try:
                        await self.engine.start(
                            schedule.workflow_name,
                            schedule.input_for(tick),
                            run_id=schedule.run_id(tick),
                            queued=True,
                        )
                    except RunDefinitionConflict as exc:  # the id holds a run of other input
                        _log.error("schedule of %r: %s", schedule.workflow_name, exc)
        except StoreUnavailable as exc:
            _log.warning("worker %s could not record a tick's run: %s", self.worker_id, exc)
            return
        self._ticked = now

    def _start(self, run_id: str, *, displacing: str | None = None) -> None:
        task = asyncio.create_task(self._drive(run_id, displacing), name=f"drive {run_id}")
        self._drives[run_id] = task

    async def _drive(self, run_id: str, displacing: str | None) -> None:
        try:
            await self.engine.drive(run_id, displacing=displacing)
            self.counts.drives += 1
            if displacing is not None:
                self.counts.takeovers += 1
                _log.info("worker %s took run %r over from %s", self.worker_id, run_id, displacing)
        except (RunOwned, OwnershipLost, TerminalState) as exc:
            self.counts.refused += 1
            _log.debug("worker %s left run %r: %s", self.worker_id, run_id, exc)
        except Exception as exc:
            self.counts.failures += 1
            _log.warning("worker %s: driving run %r failed: %r", self.worker_id, run_id, exc)
        finally:
            self._drives.pop(run_id, None)
            if run_id in self._again and not self._stopping.is_set():
                self._start(run_id, displacing=self._again.pop(run_id))
            self._wake.set()  # room for more work

    # --- the lease ----------------------------------------------------------------------------

    async def _join(self) -> None:
        """Take a lease, under a new id as long as the store says the id's lease lapsed."""
        while not await self._renew():
            self.lease.lapse(new_worker_id(self.prefix))

    async def _renew(self) -> bool:
        sent = time.monotonic()
        now = self.engine.handler.clock()
        held = await self.leases.renew_lease(
            self.worker_id, lease_until=now + self.lease.duration, now=now
        )
        if held:
            self.lease.renewed(sent)
        return held

    async def _renew_in_time(self, period: float) -> bool:
        """Renew the lease; a renewal the store took too late for the lease to hold by this
        process's clock until the next heartbeat, `period` seconds away, is made again at once
        (the store was busy: a SQLite file's write lock held by a stopped process, say).
        Appends wait meanwhile (`Lease.settled`)."""
        with self.lease.renewing():
            for _ in range(_RENEWALS):
                if not await self._renew():
                    return False
                if self.lease.holds(period):
                    return True
            return self.lease.holds()

    async def _heartbeat(self) -> None:
        period = self.lease.duration.total_seconds() / 3
        while True:
            await asyncio.sleep(period)
            try:
                held = self.lease.holds() and await self._renew_in_time(period)
            except StoreUnavailable as exc:
                _log.warning("worker %s could not renew its lease: %s", self.worker_id, exc)
                held = self.lease.holds()
                if held:
                    continue
            if not held:
                await self._lapsed()

    async def _lapsed(self) -> None:
        """The lease lapsed: drop every drive (their runs may be another's now), join anew."""
        old = self.worker_id
        self.counts.lapses += 1
        self.lease.lapse(new_worker_id(self.prefix))
        _log.warning("worker %s let its lease lapse; going on as %s", old, self.worker_id)
        self._again.clear()  # held for the old id: the new one looks again
        await _cancel(self._drives.values())
        with contextlib.suppress(StoreUnavailable):
            await self._join()
        self._wake.set()

    async def _wind_down(self) -> None:
        """Let the drives finish within the grace period, then cancel what is left."""
        if self._drives:
            _, late = await asyncio.wait(list(self._drives.values()), timeout=self.grace)
            await _cancel(late)


async def _cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel the tasks and wait until each has ended, cancelling again any that goes on.

    On Python 3.11 a cancellation can be lost (an `asyncio.wait_for` whose inner call completes
    as it is cancelled returns the result): a task that swallowed one would keep a stopping
    worker waiting for ever, so one still running after `_RECANCEL` seconds is cancelled again.
    """
    chosen = set(tasks)
    pending = chosen
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_RECANCEL)
    for task in chosen:  # what a task raised on its way out is retrieved, as gather would
        if not task.cancelled():
            task.exception()
