"""`PostgresDueWork`: `claim_due` and `hold_dedup` of `PostgresStore` (`DueWork`).

A part of `PostgresStore` kept apart so that each module holds one idea. A claim is one call of
the server function `claim_due`: each source of work (orphans, due wakeups, queued runs of each
queue) is read through its index, its rows locked `FOR UPDATE SKIP LOCKED` (what another
claimer is taking is passed over, never waited for), and held with an upsert that takes over
only a hold that lapsed or that the run's history moved past: of two claimers that read one
run, the second's upsert finds the first's hold and takes nothing. A queue with a limit is
counted under a transaction lock of its own, taken first, so that the counts of two claimers
of one queue see each other's holds (each statement of the function reads what committed
before it). `{s}` is the quoted schema name.

Its statements run on generic plans (`plan_cache_mode`), planned once per connection: left to
choose, the server would plan the queued runs' statement anew on every call (its `LIMIT` is a
variable, so a generic plan looks dear to it), which cost more than running it. Each statement
is written so that its generic plan reads its index (see `_QUEUED`), but for the due wakeups'
one, which needs plans for its `now` and is left to choose. Orphans and due wakeups are looked
for first (`_ORPHANED`; the earliest wakeup, read off `wakeups_due` whatever `now` is, where a
generic plan of `EXISTS (... due_at <= now)` could scan every wakeup not due): most calls find
neither and skip their statements.

A distributed schema (a Citus cluster) claims through `citus_due` instead: Citus refuses row
locks in a statement over several shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any

from runfold.stores.due_work import (
    DEDUP_GRACE,
    DueRun,
    DueWorkBase,
    Queue,
)
from runfold.stores.postgres import citus_due
from runfold.stores.postgres.connections import Connection
from runfold.stores.postgres.heads import derived
from runfold.stores.time_keys import time_key

__all__ = ["PostgresDueWork", "claim_due_function"]

_NOT_HELD = """NOT EXISTS (SELECT 1 FROM {s}.due_holds h WHERE h.run_id = runs.run_id
            AND h.held_until > p_now AND h.at_sequence = runs.last_sequence)"""

_HOLD = """held AS (
            INSERT INTO {s}.due_holds AS h (run_id, worker_id, held_until, at_sequence)
            SELECT picked.run_id, p_worker, p_until, picked.last_sequence FROM picked
            ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,
                held_until = excluded.held_until, at_sequence = excluded.at_sequence
            WHERE h.held_until <= p_now OR h.at_sequence <> excluded.at_sequence
            RETURNING h.run_id
        )"""

_MICROSECOND = timedelta(microseconds=1)


def _lock_key(name: str) -> int:
    """The transaction lock of a queue's counts: a signed 64-bit digest of its name."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), signed=True)


_ROOMS = """FOR i IN 1 .. coalesce(cardinality(p_queues), 0) LOOP
            IF p_mine[i] IS NOT NULL THEN
                SELECT count(*) INTO v_own
                FROM {s}.runs LEFT JOIN {s}.due_holds h ON h.run_id = runs.run_id
                    AND h.held_until > p_now AND h.at_sequence = runs.last_sequence
                WHERE runs.queue_name = p_queues[i] AND runs.completed_at IS NULL
                    AND (runs.owner_id = p_worker OR h.worker_id = p_worker);
                v_rooms[i] := p_mine[i] - v_own;
            END IF;
        END LOOP;"""
"""Each queue's room under its `worker_concurrency`: what the worker owns or holds of it counted
(a worker's limit counts the runs of the queue it resumes or takes over too)."""

_ORPHANED = """EXISTS (
            WITH RECURSIVE owners (id) AS (
                (SELECT runs.owner_id FROM {s}.runs WHERE runs.owner_id IS NOT NULL
                    ORDER BY runs.owner_id LIMIT 1)
                UNION ALL
                SELECT (SELECT runs.owner_id FROM {s}.runs WHERE runs.owner_id > owners.id
                    ORDER BY runs.owner_id LIMIT 1)
                FROM owners WHERE owners.id IS NOT NULL
            )
            SELECT 1 FROM owners WHERE owners.id IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM {s}.leases
                WHERE leases.worker_id = owners.id AND leases.lease_until > p_now)
        )"""
"""Whether any run has an owner whose lease lapsed or is gone: the owners of live runs listed
one by one down the index `runs_owner` (a skip scan: as many probes as owners, not as many as
runs they own), each looked up among the leases. Most looks find none and skip the orphans'
statement, which reads every owned run."""

_SERVED = "(p_served IS NULL OR runs.workflow_name = ANY(p_served))"

_QUEUED = """RETURN QUERY WITH picked AS (
                    SELECT runs.run_id, runs.last_sequence AS last_sequence, runs.priority,
                        runs.created_at
                    FROM {s}.runs
                    WHERE runs.status = 'pending' AND runs.owner_id IS NULL
                        AND runs.queue_name {queue} AND {served} AND {not_held}
                    ORDER BY runs.queue_name, runs.priority, runs.created_at, runs.run_id
                    LIMIT v_room FOR UPDATE OF runs SKIP LOCKED
                ), {hold}{started}
                SELECT held.run_id, 'queued'::text, NULL::text
                FROM held JOIN picked ON picked.run_id = held.run_id
                ORDER BY picked.priority, picked.created_at, held.run_id;"""
"""The queued runs of one queue (`{queue}`: `IS NULL` for runs on none, `= v_queue`), taken in
the order of the index `runs_queued`, which the statement reads only as far as it takes runs.
One statement for both would match `queue_name` by an `OR` no index serves; and the order names
`queue_name` (one value here) since the planner takes `IS NULL` for no constant, and would sort
instead: either way every queued run would be read, checked and sorted on each call."""

_STARTED = """, started AS (
                    INSERT INTO {s}.queue_starts (queue_name, started_at, run_id)
                    SELECT v_queue, p_now, held.run_id FROM held
                    ON CONFLICT DO NOTHING
                )"""


def claim_due_function(s: str) -> str:
    """The server function `claim_due` in schema `s` (see the module)."""
    not_held, hold = _NOT_HELD.format(s=s), _HOLD.format(s=s)
    rooms, orphaned = _ROOMS.format(s=s), _ORPHANED.format(s=s)
    unnamed, named = (
        _QUEUED.format(
            s=s, queue=queue, served=_SERVED, not_held=not_held, hold=hold, started=started
        )
        for queue, started in (("IS NULL", ""), ("= v_queue", _STARTED.format(s=s)))
    )
    sql = f"""
    CREATE OR REPLACE FUNCTION {s}.claim_due(
        p_worker text, p_now bigint, p_until bigint, p_limit integer, p_served text[],
        p_queues text[], p_locks bigint[], p_concurrency integer[], p_mine integer[],
        p_rate integer[], p_period bigint[])
    RETURNS TABLE (run_id text, reason text, displacing text)
    LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
    #variable_conflict use_column
    DECLARE
        v_count integer := 0;
        v_got integer;
        v_room integer;
        v_queue text;
        v_active integer;
        v_own integer;
        v_started integer;
        v_lock bigint;
        v_rooms integer[] := array_fill(NULL::integer, ARRAY[coalesce(cardinality(p_queues), 0)]);
    BEGIN
        FOREACH v_lock IN ARRAY coalesce(p_locks, '{{}}') LOOP
            PERFORM pg_advisory_xact_lock(v_lock);
        END LOOP;
        DELETE FROM {s}.due_holds WHERE held_until <= p_now;
        IF {orphaned} THEN
        {rooms}
        RETURN QUERY WITH cand AS (
            SELECT runs.run_id, runs.updated_at AS updated_at, q.room, row_number() OVER (
                PARTITION BY runs.queue_name ORDER BY runs.updated_at, runs.run_id) AS n
            FROM {s}.runs
            LEFT JOIN {s}.leases ON leases.worker_id = runs.owner_id
            LEFT JOIN unnest(p_queues, v_rooms) AS q(name, room) ON q.name = runs.queue_name
            WHERE runs.owner_id IS NOT NULL
                AND (leases.worker_id IS NULL OR leases.lease_until <= p_now)
                AND {_SERVED} AND {not_held}
        ), allowed AS (
            SELECT cand.run_id, cand.updated_at FROM cand
            WHERE cand.room IS NULL OR cand.n <= cand.room
            ORDER BY cand.updated_at, cand.run_id LIMIT p_limit
        ), picked AS (
            SELECT runs.run_id, runs.last_sequence AS last_sequence, runs.owner_id FROM {s}.runs
            JOIN allowed ON allowed.run_id = runs.run_id
            FOR UPDATE OF runs SKIP LOCKED
        ), {hold}
        SELECT held.run_id, 'orphan'::text, picked.owner_id
        FROM held JOIN picked ON picked.run_id = held.run_id
        JOIN allowed ON allowed.run_id = held.run_id
        ORDER BY allowed.updated_at, held.run_id;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_count := v_count + v_got;
        END IF;
        IF v_count < p_limit
            AND (SELECT min(w.due_at) FROM {s}.wakeups w) <= p_now THEN
            PERFORM set_config('plan_cache_mode', 'auto', true);
            {rooms}
            RETURN QUERY WITH due AS (
                SELECT w.run_id, min(w.due_at) AS due FROM {s}.wakeups w
                WHERE w.due_at <= p_now GROUP BY w.run_id
            ), cand AS (
                SELECT runs.run_id, due.due, q.room, row_number() OVER (
                    PARTITION BY runs.queue_name ORDER BY due.due, runs.run_id) AS n
                FROM {s}.runs JOIN due ON due.run_id = runs.run_id
                LEFT JOIN unnest(p_queues, v_rooms) AS q(name, room) ON q.name = runs.queue_name
                WHERE runs.owner_id IS NULL AND runs.status <> 'pending'
                    AND {_SERVED} AND {not_held}
            ), allowed AS (
                SELECT cand.run_id, cand.due FROM cand
                WHERE cand.room IS NULL OR cand.n <= cand.room
                ORDER BY cand.due, cand.run_id LIMIT p_limit - v_count
            ), picked AS (
                SELECT runs.run_id, runs.last_sequence AS last_sequence FROM {s}.runs
                JOIN allowed ON allowed.run_id = runs.run_id
                FOR UPDATE OF runs SKIP LOCKED
            ), {hold}
            SELECT held.run_id, 'wakeup'::text, NULL::text
            FROM held JOIN allowed ON allowed.run_id = held.run_id
            ORDER BY allowed.due, held.run_id;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_count := v_count + v_got;
            PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
        END IF;
        FOR i IN 0 .. coalesce(cardinality(p_queues), 0) LOOP
            EXIT WHEN v_count >= p_limit;
            v_room := p_limit - v_count;
            v_queue := CASE WHEN i > 0 THEN p_queues[i] END;
            IF v_queue IS NOT NULL THEN
                SELECT count(*), count(*) FILTER (
                    WHERE runs.owner_id = p_worker OR h.worker_id = p_worker)
                INTO v_active, v_own
                FROM {s}.runs LEFT JOIN {s}.due_holds h ON h.run_id = runs.run_id
                    AND h.held_until > p_now AND h.at_sequence = runs.last_sequence
                WHERE runs.queue_name = v_queue AND runs.completed_at IS NULL
                    AND NOT (runs.status = 'pending' AND runs.owner_id IS NULL
                        AND h.run_id IS NULL);
                IF p_concurrency[i] IS NOT NULL THEN
                    v_room := least(v_room, p_concurrency[i] - v_active);
                END IF;
                IF p_mine[i] IS NOT NULL THEN
                    v_room := least(v_room, p_mine[i] - v_own);
                END IF;
                IF p_rate[i] IS NOT NULL THEN
                    DELETE FROM {s}.queue_starts
                    WHERE queue_name = v_queue AND started_at <= p_now - p_period[i];
                    SELECT count(*) INTO v_started FROM {s}.queue_starts
                    WHERE queue_name = v_queue;
                    v_room := least(v_room, p_rate[i] - v_started);
                END IF;
            END IF;
            CONTINUE WHEN v_room <= 0;
            IF v_queue IS NULL THEN
                {unnamed}
            ELSE
                {named}
            END IF;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_count := v_count + v_got;
        END LOOP;
    END;
    $$;
    """
    return derived(sql, s)  # the head from the events (`heads`)


HOLD_DEDUP = """
INSERT INTO {s}.queue_dedups AS d (queue_name, dedup_id, run_id, held_at)
VALUES (%(queue)s, %(dedup)s, %(run)s, %(now)s)
ON CONFLICT (queue_name, dedup_id) DO UPDATE SET run_id = excluded.run_id,
    held_at = excluded.held_at
WHERE d.run_id = excluded.run_id
    OR EXISTS (SELECT 1 FROM {s}.runs WHERE runs.run_id = d.run_id
        AND runs.completed_at IS NOT NULL)
    OR (NOT EXISTS (SELECT 1 FROM {s}.runs WHERE runs.run_id = d.run_id)
        AND d.held_at <= %(grace)s)
RETURNING true
"""
"""Hold a deduplication id: a row when it did, none when a live run holds it."""


class PostgresDueWork(DueWorkBase):
    """The `DueWork` methods of `PostgresStore`, over its pooled connections."""

    __slots__ = ()

    _s: str
    _fetch: Callable[..., Awaitable[list[tuple[Any, ...]]]]
    _distributed: bool
    _cluster_connection: Callable[[], AbstractAsyncContextManager[Connection]]

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
        chosen = sorted(queues, key=lambda queue: queue.name)
        limited = [q for q in chosen if q.concurrency or q.worker_concurrency or q.rate_limit]
        locks = sorted(_lock_key(f"runfold queue {self._s} {queue.name}") for queue in limited)
        if self._distributed:
            claim = citus_due.Claim(
                worker=worker_id,
                now=time_key(now),
                until=time_key(hold_until),
                limit=limit,
                served=None if workflow_names is None else sorted(set(workflow_names)),
                queues=chosen,
                locks=locks,
            )
            async with self._cluster_connection() as conn:
                return await citus_due.claim_due(conn, self._s, claim)
        rows = await self._fetch(
            f"SELECT run_id, reason, displacing FROM {self._s}.claim_due("
            "%(worker)s, %(now)s, %(until)s, %(limit)s, %(served)s::text[], %(queues)s::text[], "
            "%(locks)s::bigint[], %(concurrency)s::integer[], %(mine)s::integer[], "
            "%(rate)s::integer[], %(period)s::bigint[])",
            {
                "worker": worker_id,
                "now": time_key(now),
                "until": time_key(hold_until),
                "limit": min(max(limit, 0), 2**31 - 1),
                "served": None if workflow_names is None else sorted(set(workflow_names)),
                "queues": [queue.name for queue in chosen],
                "locks": locks,
                "concurrency": [queue.concurrency for queue in chosen],
                "mine": [queue.worker_concurrency for queue in chosen],
                "rate": [queue.rate_limit for queue in chosen],
                "period": [queue.rate_period // _MICROSECOND for queue in chosen],
            },
        )
        return [
            DueRun(run_id=run_id, reason=reason, displacing=displacing)
            for run_id, reason, displacing in rows
        ]

    async def _hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, now: datetime, /
    ) -> bool:
        """Hold the deduplication id for the run, unless a live run holds it (`DueWork`)."""
        rows = await self._fetch(
            HOLD_DEDUP.format(s=self._s),
            {
                "queue": queue_name,
                "dedup": dedup_id,
                "run": run_id,
                "now": time_key(now),
                "grace": time_key(now - DEDUP_GRACE),
            },
        )
        return bool(rows)
