"""`WorkerLeases`: what a store offers a fleet of workers, beside the `EventStore` protocol.

A worker of a fleet holds a lease in the store, which it renews while it lives: one small write
per renewal, whatever the number of runs it owns, and no event. Which runs it owns is in their
histories (`RunClaimed`, `RunReleased`) and so in their index rows (`RunSummary.owner_id`). When
a worker's lease lapses (it died, hung, or lost the database for too long), the lease is never
renewed again, and its live runs are orphans another worker may take over with a `ClaimRun`
that displaces it; the kernel fences the old owner's late commands (`OwnershipLost`).

A store that keeps no leases is still a whole `EventStore`: one process drives its runs. The
fleet's `Worker` needs one that is also `WorkerLeases`.

Time is the callers' (`now`), as everywhere in a store: the workers of a fleet are expected to
share a clock within a small part of the lease.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import datetime
from typing import Protocol, runtime_checkable

from runfold.kernel import InvalidArgument, RunSummary, WorkerLease
from runfold.stores.arguments import check_collection, check_count, check_text, check_time

__all__ = ["WorkerLeases", "check_orphaned_runs", "check_renew_lease", "check_worker_id"]


@runtime_checkable
class WorkerLeases(Protocol):
    """The leases of a fleet's workers, and the runs whose owner's lease lapsed."""

    async def renew_lease(self, worker_id: str, *, lease_until: datetime, now: datetime) -> bool:
        """Hold (or take) the lease of `worker_id` until `lease_until`; False if it lapsed.

        A worker with no lease gets one (started at `now`). A lease that still holds at `now`
        is moved to `lease_until`. One that lapsed (its `lease_until` is at or before `now`)
        stays lapsed and nothing changes: the worker's runs may be taken over already, so the
        worker must drop them and come back under a new id. Atomic per worker.

        Raises:
            InvalidArgument: An id that is not non-empty text, or a naive time.
        """
        ...

    async def drop_lease(self, worker_id: str) -> None:
        """Forget the worker's lease (it stopped, having released its runs); no-op if none."""
        ...

    async def list_leases(self) -> list[WorkerLease]:
        """Every worker lease the store holds, lapsed ones included, by worker id."""
        ...

    async def orphaned_runs(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[RunSummary]:
        """Live runs whose owner holds no lease at `now` (lapsed, or never taken), at most `limit`.

        Of the runs of `workflow_names` when given, oldest update first. Found through an
        index of owned runs, never by reading every run.
        """
        ...


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""What the kernel refuses in an id (`ClaimRun.owner_id` among them)."""


def check_worker_id(worker_id: object) -> None:
    """The argument of `drop_lease`, and the worker id of `renew_lease`.

    Non-empty text without a control character: the kernel refuses those in the `owner_id` of
    a claim, so no run could name such a worker (and PostgreSQL's text holds no NUL).
    """
    check_text(worker_id, "worker_id")
    assert isinstance(worker_id, str)
    if not worker_id:
        raise InvalidArgument("worker_id", "must not be empty")
    if _CONTROL.search(worker_id):
        raise InvalidArgument("worker_id", "contains a control character")


def check_renew_lease(worker_id: object, *, lease_until: object, now: object) -> None:
    """The arguments of `renew_lease`."""
    check_worker_id(worker_id)
    check_time(lease_until, "lease_until")
    check_time(now, "now")


def check_orphaned_runs(now: object, *, limit: object, workflow_names: object) -> None:
    """The arguments of `orphaned_runs`."""
    check_time(now, "now")
    check_count(limit, "limit")
    if workflow_names is not None:
        check_collection(workflow_names, "workflow_names")
