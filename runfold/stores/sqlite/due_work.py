"""`SQLiteDueWork`: `claim_due` and `hold_dedup` of `SQLiteStore` (`DueWork`).

A part of `SQLiteStore` kept apart so that each module holds one idea. A claim is one call on
the store's connection thread, inside one write transaction (`BEGIN IMMEDIATE`): SQLite lets
one writer at a time hold the file, so two processes' claims follow one another and the second
sees the first's holds. Each source of work is read through its index (`runs_owner`,
`wakeups_due`, `runs_queued`), a bounded number of rows; the counts a queue's limits need go
through `runs_queue_live` and `queue_starts`.

An orphan whose owner's lease lapsed during a stall of the file recorded in it, by whichever
process waited through it (the claim records its own long wait for the write lock before it
looks), or during one of this store's own long calls, is left to its owner for the stall's
length (`Stalls`): the owner's renewal
was waiting for the lock too. Taking an orphan spends its owner's lease
(its end moves to the epoch), so that a renewal the owner sent before it lapsed, and the store
takes only now, cannot revive it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, TypeVar

from runfold.stores.due_work import (
    DEDUP_GRACE,
    DueRun,
    DueWorkBase,
    Queue,
)
from runfold.stores.memory_due_work import queue_allowance
from runfold.stores.sqlite.leases import orphaned_runs_query
from runfold.stores.sqlite.reads import LAST_SEQUENCE
from runfold.stores.sqlite.stalls import Stalls
from runfold.stores.time_keys import time_key

__all__ = ["SQLiteDueWork"]

T = TypeVar("T")

_HELD = (
    "EXISTS (SELECT 1 FROM due_holds h WHERE h.run_id = runs.run_id AND h.held_until > ?{now} "
    f"AND h.at_sequence = {LAST_SEQUENCE})"
)
"""Whether a run is held after `now` at its last sequence (`{now}`: the parameter's number)."""
_HELD_AT_1 = _HELD.format(now=1)
_OWNER, _QUEUE = 9, 10
"""Where `owner_id` and `queue_name` are in a row of `SUMMARY`."""

_WOKEN = (
    "SELECT wakeups.run_id, runs.queue_name, min(wakeups.due_at) AS due FROM wakeups "
    "JOIN runs ON runs.run_id = wakeups.run_id "
    "WHERE wakeups.due_at <= ?1 AND runs.owner_id IS NULL AND runs.status <> 'pending' "
    f"AND NOT {_HELD_AT_1}{{served}} "
    "GROUP BY wakeups.run_id ORDER BY due, wakeups.run_id LIMIT ?2"
)
"""Runs nobody owns with a due wakeup (started ones: pending runs are queued), earliest first."""

_QUEUED = (
    "SELECT run_id, queue_name FROM runs INDEXED BY runs_queued "
    "WHERE status = 'pending' AND owner_id IS NULL AND queue_name IS ?3 "
    f"AND NOT {_HELD_AT_1}{{served}} "
    "ORDER BY priority, created_at, run_id LIMIT ?2"
)
"""Queued runs of one queue (`?3`, NULL: none), by priority then age."""

_ACTIVE = (
    "SELECT count(*), coalesce(sum(runs.owner_id IS ?3 OR h.worker_id IS ?3), 0) "
    "FROM runs INDEXED BY runs_queue_live "
    "LEFT JOIN due_holds h ON h.run_id = runs.run_id AND h.held_until > ?1 "
    f"AND h.at_sequence = {LAST_SEQUENCE} "
    "WHERE runs.queue_name = ?2 AND runs.completed_at IS NULL "
    "AND NOT (runs.status = 'pending' AND runs.owner_id IS NULL AND h.run_id IS NULL)"
)
"""A queue's runs started (or taken) and not ended, and how many of them worker `?3` has."""

_HOLD = (
    "INSERT INTO due_holds (run_id, worker_id, held_until, at_sequence) "
    f"SELECT run_id, ?2, ?3, {LAST_SEQUENCE} FROM runs WHERE run_id = ?1 "
    "ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id, "
    "held_until = excluded.held_until, at_sequence = excluded.at_sequence"
)

_SPEND = "UPDATE leases SET lease_until = 0 WHERE worker_id = ?1 AND lease_until <= ?2"
"""Spend the lapsed lease of worker `?1` whose run a claim at `?2` takes over."""

_HOLD_DEDUP = (
    "INSERT INTO queue_dedups (queue_name, dedup_id, run_id, held_at) VALUES (?1, ?2, ?3, ?4) "
    "ON CONFLICT (queue_name, dedup_id) DO UPDATE SET run_id = excluded.run_id, "
    "held_at = excluded.held_at WHERE queue_dedups.run_id = excluded.run_id "
    "OR EXISTS (SELECT 1 FROM runs WHERE runs.run_id = queue_dedups.run_id "
    "AND runs.completed_at IS NOT NULL) "
    "OR (NOT EXISTS (SELECT 1 FROM runs WHERE runs.run_id = queue_dedups.run_id) "
    "AND queue_dedups.held_at <= ?5)"
)
"""Hold a deduplication id: it changes one row when it did, none when a live run holds it."""


def _served(served: list[str] | None, first: int) -> tuple[str, list[str]]:
    """The clause keeping runs of the `served` workflows, bound from `?first` on."""
    if served is None:
        return "", []
    names = served or ["\x00"]  # no name holds U+0000 (the kernel refuses control characters)
    marks = ", ".join(f"?{first + n}" for n in range(len(names)))
    return f" AND runs.workflow_name IN ({marks})", names


def _claim(
    conn: sqlite3.Connection,
    worker_id: str,
    now: int,
    until: int,
    limit: int,
    served: list[str] | None,
    queues: list[Queue],
    stalls: Stalls,
) -> list[DueRun]:
    stalls.begin(conn)  # a long wait for the lock is a stall: recorded before the look
    try:
        conn.execute("DELETE FROM due_holds WHERE held_until <= ?", (now,))
        found = _pick(conn, worker_id, now, limit, served, queues, stalls)
        for due in found:
            conn.execute(_HOLD, (due.run_id, worker_id, until))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return found


def _pick(
    conn: sqlite3.Connection,
    worker_id: str,
    now: int,
    limit: int,
    served: list[str] | None,
    queues: list[Queue],
    stalls: Stalls,
) -> list[DueRun]:
    counts = {queue.name: _counts(conn, queue, worker_id, now) for queue in queues}
    # A worker's limit on a queue counts the runs of it that it resumes or takes over too.
    worker_room = {
        queue.name: queue.worker_concurrency - counts[queue.name][1]
        for queue in queues
        if queue.worker_concurrency is not None
    }

    def within(queue_name: str | None) -> bool:
        if queue_name is None or queue_name not in worker_room:
            return True
        if worker_room[queue_name] <= 0:
            return False
        worker_room[queue_name] -= 1
        active, mine, started = counts[queue_name]
        counts[queue_name] = (active, mine + 1, started)
        return True

    orphan_names: list[str | None] | None = None if served is None else [*served] or [None]
    query = orphaned_runs_query(None if orphan_names is None else len(orphan_names)).replace(
        "WHERE runs.owner_id IS NOT NULL", f"WHERE runs.owner_id IS NOT NULL AND NOT {_HELD_AT_1}"
    )
    found: list[DueRun] = []
    # Read lazily, without a LIMIT (-1): runs over a queue's limit are passed over.
    for row in conn.execute(query, (now, -1, *(orphan_names or ()))):
        if len(found) >= limit:
            break
        if not stalls.lapsed(conn, row[-1], now):
            continue  # lapsed while the file was stalled: its owner may yet renew it
        if within(row[_QUEUE]):
            found.append(DueRun(run_id=row[0], reason="orphan", displacing=row[_OWNER]))
            conn.execute(_SPEND, (row[_OWNER], now))
    clause, names = _served(served, 3)
    for row in conn.execute(_WOKEN.format(served=clause), (now, -1, *names)):
        if len(found) >= limit:
            break
        if within(row[1]):
            found.append(DueRun(run_id=row[0], reason="wakeup"))
    for queue in [None, *queues]:
        if len(found) >= limit:
            break
        room = limit - len(found)
        name = None
        if queue is not None:
            name = queue.name
            active, mine, started = counts[name]
            allowed = queue_allowance(queue, active=active, mine=mine, started=started)
            if allowed is not None:
                room = min(room, allowed)
        if room <= 0:
            continue
        clause, names = _served(served, 4)
        rows = conn.execute(_QUEUED.format(served=clause), (now, room, name, *names)).fetchall()
        found += [DueRun(run_id=row[0], reason="queued") for row in rows]
        if name is not None and rows:
            conn.executemany(
                "INSERT INTO queue_starts (queue_name, started_at, run_id) VALUES (?, ?, ?)",
                [(name, now, row[0]) for row in rows],
            )
    return found


def _counts(
    conn: sqlite3.Connection, queue: Queue, worker_id: str, now: int
) -> tuple[int, int, int]:
    """The queue's live runs, those of `worker_id`, and its starts within its rate period."""
    active, mine = conn.execute(_ACTIVE, (now, queue.name, worker_id)).fetchone()
    since = now - time_key_delta(queue)
    conn.execute(
        "DELETE FROM queue_starts WHERE queue_name = ? AND started_at <= ?", (queue.name, since)
    )
    (started,) = conn.execute(
        "SELECT count(*) FROM queue_starts WHERE queue_name = ?", (queue.name,)
    ).fetchone()
    return active, mine, started


def time_key_delta(queue: Queue) -> int:
    """The queue's rate period in microseconds, as times are stored."""
    period = queue.rate_period
    return (period.days * 86_400 + period.seconds) * 1_000_000 + period.microseconds


def _hold_dedup_row(
    conn: sqlite3.Connection, queue_name: str, dedup_id: str, run_id: str, now: int, grace: int
) -> bool:
    return conn.execute(_HOLD_DEDUP, (queue_name, dedup_id, run_id, now, grace)).rowcount == 1


class SQLiteDueWork(DueWorkBase):
    """The `DueWork` methods of `SQLiteStore`, over its connection thread."""

    __slots__ = ()
    _stalls: Stalls

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

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
        served = None if workflow_names is None else sorted(set(workflow_names))
        return await self._run(
            _claim,
            worker_id,
            time_key(now),
            time_key(hold_until),
            max(limit, 0),
            served,
            sorted(queues, key=lambda queue: queue.name),
            self._stalls,
        )

    async def _hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, now: datetime, /
    ) -> bool:
        """Hold the deduplication id for the run, unless a live run holds it (`DueWork`)."""
        return await self._run(
            _hold_dedup_row,
            queue_name,
            dedup_id,
            run_id,
            time_key(now),
            time_key(now - DEDUP_GRACE),
        )
