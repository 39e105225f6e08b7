"""A SQLite file stalled by a process holding its write lock: no live worker's run is taken over.

While another process holds the write lock (as a worker stopped mid-transaction does), no
worker can renew its lease; the leases that lapse meanwhile are left to their holders for the
stall's length, a renewal the store takes late holds the lease from then on, and a lease whose
run was taken over is spent, so that a renewal sent before it lapsed cannot revive it. The lock
is a real one, held by another process (`lock_holder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import ClaimRun, StartRun
from runfold.flow import Flow, step, workflow
from runfold.stores import SQLiteStore
from tests.conftest import T0
from tests.support.fleet_chaos import ROOT
from tests.support.fleet_workflows import LEDGER_ENV, ledger_step, read_ledger
from tests.support.rules_helpers import create
from tests.support.sqlite_lock import let_go, lock_holder, take

LEASE = timedelta(seconds=1)
STALL = 2.0
"""Seconds the write lock is held: twice the lease."""


def now() -> datetime:
    return datetime.now(UTC)


@contextlib.asynccontextmanager
async def run_claimed_by(
    path: str, owner_id: str
) -> AsyncIterator[tuple[SQLiteStore, SQLiteStore]]:
    """Two stores on the file at `path`, the first with run "r" started and claimed by
    `owner_id`: two workers, each with its own connection that waits up to 30 s for the lock."""
    owner = await SQLiteStore.open(path, busy_timeout=30.0)
    other = await SQLiteStore.open(path, busy_timeout=30.0)
    try:
        handler = CommandHandler(owner)
        await handler.execute("r", StartRun(create=create()))
        await handler.execute("r", ClaimRun(owner_id=owner_id))
        yield owner, other
    finally:
        await owner.close()
        await other.close()


async def test_a_lease_that_lapses_while_the_file_is_stalled_is_not_taken_over(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "runs.db")
    async with run_claimed_by(path, "holder") as (holder, claimer):
        assert await claimer.renew_lease("claimer", lease_until=now() + 10 * LEASE, now=now())
        with lock_holder(path) as lock:
            assert await holder.renew_lease("holder", lease_until=now() + LEASE, now=now())
            take(lock)
            # Both workers' writes wait for the lock: the claimer's look for work, and the
            # holder's renewal, sent before its lease lapses.
            looking = asyncio.create_task(
                claimer.claim_due("claimer", now(), hold_until=now() + LEASE, limit=10)
            )
            await asyncio.sleep(0.5)
            renewal = asyncio.create_task(
                holder.renew_lease("holder", lease_until=now() + LEASE, now=now())
            )
            await asyncio.sleep(STALL - 0.5)  # the holder's lease lapses meanwhile
            let_go(lock)
            assert await looking == []
            assert await renewal
        # The claimer's next look, after the stall: the holder's run is still the holder's.
        after = now()
        assert await claimer.claim_due("claimer", after, hold_until=after + LEASE, limit=10) == []
        assert await claimer.orphaned_runs(after) == []
        # The holder renews again at once (its own clock says the late renewal came too late),
        # and holds its lease by the store too.
        assert await holder.renew_lease("holder", lease_until=now() + LEASE, now=now())


async def test_a_process_started_after_a_stall_spares_the_leases_that_lapsed_in_it(
    tmp_path: Path,
) -> None:
    # A process holds the write lock, then is killed; a worker process that opens the store
    # only after that stall reads it in the file (recorded by the process that waited through
    # it), and leaves the run whose owner's lease lapsed in it to the owner, whose renewal is
    # late (it may yet come: its process was waiting too).
    path = str(tmp_path / "runs.db")
    late = subprocess.Popen(
        [sys.executable, "-m", "tests.support.late_claimer", path],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert late.stdout is not None and late.stdin is not None
        assert late.stdout.readline().strip() == "ready"  # imported, the store not opened yet
        async with run_claimed_by(path, "owner") as (owner, waiter):
            assert await waiter.renew_lease("waiter", lease_until=now() + 30 * LEASE, now=now())
            with lock_holder(path) as lock:
                assert await owner.renew_lease("owner", lease_until=now() + 2 * LEASE, now=now())
                take(lock)
                looking = asyncio.create_task(
                    waiter.claim_due("waiter", now(), hold_until=now() + LEASE, limit=10)
                )
                await asyncio.sleep(0.5)
                sent = now()  # when the owner sends a renewal, before its lease lapses
                await asyncio.sleep(3 * LEASE.total_seconds())  # the owner's lease lapses meanwhile
                lock.kill()  # as the chaos harness kills a worker stopped holding the lock
                assert await looking == []
            late.stdin.write("\n")  # the stall is over: the late process opens the store and looks
            late.stdin.flush()
            assert json.loads(late.stdout.readline()) == {"claimed": [], "orphaned": []}
            # The owner's renewal sent in the stall, that its store takes only after the look (its
            # process is slow to come back), still finds its lease: it was not spent.
            assert await owner.renew_lease("owner", lease_until=sent + 2 * LEASE, now=sent)
    finally:
        late.kill()
        late.wait(timeout=10)
        for stream in (late.stdin, late.stdout):
            if stream is not None:
                stream.close()


async def test_a_lease_whose_run_was_taken_over_is_never_renewed_again(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "runs.db") as store:
        handler = CommandHandler(store, clock=lambda: T0)
        await handler.execute("r", StartRun(create=create()))
        await handler.execute("r", ClaimRun(owner_id="gone"))
        assert await store.renew_lease("gone", lease_until=T0 + LEASE, now=T0)
        later = T0 + 2 * LEASE
        [taken] = await store.claim_due("w", later, hold_until=later + LEASE, limit=10)
        assert (taken.run_id, taken.reason, taken.displacing) == ("r", "orphan", "gone")
        # A renewal the worker sent while its lease held, that the store takes only now, finds
        # the lease spent: the worker drops its runs rather than driving one another worker has.
        assert not await store.renew_lease("gone", lease_until=T0 + 2 * LEASE, now=T0 + LEASE / 2)
        assert [lease.lease_until for lease in await store.list_leases()] == [
            datetime(1970, 1, 1, tzinfo=UTC)
        ]


@workflow(name="test-stall")
async def one_long_step(work: float) -> int:
    done: int = await step(ledger_step, 3, work)
    return done


@pytest.mark.slow
async def test_workers_run_no_step_twice_for_a_stall_longer_than_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    path = str(tmp_path / "runs.db")
    lease = 2 * LEASE  # a loaded machine's event loop may lag: well above that
    stores = [await SQLiteStore.open(path, busy_timeout=30.0) for _ in range(2)]
    flows = [Flow(store, [one_long_step]) for store in stores]
    with lock_holder(path) as lock:  # started first: its start-up does not hold the loop
        serving = [
            asyncio.create_task(flow.serve(poll_interval=0.05, lease=lease, handle_signals=False))
            for flow in flows
        ]
        try:
            while not all(flow.worker is not None for flow in flows):
                await asyncio.sleep(0.05)
            stall = 2 * lease.total_seconds()
            run = await flows[0].start(one_long_step, stall + 2.0)
            while not ledger.exists():  # its step's body started
                await asyncio.sleep(0.05)
            take(lock)
            await asyncio.sleep(stall)  # every renewal waits meanwhile
            let_go(lock)
            result = await flows[1].result(run.run_id, wait=60.0)
            assert (result.status, result.output) == ("completed", 9)
            starts = [row for row in read_ledger(ledger) if row[0] == "start"]
            assert len(starts) == 1, starts  # the body ran once: no worker took the run over
            assert [flow.worker.counts.lapses for flow in flows if flow.worker] == [0, 0]
        finally:
            for flow in flows:
                flow.stop()
            await asyncio.gather(*serving)
            for store in stores:
                await store.close()


@workflow(name="test-idle")
async def idle(value: int) -> int:
    return value


async def test_a_worker_renews_at_once_a_lease_a_stall_left_short_of_its_next_heartbeat(
    tmp_path: Path,
) -> None:
    # A stall shorter than the lease: the renewal waiting in it is taken late, and leaves the
    # lease holding (by the worker's clock) for less than a heartbeat period. Renewing only at
    # the next heartbeat, the worker would find its lease lapsed then, and drop its runs.
    path = str(tmp_path / "runs.db")
    lease = timedelta(seconds=1.5)  # a heartbeat every 0.5 s
    store = await SQLiteStore.open(path, busy_timeout=30.0)
    watcher = await SQLiteStore.open(path, busy_timeout=30.0)
    flow = Flow(store, [idle])
    with lock_holder(path) as lock:
        serving = asyncio.create_task(
            flow.serve(poll_interval=0.05, lease=lease, handle_signals=False)
        )
        try:
            while flow.worker is None or not await watcher.list_leases():
                await asyncio.sleep(0.01)
            [first] = await watcher.list_leases()
            while [first] == await watcher.list_leases():  # wait for a renewal, and stall then
                await asyncio.sleep(0.005)
            take(lock)
            # The next renewal is sent about 0.5 s later: taken 1.7 s after the lock was, it
            # leaves the lease about 0.25 s by the worker's clock.
            await asyncio.sleep(1.7)
            let_go(lock)
            await asyncio.sleep(2 * lease.total_seconds())  # heartbeats after the stall
            assert flow.worker.counts.lapses == 0
            [held] = await watcher.list_leases()
            assert held.worker_id == first.worker_id  # still the id it started with
        finally:
            flow.stop()
            await serving
            await store.close()
            await watcher.close()
