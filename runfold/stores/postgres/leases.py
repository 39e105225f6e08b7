"""`PostgresLeases`: the worker leases of `PostgresStore` (`WorkerLeases`), in its `leases` table.

A part of `PostgresStore` kept apart so that each module holds one idea. Each call is one
statement: a renewal is a single upsert, which locks the worker's row, so that concurrent
renewals of one lease are serialized and a lapsed lease is never moved. Times are integer
microseconds (`time_key`), as everywhere in the schema. `{s}` is the quoted schema name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from datetime import datetime
from typing import Any

from runfold.kernel import RunSummary, WorkerLease
from runfold.stores._sql import summary_from_row
from runfold.stores.leases import check_orphaned_runs, check_renew_lease, check_worker_id
from runfold.stores.time_keys import from_key, time_key

__all__ = ["ORPHANED_RUNS", "RENEW_LEASE", "PostgresLeases"]

RENEW_LEASE = """
INSERT INTO {s}.leases AS held (worker_id, lease_until, started_at)
VALUES (%(worker_id)s, %(until)s, %(now)s)
ON CONFLICT (worker_id) DO UPDATE SET lease_until = excluded.lease_until
WHERE held.lease_until > %(now)s
RETURNING true
"""
"""Take the worker's lease, or move it if it still holds at `now`.

It returns a row when it did, none when the lease had lapsed (and nothing changed).
"""

ORPHANED_RUNS = """
SELECT {summary} FROM {s}.runs
LEFT JOIN {s}.leases ON leases.worker_id = runs.owner_id
WHERE runs.owner_id IS NOT NULL
    AND (leases.worker_id IS NULL OR leases.lease_until <= %(now)s)
    AND (%(served)s::text[] IS NULL OR runs.workflow_name = ANY(%(served)s::text[]))
ORDER BY updated_at, run_id LIMIT %(limit)s
"""
"""The runs rows (`summary`) of `orphaned_runs`, oldest update first.

Owned runs (so live ones; through the partial index `runs_owner`) whose owner's lease is missing
or lapsed at `now`, of the `served` workflows (NULL: any).
"""


class PostgresLeases:
    """The `WorkerLeases` methods of `PostgresStore`, over its pooled connections."""

    __slots__ = ()

    _s: str
    SUMMARY: str
    _fetch: Callable[..., Awaitable[list[tuple[Any, ...]]]]

    async def renew_lease(self, worker_id: str, *, lease_until: datetime, now: datetime) -> bool:
        """Hold the worker's lease until `lease_until`; False once it lapsed (`WorkerLeases`)."""
        check_renew_lease(worker_id, lease_until=lease_until, now=now)
        rows = await self._fetch(
            RENEW_LEASE.format(s=self._s),
            {"worker_id": worker_id, "until": time_key(lease_until), "now": time_key(now)},
        )
        return bool(rows)

    async def drop_lease(self, worker_id: str) -> None:
        """Forget the worker's lease (`WorkerLeases`)."""
        check_worker_id(worker_id)
        await self._fetch(
            f"WITH dropped AS (DELETE FROM {self._s}.leases WHERE worker_id = %s RETURNING 1) "
            "SELECT count(*) FROM dropped",
            (worker_id,),
        )

    async def list_leases(self) -> list[WorkerLease]:
        """Every lease, by worker id (`WorkerLeases`)."""
        rows = await self._fetch(
            f"SELECT worker_id, lease_until, started_at FROM {self._s}.leases ORDER BY worker_id"
        )
        return [
            WorkerLease(worker_id=worker_id, lease_until=from_key(until), started_at=from_key(at))
            for worker_id, until, at in rows
        ]

    async def orphaned_runs(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[RunSummary]:
        """Live runs whose owner holds no lease at `now`, oldest update first (`WorkerLeases`)."""
        check_orphaned_runs(now, limit=limit, workflow_names=workflow_names)
        rows = await self._fetch(
            ORPHANED_RUNS.format(s=self._s, summary=self.SUMMARY),
            {
                "now": time_key(now),
                "served": None if workflow_names is None else sorted(set(workflow_names)),
                "limit": max(limit, 0),
            },
        )
        return [summary_from_row(row) for row in rows]
