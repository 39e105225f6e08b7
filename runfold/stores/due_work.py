"""`DueWork`: due work handed to one worker of a fleet at a time, in one store call.

A fleet's workers look for the same work: queued runs (created, not started, owned by nobody),
due wakeups of runs nobody owns (timers, delayed retries, deadlines), and orphans (live runs
whose owner's lease lapsed). `claim_due` picks the next ones atomically and marks each as
*held* by the calling worker until `hold_until`, so that two workers calling at the same moment
never get the same run. A hold is a reservation, not an owner: the worker still records its
claim in the run's history (`ClaimRun`, fenced by the kernel), and a hold lapses by itself at
`hold_until`, or as soon as the run's history moves on (it is taken at the run's last sequence).

Queues (`Queue`): a run created with a `queue_name` (`CreateRun`) is handed out only to a worker
that serves its queue, within the queue's limits, counted across the whole fleet:
`concurrency` (its runs started and not ended, or held), `worker_concurrency` (those the
calling worker owns or holds), and a rate limit (`rate_limit` starts per `rate_period`). Queued
runs go by priority (lower first), then age. `hold_dedup` keeps a deduplication id to one live
run of a queue.

Time is the callers' (`now`), as everywhere in a store.
"""

from __future__ import annotations

import abc
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Literal, Protocol, runtime_checkable

import attrs

from runfold.kernel import InvalidArgument
from runfold.stores.arguments import check_collection, check_count, check_text, check_time
from runfold.stores.leases import check_worker_id

__all__ = [
    "DEDUP_GRACE",
    "DueRun",
    "DueWork",
    "DueWorkBase",
    "Queue",
    "check_claim_due",
    "check_hold_dedup",
]

DueReason = Literal["orphan", "wakeup", "queued"]

DEDUP_GRACE = timedelta(minutes=1)
"""How long a deduplication id stays held for a run that was never created.

Its starter died between `hold_dedup` and the run's first append: past that, another run may
take the id."""


@attrs.frozen(kw_only=True)
class Queue:
    """A queue of runs, as the workers that serve it declare it.

    Attributes:
        name: The queue's name, as runs are started on it (`Flow.start(..., queue=name)`).
        concurrency: The most runs of the queue started and not ended at once, across every
            worker (None: no limit).
        worker_concurrency: The most of those one worker owns or holds at once (None: no
            limit), counted for every run of the queue handed out to it: queued, resumed
            after a wait, or taken over.
        rate_limit: The most runs of the queue started per `rate_period`, across every worker
            (None: no limit).
        rate_period: The period of `rate_limit`.

    Raises:
        InvalidArgument: An empty name, a limit that is not a positive int, a rate limit without
            a positive period.
    """

    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: timedelta = timedelta(seconds=1)

    def __attrs_post_init__(self) -> None:
        check_text(self.name, "name")
        if not self.name:
            raise InvalidArgument("name", "a queue's name must not be empty")
        if not isinstance(self.rate_period, timedelta) or self.rate_period <= timedelta(0):
            raise InvalidArgument("rate_period", "must be a positive timedelta")
        for what in ("concurrency", "worker_concurrency", "rate_limit"):
            value = getattr(self, what)
            if value is not None and (type(value) is not int or value < 1):
                raise InvalidArgument(what, f"must be a positive int or None, not {value!r}")


@attrs.frozen(kw_only=True)
class DueRun:
    """A run `claim_due` handed to a worker, held for it until the hold's end.

    `reason` says where it was found: an `orphan` (its owner `displacing` holds no lease), a due
    `wakeup` of a run nobody owns, or a `queued` run (pending, owned by nobody).
    """

    run_id: str
    reason: DueReason
    displacing: str | None = None


@runtime_checkable
class DueWork(Protocol):
    """Due work claimed in one call, and the deduplication ids of queues."""

    async def claim_due(
        self,
        worker_id: str,
        now: datetime,
        *,
        hold_until: datetime,
        limit: int,
        workflow_names: Collection[str] | None = None,
        queues: Collection[Queue] = (),
    ) -> list[DueRun]:
        """Take the next due runs for `worker_id`, at most `limit`, each held until `hold_until`.

        Orphans first (oldest update first), then runs with a due wakeup (earliest first), then
        queued runs (lowest priority, then oldest first), of `workflow_names` when given. A run
        held by any worker (this one included) at its current last sequence until after `now`
        is not handed out again. A queued run on a queue is handed out only when its queue is
        in `queues`, and only within that queue's limits; one on no queue always is. Atomic:
        two calls at once never hand out one run twice.

        Raises:
            InvalidArgument: A bad worker id, a naive time, a negative limit, a queue named
                twice.
        """
        ...

    async def hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, *, now: datetime
    ) -> bool:
        """Hold `dedup_id` of `queue_name` for `run_id`; False when another live run holds it.

        True when it was free, held by `run_id` already, or held by a run that ended, or by
        one never created within `DEDUP_GRACE`. Atomic: of racing holders, one wins.
        """
        ...


class DueWorkBase(abc.ABC):
    """`DueWork` whose methods check their arguments, then call the store's hooks (optional).

    As `StoreBase` for `EventStore`: a store deriving from it writes `_claim_due` and
    `_hold_dedup`, given the arguments in order once they passed `check_claim_due` and
    `check_hold_dedup`.
    """

    __slots__ = ()

    async def claim_due(
        self,
        worker_id: str,
        now: datetime,
        *,
        hold_until: datetime,
        limit: int,
        workflow_names: Collection[str] | None = None,
        queues: Collection[Queue] = (),
    ) -> list[DueRun]:
        """Check the arguments, then `_claim_due` (`DueWork.claim_due`)."""
        check_claim_due(
            worker_id,
            now,
            hold_until=hold_until,
            limit=limit,
            workflow_names=workflow_names,
            queues=queues,
        )
        return await self._claim_due(worker_id, now, hold_until, limit, workflow_names, queues)

    async def hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, *, now: datetime
    ) -> bool:
        """Check the arguments, then `_hold_dedup` (`DueWork.hold_dedup`)."""
        check_hold_dedup(queue_name, dedup_id, run_id, now)
        return await self._hold_dedup(queue_name, dedup_id, run_id, now)

    @abc.abstractmethod
    async def _claim_due(
        self,
        worker_id: str,
        now: datetime,
        hold_until: datetime,
        limit: int,
        workflow_names: Collection[str] | None,
        queues: Collection[Queue],
        /,
    ) -> list[DueRun]:
        """Take the next due runs for `worker_id`, each held until `hold_until`."""

    @abc.abstractmethod
    async def _hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, now: datetime, /
    ) -> bool:
        """Hold `dedup_id` of `queue_name` for `run_id`, unless a live run holds it."""


def check_claim_due(
    worker_id: object,
    now: object,
    *,
    hold_until: object,
    limit: object,
    workflow_names: object,
    queues: object,
) -> None:
    """The arguments of `claim_due`."""
    check_worker_id(worker_id)
    check_time(now, "now")
    check_time(hold_until, "hold_until")
    check_count(limit, "limit")
    if workflow_names is not None:
        check_collection(workflow_names, "workflow_names")
    if isinstance(queues, str | bytes) or not isinstance(queues, Collection):
        raise InvalidArgument("queues", f"must be a collection, not {type(queues).__name__}")
    names = [queue.name for queue in queues if isinstance(queue, Queue)]
    if len(names) != len(queues):
        raise InvalidArgument("queues", "must hold Queue declarations")
    if len(set(names)) != len(names):
        raise InvalidArgument("queues", "names a queue twice")


def check_hold_dedup(queue_name: object, dedup_id: object, run_id: object, now: object) -> None:
    """The arguments of `hold_dedup`."""
    for value, what in ((queue_name, "queue_name"), (dedup_id, "dedup_id"), (run_id, "run_id")):
        check_text(value, what)
        if not value:
            raise InvalidArgument(what, "must not be empty")
    check_time(now, "now")
