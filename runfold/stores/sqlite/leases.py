"""`SQLiteLeases`: the worker leases of `SQLiteStore` (`WorkerLeases`), in its `leases` table.

A part of `SQLiteStore` kept apart so that each module holds one idea. Each call is one
transaction on the store's connection thread: a renewal is a single upsert that changes nothing
once the lease lapsed. Times are integer microseconds (`time_key`), as everywhere in the file.

A renewal that waited `STALL_MIN` or more for the file (its write lock held by a process that
stopped in a transaction, say) moves the lease that much further: the lease runs from when the
store took the renewal, so that the worker, renewing again at once, still holds it, and the wait
is recorded in the file as a stall. Listings spare the leases that lapsed during a stall recorded
there, whichever process waited through it, or one of this store's own calls (`Stalls`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, TypeVar

from runfold.kernel import RunSummary, StoreError, WorkerLease
from runfold.stores._sql import summary_from_row
from runfold.stores.leases import check_orphaned_runs, check_renew_lease, check_worker_id
from runfold.stores.sqlite.reads import SUMMARY, UPDATED_AT
from runfold.stores.sqlite.stalls import STALL_MIN, Stalls
from runfold.stores.time_keys import from_key, time_key

__all__ = ["RENEW_LEASE", "SQLiteLeases", "orphaned_runs_query"]

T = TypeVar("T")

RENEW_LEASE = (
    "INSERT INTO leases (worker_id, lease_until, started_at) VALUES (?1, ?2, ?3) "
    "ON CONFLICT (worker_id) DO UPDATE SET lease_until = excluded.lease_until "
    "WHERE leases.lease_until > ?3"
)
"""Take the lease of worker `?1` until `?2` at `?3`, or move it if it still holds at `?3`.

It changes one row when it took or moved the lease, none when the lease had lapsed. An upsert
rather than `RETURNING` (SQLite 3.35), which the store does not otherwise need.
"""


def orphaned_runs_query(served: int | None) -> str:
    """The runs rows of `orphaned_runs`: owned, with the owner's lease missing or lapsed at `?1`.

    Oldest update first, `LIMIT ?2`; `served` names bound after it (`?3`, …), or None for any
    workflow. Each row ends with the owner's `lease_until` (NULL: no lease). `INDEXED BY` holds
    the planner to the partial index of owned runs (all live), whatever its statistics say:
    never a walk over every run.
    """
    served_clause = ""
    if served is not None:
        marks = ", ".join(f"?{number}" for number in range(3, served + 3))
        served_clause = f" AND runs.workflow_name IN ({marks})"
    return (
        f"SELECT {SUMMARY}, leases.lease_until FROM runs INDEXED BY runs_owner "
        "LEFT JOIN leases ON leases.worker_id = runs.owner_id "
        "WHERE runs.owner_id IS NOT NULL "
        f"AND (leases.worker_id IS NULL OR leases.lease_until <= ?1){served_clause} "
        f"ORDER BY {UPDATED_AT}, runs.run_id LIMIT ?2"
    )


def _renew(
    conn: sqlite3.Connection, worker_id: str, until: int, now: int, sent: float, stalls: Stalls
) -> bool:
    stalls.begin(conn)
    try:
        late = time.monotonic() - sent  # since the renewal was asked for (monotonic `sent`)
        if late >= STALL_MIN:
            until += int(late * 1_000_000)
        renewed = conn.execute(RENEW_LEASE, (worker_id, until, now)).rowcount == 1
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return renewed


def _drop(conn: sqlite3.Connection, worker_id: str) -> None:
    conn.execute("DELETE FROM leases WHERE worker_id = ?", (worker_id,))


def _leases(conn: sqlite3.Connection) -> list[Any]:
    return conn.execute(
        "SELECT worker_id, lease_until, started_at FROM leases ORDER BY worker_id"
    ).fetchall()


def _orphans(
    conn: sqlite3.Connection, now: int, limit: int, served: list[str] | None, stalls: Stalls
) -> list[Any]:
    # No names at all are bound as one NULL, which matches none: SQLite proves `IN ()` false,
    # and then `INDEXED BY` has no plan to hold to ("no query solution").
    names: list[str | None] | None = None if served is None else [*served] or [None]
    query = orphaned_runs_query(None if names is None else len(names))
    if not stalls.any(conn):
        return conn.execute(query, (now, limit, *(names or ()))).fetchall()
    found: list[Any] = []
    for row in conn.execute(query, (now, -1, *(names or ()))):  # read lazily, no LIMIT
        if len(found) >= limit:
            break
        if stalls.lapsed(conn, row[-1], now):
            found.append(row)
    return found


def lease_from_row(row: Any) -> WorkerLease:
    """A `WorkerLease` from a `(worker_id, lease_until, started_at)` row.

    Raises:
        StoreError: The row does not decode into a lease (a file written by hand).
    """
    worker_id, until, started = row
    try:
        if type(worker_id) is not str:
            raise TypeError(f"worker_id must be text, not {type(worker_id).__name__}")
        return WorkerLease(
            worker_id=worker_id, lease_until=from_key(until), started_at=from_key(started)
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise StoreError(f"a stored worker lease is corrupt: {exc}") from None


class SQLiteLeases:
    """The `WorkerLeases` methods of `SQLiteStore`, over its connection thread."""

    __slots__ = ()
    _stalls: Stalls

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def renew_lease(self, worker_id: str, *, lease_until: datetime, now: datetime) -> bool:
        """Hold the worker's lease until `lease_until`; False once it lapsed (`WorkerLeases`).

        A renewal the store took `STALL_MIN` or more after it was asked for (the file's write
        lock was taken meanwhile) holds the lease that much longer than `lease_until`.
        """
        check_renew_lease(worker_id, lease_until=lease_until, now=now)
        sent = time.monotonic()
        return await self._run(
            _renew, worker_id, time_key(lease_until), time_key(now), sent, self._stalls
        )

    async def drop_lease(self, worker_id: str) -> None:
        """Forget the worker's lease (`WorkerLeases`)."""
        check_worker_id(worker_id)
        await self._run(_drop, worker_id)

    async def list_leases(self) -> list[WorkerLease]:
        """Every lease, by worker id (`WorkerLeases`)."""
        return [lease_from_row(row) for row in await self._run(_leases)]

    async def orphaned_runs(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[RunSummary]:
        """Live runs whose owner holds no lease at `now`, oldest update first (`WorkerLeases`)."""
        check_orphaned_runs(now, limit=limit, workflow_names=workflow_names)
        # The names are bound one by one, not as a JSON array: `json_each` would not give back
        # a name holding a NUL character as it was. An engine serves a handful.
        served = None if workflow_names is None else sorted(set(workflow_names))
        rows = await self._run(_orphans, time_key(now), max(limit, 0), served, self._stalls)
        return [summary_from_row(row[:-1]) for row in rows]
