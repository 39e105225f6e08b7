"""What the engine reports of the runs it serves, read through the handler's store.

The run index is paged (`live_summaries`); `open_suspensions` and `engine_summary` read each live
run's snapshot to list its open work. None of this writes: a host or an operator looks around
with it, the loop does not need it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from types import MappingProxyType

from runfold.engine.suspensions import (
    EngineSummary,
    Suspension,
    suspension_order,
    suspensions_of,
)
from runfold.handler import CommandHandler
from runfold.kernel import LIVE_RUN_STATUSES, RunStatus, RunSummary

__all__ = ["LIVE", "engine_summary", "live_summaries", "open_suspensions"]

LIVE: tuple[RunStatus, ...] = ("pending", "running", "cancelling")
"""The statuses of a run that may still do something, in the order they are swept."""
_PAGE = 500


async def live_summaries(
    handler: CommandHandler,
    status: RunStatus | None,
    workflow_name: str | None = None,
    *,
    parent_run_id: str | None = None,
) -> AsyncIterator[RunSummary]:
    """Every run of the store's index with `status` (None: any), page by page.

    Only the runs of `workflow_name`, or of parent `parent_run_id`, when given.
    """
    cursor: str | None = None
    while True:
        page = await handler.store.list_runs(
            status=status,
            workflow_name=workflow_name,
            parent_run_id=parent_run_id,
            cursor=cursor,
            limit=_PAGE,
        )
        for summary in page.items:
            yield summary
        if not page.has_more or page.cursor is None:
            return
        cursor = page.cursor


async def open_suspensions(handler: CommandHandler, now: datetime) -> tuple[Suspension, ...]:
    """Every open wait, delayed retry, deadline and awaited hook of the live runs at `now`.

    Sorted by run id, then kind, then subject id.
    """
    found: list[Suspension] = []
    for status in LIVE:
        async for summary in live_summaries(handler, status):
            found.extend(suspensions_of(await handler.snapshot(summary.run_id), now))
    found.sort(key=suspension_order)
    return tuple(found)


async def engine_summary(handler: CommandHandler, now: datetime) -> EngineSummary:
    """Runs by status across the store, and the open work of live runs at `now`."""
    by_status: dict[str, int] = {}
    open_work: list[Suspension] = []
    async for summary in live_summaries(handler, None):
        by_status[summary.status] = by_status.get(summary.status, 0) + 1
        if summary.status in LIVE_RUN_STATUSES:
            snapshot = await handler.snapshot(summary.run_id)
            open_work.extend(suspensions_of(snapshot, now))
    kinds = [s.kind for s in open_work]
    return EngineSummary(
        runs=sum(by_status.values()),
        by_status=MappingProxyType(dict(sorted(by_status.items()))),
        open_waits=kinds.count("wait"),
        active_hooks=kinds.count("hook"),
        delayed_retries=kinds.count("retry"),
        due=sum(s.due for s in open_work),
    )
