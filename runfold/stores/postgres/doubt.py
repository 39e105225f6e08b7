"""Appends whose outcome is unknown, settled by reading the runs back before anyone decides.

An append whose connection is lost after it was sent (the reply lost, the server restarted, a
deadline passed) may or may not have committed. `settle` finds out on another connection:

1. It waits until the server backend that ran the append has ended, when it can tell that
   backend is on the server it reaches now (same host and port, same process id still listed in
   `pg_stat_activity`). A backend that has ended has committed or rolled back for good: an
   append still queued in its socket can no longer commit after the answer is read.
2. It reads each run's events after the head the append was fenced on. The append is
   recognised by what it wrote: the same event types, schema versions, payload bytes and
   `recorded_at`, at sequences `expected + 1 …`. Recognised, the append succeeded (its base
   position is read back); not there, nothing of it was written: `SequenceConflict` when the
   run's head is elsewhere now, else `StoreUnavailable` (retrying is safe).
3. When neither can be known by the deadline (the database still unreachable, the old backend
   still alive), the append is `CommitUnknown`.

Another server (a failover promoted a standby) has no trace of the old backend: what it holds
is what survived, so it is read at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import psycopg

from runfold.kernel import CommitUnknown, SequenceConflict, StoreUnavailable
from runfold.stores.postgres.connections import Connection, Connections, Deadline, Identity
from runfold.stores.postgres.heads import HEAD
from runfold.stores.postgres.request import AppendRequest
from runfold.stores.postgres.schema import quote
from runfold.stores.time_keys import time_key

__all__ = ["SETTLE_GRACE", "settle"]

SETTLE_GRACE = 0.5
"""Seconds past an append's deadline that settling its fate may take at most."""
_POLL = 0.02
"""Seconds between two looks at the old backend, or two tries to reach the server."""


async def settle(
    connections: Connections,
    schema: str,
    requests: Sequence[AppendRequest],
    identity: Identity | None,
    deadline: float,
) -> list[int | Exception]:
    """The outcome of each of `requests`, sent together on a connection that was lost.

    Each is its base position (written), `SequenceConflict` or `StoreUnavailable` (not
    written), or `CommitUnknown` (not known by loop time `deadline`).
    """
    loop = asyncio.get_running_loop()
    outcomes: dict[int, int | Exception] = {}
    reason = "the database could not be reached to read the run back"
    while True:
        conn: Connection | None = None
        try:
            async with Deadline(deadline, "settling an append"):
                conn = await connections.getconn()
                try:
                    ended = await _backend_ended(conn, identity, deadline)
                    await _read_back(conn, quote(schema), requests, ended, outcomes)
                finally:
                    await connections.putconn(conn)
            if len(outcomes) == len(requests):
                return [outcomes[n] for n in range(len(requests))]
            reason = "the connection that sent it may still commit it"
        except (psycopg.Error, StoreUnavailable) as exc:
            if isinstance(exc, psycopg.Error):
                connections.translate(exc)  # lets the pool test its connections
        if loop.time() + _POLL >= deadline:
            break
        await asyncio.sleep(_POLL)
    return [
        outcomes[n] if n in outcomes else CommitUnknown(request.run_id, request.expected, reason)
        for n, request in enumerate(requests)
    ]


async def _backend_ended(conn: Connection, identity: Identity | None, deadline: float) -> bool:
    """Whether the backend `identity` names has ended (or is on another server), waiting for
    it until `deadline`."""
    if identity is None:
        return False
    pid, host, port = identity
    if (conn.info.host, conn.info.port) != (host, port):
        return True  # another server: the old one's backend cannot write here
    loop = asyncio.get_running_loop()
    while True:
        cursor = await conn.execute(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", (pid,)
        )
        row = await cursor.fetchone()
        if row is not None and not row[0]:
            return True
        if loop.time() + _POLL >= deadline:
            return False
        await asyncio.sleep(_POLL)


async def _read_back(
    conn: Connection,
    s: str,
    requests: Sequence[AppendRequest],
    ended: bool,
    outcomes: dict[int, int | Exception],
) -> None:
    """Settle each of `requests` not in `outcomes` yet that the runs' events settle."""
    for n, request in enumerate(requests):
        if n in outcomes:
            continue
        cursor = await conn.execute(
            f"SELECT type, schema_version, payload, recorded_at, position FROM {s}.events "
            "WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s",
            (request.run_id, request.expected, max(request.count, 1)),
            binary=True,
        )
        rows = await cursor.fetchall()
        stamp = time_key(request.recorded_at)
        sent = [(kind, version, payload, stamp) for kind, version, payload in request.encoded]
        if request.count and [tuple(row[:4]) for row in rows] == sent:
            outcomes[n] = int(rows[0][4]) - 1
            continue
        if not ended:
            continue
        cursor = await conn.execute(HEAD.format(s=s), (request.run_id,))
        row = await cursor.fetchone()
        head = int(row[0]) if row is not None else 0
        if head != request.expected:
            outcomes[n] = SequenceConflict(request.run_id, request.expected, head)
        else:
            outcomes[n] = StoreUnavailable(
                f"PostgreSQL: the connection was lost; the append to {request.run_id!r} at "
                f"sequence {request.expected + 1} was not written"
            )
