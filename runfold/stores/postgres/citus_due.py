"""`claim_due` on a run-sharded Citus cluster: candidates read unlocked, each run held by its id.

On one server `claim_due` is one call of a server function whose statements lock candidate runs
`FOR UPDATE SKIP LOCKED` over joins; Citus refuses row locks in a statement that spans shards.
On a cluster the same rules are kept in three kinds of statement, none of which does:

- **Candidates** are read without locks, each source of work (orphans, due wakeups, each
  queue's queued runs) in its order, by multi-shard reads that join only tables distributed by
  `run_id` (the runs, their wakeups, their holds) on `run_id`; the live leases (a table on the
  coordinator) are read first and passed in as a list. A page that the limits leave short is
  followed by the next one (after the last key read), the queues at their limit left out.
- **Each candidate is claimed by its run id**, in a transaction of its own on the run's worker:
  its `runs` row locked `FOR UPDATE SKIP LOCKED` and rechecked (its last sequence and owner as
  read: nothing appended since), then the hold upserted as on one server, taking over only a
  hold that lapsed or that the run's history moved past. Of two claimers that read one run, the
  second finds it locked (and passes it over) or finds the first's hold (and takes nothing). A
  claim that fails is made up from the next candidates.
- **A queue with a limit** is counted under the same advisory lock as on one server, taken on
  the coordinator for the whole call (a session lock, released at its end): the counts of two
  claimers of one queue see each other's holds, each committed before the lock is released.
  Its starts (the rate limit) are kept on the coordinator.

Lapsed holds are not swept on a cluster (a multi-shard delete each call would lock shards);
a run keeps at most one hold row, taken over when it lapses, deleted with the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection, Sequence
from datetime import timedelta
from typing import Any

import attrs

from runfold.stores.due_work import DueReason, DueRun, Queue
from runfold.stores.postgres.connections import Connection
from runfold.stores.postgres.heads import derived

__all__ = ["Claim", "claim_due"]

_NOT_HELD = """LEFT JOIN {s}.due_holds h ON h.run_id = runs.run_id
        AND h.held_until > %(now)s AND h.at_sequence = runs.last_sequence"""
"""A run's live hold at its last sequence: none where `h.run_id IS NULL`."""

_OPEN = """h.run_id IS NULL
        AND (%(served)s::text[] IS NULL OR runs.workflow_name = ANY(%(served)s::text[]))
        AND (runs.queue_name IS NULL OR runs.queue_name <> ALL(%(full)s::text[]))"""
"""Not held, of a workflow served, not of a queue at the calling worker's limit."""

_COLUMNS = "runs.run_id, runs.last_sequence AS last_sequence, runs.owner_id, runs.queue_name"

_ORPHANS = f"""SELECT {_COLUMNS}, runs.updated_at AS updated_at FROM {{s}}.runs {_NOT_HELD}
    WHERE runs.owner_id IS NOT NULL AND runs.owner_id <> ALL(%(live)s::text[]) AND {_OPEN}
        {{after}}
    ORDER BY runs.updated_at, runs.run_id LIMIT %(page)s"""

_WAKEUPS = f"""SELECT {_COLUMNS}, due.due FROM {{s}}.runs
    JOIN (SELECT w.run_id, min(w.due_at) AS due FROM {{s}}.wakeups w
        WHERE w.due_at <= %(now)s GROUP BY w.run_id) due ON due.run_id = runs.run_id
    {_NOT_HELD}
    WHERE runs.owner_id IS NULL AND runs.status <> 'pending' AND {_OPEN} {{after}}
    ORDER BY due.due, runs.run_id LIMIT %(page)s"""

_QUEUED = f"""SELECT {_COLUMNS}, runs.priority, runs.created_at FROM {{s}}.runs {_NOT_HELD}
    WHERE runs.status = 'pending' AND runs.owner_id IS NULL AND {{queue}} AND {_OPEN} {{after}}
    ORDER BY runs.priority, runs.created_at, runs.run_id LIMIT %(page)s"""

_KEYS: dict[DueReason, tuple[str, ...]] = {
    "orphan": ("runs.updated_at",),
    "wakeup": ("due.due",),
    "queued": ("runs.priority", "runs.created_at"),
}
"""The order of each source's candidates (then `run_id`), to read the page after a key."""

_LOCK = """SELECT runs.run_id FROM {s}.runs WHERE runs.run_id = %(run)s
    AND runs.owner_id IS NOT DISTINCT FROM %(owner)s::text
    FOR UPDATE SKIP LOCKED"""
"""The candidate's runs row, locked, if its owner is the one read.

Without the head: Citus locks rows only in a statement without subqueries."""
_AT_SEQUENCE = """SELECT FROM {s}.runs WHERE runs.run_id = %(run)s
    AND runs.last_sequence = %(sequence)s"""
"""The candidate, if nothing was appended to it since it was read (`heads.derived`)."""

_HOLD = """INSERT INTO {s}.due_holds AS h (run_id, worker_id, held_until, at_sequence)
    VALUES (%(run)s, %(worker)s, %(until)s, %(sequence)s)
    ON CONFLICT (run_id) DO UPDATE SET worker_id = excluded.worker_id,
        held_until = excluded.held_until, at_sequence = excluded.at_sequence
    WHERE h.held_until <= %(now)s OR h.at_sequence <> excluded.at_sequence
    RETURNING h.run_id"""

_HOLDS_OF_WORKER = """CASE WHEN runs.owner_id = %(worker)s OR h.worker_id = %(worker)s
    THEN 1 ELSE 0 END"""

_OWN = f"""SELECT runs.queue_name, sum({_HOLDS_OF_WORKER}) FROM {{s}}.runs
    LEFT JOIN {{s}}.due_holds h ON h.run_id = runs.run_id
        AND h.held_until > %(now)s AND h.at_sequence = runs.last_sequence
    WHERE runs.queue_name = ANY(%(queues)s::text[]) AND runs.completed_at IS NULL
    GROUP BY runs.queue_name"""
"""What the worker owns or holds of each queue (its `worker_concurrency`)."""

_ACTIVE = f"""SELECT count(*), coalesce(sum({_HOLDS_OF_WORKER}), 0) FROM {{s}}.runs
    LEFT JOIN {{s}}.due_holds h ON h.run_id = runs.run_id
        AND h.held_until > %(now)s AND h.at_sequence = runs.last_sequence
    WHERE runs.queue_name = %(queue)s AND runs.completed_at IS NULL
        AND NOT (runs.status = 'pending' AND runs.owner_id IS NULL AND h.run_id IS NULL)"""
"""A queue's runs started (or held) and not ended, and those the worker owns or holds."""

_MICROSECOND = timedelta(microseconds=1)


@attrs.frozen(kw_only=True)
class Claim:
    """The arguments of one `claim_due` call, its times as time keys.

    `queues` are sorted by name; `locks` are the advisory lock keys of those with a limit,
    sorted (as on one server)."""

    worker: str
    now: int
    until: int
    limit: int
    served: list[str] | None
    queues: Sequence[Queue]
    locks: Sequence[int]


async def claim_due(conn: Connection, s: str, claim: Claim) -> list[DueRun]:
    """`claim_due` on a cluster (see the module); the runs handed out, in the order taken."""
    if claim.limit <= 0:
        return []
    async with _locked(conn, claim.locks):
        return await _Claimer(conn, s, claim).claim()


@contextlib.asynccontextmanager
async def _locked(conn: Connection, locks: Sequence[int]) -> AsyncIterator[None]:
    """The queues' advisory locks held on `conn`'s session, in order, for the block.

    A connection whose locks cannot be released is closed (its session ends, and its locks with
    it; the pool does not hand out a closed connection)."""
    if not locks:
        yield
        return
    keys = {"keys": list(locks)}
    try:
        await conn.execute("SELECT pg_advisory_lock(k) FROM unnest(%(keys)s::bigint[]) k", keys)
        yield
    finally:
        try:
            await conn.execute(
                "SELECT pg_advisory_unlock(k) FROM unnest(%(keys)s::bigint[]) k", keys
            )
        except BaseException:
            await conn.close()
            raise


class _Claimer:
    """One call's claims: what it took so far, and the room left in the limited queues."""

    def __init__(self, conn: Connection, s: str, claim: Claim) -> None:
        self._conn = conn
        self._s = s
        self._claim = claim
        self._taken: list[DueRun] = []
        self._params: dict[str, Any] = {
            "worker": claim.worker,
            "now": claim.now,
            "until": claim.until,
            "served": claim.served,
        }

    async def claim(self) -> list[DueRun]:
        """Orphans, then due wakeups, then each queue's queued runs, as on one server."""
        claim = self._claim
        cursor = await self._conn.execute(
            f"SELECT worker_id FROM {self._s}.leases WHERE lease_until > %(now)s", self._params
        )
        live = [row[0] for row in await cursor.fetchall()]
        await self._take("orphan", _ORPHANS, await self._rooms(), live=live)
        if self._need():
            await self._take("wakeup", _WAKEUPS, await self._rooms())
        for queue in (None, *claim.queues):
            if not self._need():
                break
            room = await self._room(queue)
            if room <= 0:
                continue
            where = "runs.queue_name IS NULL" if queue is None else "runs.queue_name = %(queue)s"
            name = None if queue is None else queue.name
            got = await self._take(
                "queued", _QUEUED.replace("{queue}", where), {}, room=room, queue=name
            )
            if queue is not None and got:
                await self._conn.execute(
                    f"INSERT INTO {self._s}.queue_starts (queue_name, started_at, run_id) "
                    "SELECT %(queue)s, %(now)s, unnest(%(runs)s::text[]) ON CONFLICT DO NOTHING",
                    {"queue": queue.name, "now": claim.now, "runs": got},
                )
        return self._taken

    def _need(self) -> int:
        return self._claim.limit - len(self._taken)

    async def _rooms(self) -> dict[str, int]:
        """Each queue's room under its `worker_concurrency`: what the worker owns or holds of
        it counted (a worker's limit counts the runs it resumes or takes over too)."""
        mine = {q.name: q.worker_concurrency for q in self._claim.queues if q.worker_concurrency}
        if not mine:
            return {}
        cursor = await self._conn.execute(
            derived(_OWN, self._s), {**self._params, "queues": sorted(mine)}
        )
        own = {name: int(count) for name, count in await cursor.fetchall()}
        return {name: limit - own.get(name, 0) for name, limit in mine.items()}

    async def _room(self, queue: Queue | None) -> int:
        """How many queued runs of `queue` (None: of no queue) the call may take now."""
        room = self._need()
        if queue is None:
            return room
        params = {**self._params, "queue": queue.name}
        if queue.concurrency is not None or queue.worker_concurrency is not None:
            cursor = await self._conn.execute(derived(_ACTIVE, self._s), params)
            row = await cursor.fetchone()
            assert row is not None
            active, own = int(row[0]), int(row[1])
            if queue.concurrency is not None:
                room = min(room, queue.concurrency - active)
            if queue.worker_concurrency is not None:
                room = min(room, queue.worker_concurrency - own)
        if queue.rate_limit is not None:
            params["since"] = self._claim.now - queue.rate_period // _MICROSECOND
            await self._conn.execute(
                f"DELETE FROM {self._s}.queue_starts "
                "WHERE queue_name = %(queue)s AND started_at <= %(since)s",
                params,
            )
            cursor = await self._conn.execute(
                f"SELECT count(*) FROM {self._s}.queue_starts WHERE queue_name = %(queue)s",
                params,
            )
            row = await cursor.fetchone()
            assert row is not None
            room = min(room, queue.rate_limit - int(row[0]))
        return room

    async def _take(
        self,
        reason: DueReason,
        query: str,
        rooms: dict[str, int],
        *,
        room: int | None = None,
        live: Collection[str] = (),
        queue: str | None = None,
    ) -> list[str]:
        """Claim candidates of one source in its order, up to `room` (or what the call still
        needs), within `rooms`; the run ids taken."""
        want = self._need() if room is None else min(room, self._need())
        keys = _KEYS[reason]
        bound = ", ".join(f"%(k{n})s" for n in range(len(keys)))
        later = f"AND ({', '.join(keys)}, runs.run_id) > ({bound}, %(k_run)s)"
        params = {**self._params, "live": list(live), "queue": queue}
        after: dict[str, Any] | None = None
        taken: list[str] = []
        while len(taken) < want:
            page = min(max(want - len(taken), 16), 1000)
            full = sorted(name for name, left in rooms.items() if left <= 0)
            sql = derived(query.format(s="{s}", after=later if after is not None else ""), self._s)
            cursor = await self._conn.execute(
                sql, {**params, **(after or {}), "full": full, "page": page}
            )
            rows = await cursor.fetchall()
            for run_id, sequence, owner, queue_name, *key in rows:
                if len(taken) == want:
                    break
                after = {f"k{n}": value for n, value in enumerate(key)} | {"k_run": run_id}
                if rooms.get(queue_name, 1) <= 0:
                    continue
                if await self._hold(run_id, sequence, owner):
                    taken.append(run_id)
                    displacing = owner if reason == "orphan" else None
                    self._taken.append(DueRun(run_id=run_id, reason=reason, displacing=displacing))
                    if queue_name in rooms:
                        rooms[queue_name] -= 1
            if len(rows) < page:
                break
        return taken

    async def _hold(self, run_id: str, sequence: int, owner: str | None) -> bool:
        """Hold the run for the worker, in a transaction on its worker node: whether it did."""
        params = {**self._params, "run": run_id, "sequence": sequence, "owner": owner}
        async with self._conn.transaction():
            for check in (_LOCK.format(s=self._s), derived(_AT_SEQUENCE, self._s)):
                cursor = await self._conn.execute(check, params)
                if await cursor.fetchone() is None:
                    return False
            cursor = await self._conn.execute(_HOLD.format(s=self._s), params)
            return await cursor.fetchone() is not None
