"""`MemoryDueWork`: `claim_due` and `hold_dedup` of `MemoryStore` (`DueWork`), under its lock.

A part of `MemoryStore` kept apart so that each module holds one idea. Like the rest of that
store it favours the obvious: it scans the runs. The SQL stores do the same with their indexes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import datetime

from runfold.kernel import LIVE_RUN_STATUSES, RunIndex, RunSummary, WorkerLease
from runfold.stores.due_work import (
    DEDUP_GRACE,
    DueRun,
    DueWorkBase,
    Queue,
)
from runfold.stores.time_keys import time_key

__all__ = ["MemoryDueWork", "queue_allowance"]


def queue_allowance(queue: Queue, *, active: int, mine: int, started: int) -> int | None:
    """How many more runs of `queue` may be handed out now (None: no limit)."""
    room = [
        limit - used
        for limit, used in (
            (queue.concurrency, active),
            (queue.worker_concurrency, mine),
            (queue.rate_limit, started),
        )
        if limit is not None
    ]
    return max(min(room), 0) if room else None


class MemoryDueWork(DueWorkBase):
    """The `DueWork` methods of `MemoryStore`, over its lock and its index rows."""

    __slots__ = ()

    _lock: asyncio.Lock
    _indexes: dict[str, RunIndex]
    _leases: dict[str, WorkerLease]
    _holds: dict[str, tuple[str, datetime, int]]
    _starts: dict[str, list[datetime]]
    _dedups: dict[tuple[str, str], tuple[str, datetime]]

    def _check_open(self) -> None:
        raise NotImplementedError

    def _held(self, summary: RunSummary, now: datetime) -> str | None:
        """The worker holding the run at its last sequence after `now`, or None."""
        hold = self._holds.get(summary.run_id)
        if hold is None or hold[1] <= now or hold[2] != summary.last_sequence:
            return None
        return hold[0]

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
        """Take the next due runs for the worker, each held until `hold_until` (`DueWork`)."""
        async with self._lock:
            self._check_open()
            found = self._pick(worker_id, now, max(limit, 0), workflow_names, queues)
            for due in found:
                summary = self._indexes[due.run_id].summary
                self._holds[due.run_id] = (worker_id, hold_until, summary.last_sequence)
                if due.reason == "queued" and summary.queue_name is not None:
                    self._starts.setdefault(summary.queue_name, []).append(now)
            return found

    def _pick(
        self,
        worker_id: str,
        now: datetime,
        limit: int,
        served: Collection[str] | None,
        queues: Collection[Queue],
    ) -> list[DueRun]:
        declared = {queue.name: queue for queue in queues}
        orphans, woken, queued = [], [], []
        active: dict[str, int] = {}
        mine: dict[str, int] = {}
        for index in self._indexes.values():
            summary = index.summary
            if summary.status not in LIVE_RUN_STATUSES:
                continue
            holder = self._held(summary, now)
            waiting = summary.status == "pending" and summary.owner_id is None
            if summary.queue_name is not None and not (waiting and holder is None):
                name = summary.queue_name
                active[name] = active.get(name, 0) + 1
                if worker_id in (summary.owner_id, holder):
                    mine[name] = mine.get(name, 0) + 1
            if holder is not None or (served is not None and summary.workflow_name not in served):
                continue
            if summary.owner_id is not None:
                lease = self._leases.get(summary.owner_id)
                if lease is None or lease.lease_until <= now:
                    orphans.append(((time_key(summary.updated_at), summary.run_id), summary))
            elif waiting:
                if summary.queue_name is None or summary.queue_name in declared:
                    key = (summary.priority, time_key(summary.created_at), summary.run_id)
                    queued.append((key, summary))
            else:
                due = [w.due_at for w in index.wakeups if w.due_at <= now]
                if due:
                    woken.append(((min(due), summary.run_id), summary))
        # A worker's limit on a queue counts the runs of it that it resumes or takes over too.
        worker_room = {
            name: queue.worker_concurrency - mine.get(name, 0)
            for name, queue in declared.items()
            if queue.worker_concurrency is not None
        }

        def within(summary: RunSummary) -> bool:
            name = summary.queue_name
            if name is None or name not in worker_room:
                return True
            if worker_room[name] <= 0:
                return False
            worker_room[name] -= 1
            mine[name] = mine.get(name, 0) + 1
            return True

        found = [
            DueRun(run_id=s.run_id, reason="orphan", displacing=s.owner_id)
            for _, s in sorted(orphans, key=lambda item: item[0])
            if within(s)
        ][:limit]
        found += [
            DueRun(run_id=s.run_id, reason="wakeup")
            for _, s in sorted(woken, key=lambda item: item[0])
            if within(s)
        ][: limit - len(found)]
        allowances = {
            name: queue_allowance(
                queue,
                active=active.get(name, 0),
                mine=mine.get(name, 0),
                started=self._started(queue, now),
            )
            for name, queue in declared.items()
        }
        for _, summary in sorted(queued, key=lambda item: item[0]):
            if summary.queue_name is not None:
                name = summary.queue_name
                room = allowances[name]
                if room is not None:
                    if room <= 0:
                        continue
                    allowances[name] = room - 1
            found.append(DueRun(run_id=summary.run_id, reason="queued"))
        return found[:limit]

    def _started(self, queue: Queue, now: datetime) -> int:
        """Runs of `queue` handed out within its rate period before `now` (older ones dropped)."""
        since = now - queue.rate_period
        kept = [at for at in self._starts.get(queue.name, ()) if at > since]
        self._starts[queue.name] = kept
        return len(kept)

    async def _hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, now: datetime, /
    ) -> bool:
        """Hold the deduplication id for the run, unless a live run holds it (`DueWork`)."""
        async with self._lock:
            self._check_open()
            key = (queue_name, dedup_id)
            held = self._dedups.get(key)
            if held is not None and held[0] != run_id:
                index = self._indexes.get(held[0])
                if index is not None and index.summary.status in LIVE_RUN_STATUSES:
                    return False
                if index is None and held[1] + DEDUP_GRACE > now:
                    return False
            self._dedups[key] = (run_id, now)
            return True
