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
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from runfold import CommandHandler
from runfold.commands import ClaimRun, StartRun
from runfold.stores import SQLiteStore
from tests.conftest import T0
from tests.support.rules_helpers import create

LEASE = timedelta(seconds=1)
STALL = 2.0
"""Seconds the write lock is held: twice the lease."""


_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
print("ready", flush=True)
sys.stdin.readline()
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


def now() -> datetime:
    return datetime.now(UTC)


@contextlib.contextmanager
def lock_holder(path: str) -> Iterator[subprocess.Popen[str]]:
    """Another process, started and ready to take the file's write lock (`step`)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        yield holder
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=10)
        holder.stdout.close()


def step(holder: subprocess.Popen[str]) -> None:
    """Make the holder take the lock (the first time) or let it go (the second)."""
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("\n")
    holder.stdin.flush()


async def test_a_lease_that_lapses_while_the_file_is_stalled_is_not_taken_over(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "runs.db")
    holder = await SQLiteStore.open(path, busy_timeout=30.0)
    claimer = await SQLiteStore.open(path, busy_timeout=30.0)
    try:
        handler = CommandHandler(holder)
        await handler.execute("r", StartRun(create=create()))
        await handler.execute("r", ClaimRun(owner_id="holder"))
        assert await claimer.renew_lease("claimer", lease_until=now() + 10 * LEASE, now=now())
        with lock_holder(path) as lock:
            assert await holder.renew_lease("holder", lease_until=now() + LEASE, now=now())
            step(lock)
            assert lock.stdout is not None and lock.stdout.readline().strip() == "locked"
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
            step(lock)
            assert await looking == []
            assert await renewal
        # The claimer's next look, after the stall: the holder's run is still the holder's.
        after = now()
        assert await claimer.claim_due("claimer", after, hold_until=after + LEASE, limit=10) == []
        assert await claimer.orphaned_runs(after) == []
        # The holder renews again at once (its own clock says the late renewal came too late),
        # and holds its lease by the store too.
        assert await holder.renew_lease("holder", lease_until=now() + LEASE, now=now())
    finally:
        await holder.close()
        await claimer.close()


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
