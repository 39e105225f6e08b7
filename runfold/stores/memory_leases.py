"""`MemoryLeases`: the worker leases of `MemoryStore` (`WorkerLeases`), a dict under its lock.

A part of `MemoryStore` kept apart so that each module holds one idea. Like the rest of that
store it favours the obvious: `orphaned_runs` scans the runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import datetime

from runfold.kernel import LIVE_RUN_STATUSES, RunIndex, RunSummary, WorkerLease
from runfold.stores.leases import check_orphaned_runs, check_renew_lease, check_worker_id
from runfold.stores.time_keys import time_key

__all__ = ["MemoryLeases"]


class MemoryLeases:
    """The `WorkerLeases` methods of `MemoryStore`, over its lock and its index rows."""

    __slots__ = ()

    _lock: asyncio.Lock
    _indexes: dict[str, RunIndex]
    _leases: dict[str, WorkerLease]

    def _check_open(self) -> None:
        raise NotImplementedError

    async def renew_lease(self, worker_id: str, *, lease_until: datetime, now: datetime) -> bool:
        """Hold the worker's lease until `lease_until`; False once it lapsed (`WorkerLeases`)."""
        check_renew_lease(worker_id, lease_until=lease_until, now=now)
        async with self._lock:
            self._check_open()
            held = self._leases.get(worker_id)
            if held is not None and held.lease_until <= now:
                return False
            started = held.started_at if held is not None else now
            self._leases[worker_id] = WorkerLease(
                worker_id=worker_id, lease_until=lease_until, started_at=started
            )
            return True

    async def drop_lease(self, worker_id: str) -> None:
        """Forget the worker's lease (`WorkerLeases`)."""
        check_worker_id(worker_id)
        async with self._lock:
            self._check_open()
            self._leases.pop(worker_id, None)

    async def list_leases(self) -> list[WorkerLease]:
        """Every lease, by worker id (`WorkerLeases`)."""
        async with self._lock:
            self._check_open()
            return sorted(self._leases.values(), key=lambda lease: lease.worker_id)

    async def orphaned_runs(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[RunSummary]:
        """Live runs whose owner holds no lease at `now`, oldest update first (`WorkerLeases`)."""
        check_orphaned_runs(now, limit=limit, workflow_names=workflow_names)
        async with self._lock:
            self._check_open()
            found = []
            for index in self._indexes.values():
                summary = index.summary
                if summary.owner_id is None or summary.status not in LIVE_RUN_STATUSES:
                    continue
                if workflow_names is not None and summary.workflow_name not in workflow_names:
                    continue
                lease = self._leases.get(summary.owner_id)
                if lease is None or lease.lease_until <= now:
                    found.append(summary)
        found.sort(key=lambda s: (time_key(s.updated_at), s.run_id))
        return found[: max(limit, 0)]
