"""The SQLite append: one transaction of queued appends, each in its own savepoint.

`Append` is one queued append, encoded on the event loop; `append_batch` writes a batch of them
on the connection thread, each with its own outcome.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from runfold.kernel import (
    CommitUnknown,
    Envelope,
    Event,
    RunIndex,
    SequenceConflict,
    StoreError,
    StoreUnavailable,
    TokenConflict,
    correlation_id,
    encode_event,
    make_envelope,
)
from runfold.stores.sqlite.index import IndexRows, live_claims, write_index
from runfold.stores.sqlite.known import KnownRuns
from runfold.stores.sqlite.reads import read_head
from runfold.stores.time_keys import time_key

__all__ = ["Append", "append_batch", "settle", "settle_commit"]


class Append:
    """One queued append and the future its caller awaits."""

    __slots__ = (
        "deadline",
        "events",
        "expected",
        "expected_position",
        "future",
        "index",
        "recorded_at",
        "rows",
        "run_id",
    )

    def __init__(
        self,
        run_id: str,
        expected: int,
        events: Sequence[Event],
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None,
    ) -> None:
        self.run_id = run_id
        self.expected = expected
        self.expected_position = expected_position if expected > 0 else None
        self.events = events
        self.index = index
        self.recorded_at = recorded_at
        self.deadline = math.inf
        """The `time.monotonic()` by which it must be written (`SQLiteStore`'s call deadline)."""
        self.future: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        # Encode here, on the event loop, so a bad event fails before any SQL runs.
        self.rows = [_row(event) for event in events]

    def unknown(self, reason: str) -> CommitUnknown:
        """The error of this append when whether it was written is not known."""
        return CommitUnknown(self.run_id, self.expected, reason)


_COPIED = 4096
"""Payloads up to this many bytes are bound as a `bytearray` copy (see `_row`)."""


def _row(event: Event) -> tuple[str, int, bytes | bytearray, str | None]:
    """An event's row: its type, schema version, payload and correlation id.

    The driver binds a `bytearray` as a BLOB straight away, but looks a `bytes` object up in its
    adapter registry first, and fails to find one at a cost of several `bytearray` copies of a
    small payload.
    """
    event_type, version, payload = encode_event(event)
    if len(payload) <= _COPIED:
        return event_type, version, bytearray(payload), correlation_id(event)
    return event_type, version, payload, correlation_id(event)


def settle(request: Append, outcome: list[Envelope] | BaseException) -> None:
    """Hand a queued append its outcome."""
    if request.future.done():
        return
    if isinstance(outcome, BaseException):
        request.future.set_exception(outcome)
    else:
        request.future.set_result(outcome)


_RUN_STATE = (
    "SELECT (SELECT max(sequence) FROM events WHERE run_id = ?1), "
    "(SELECT position FROM events WHERE run_id = ?1 ORDER BY sequence DESC LIMIT 1), runs.status, "
    "runs.completed_at, runs.owner_id, runs.attributes, "
    "EXISTS (SELECT 1 FROM hooks WHERE run_id = ?1), "
    "EXISTS (SELECT 1 FROM wakeups WHERE run_id = ?1), "
    "max(coalesce((SELECT max(position) FROM events), 0), (SELECT position FROM feed_high_water)) "
    "FROM (SELECT 1) LEFT JOIN runs ON runs.run_id = ?1"
)
"""The run's head and its event's feed position; what its index rows hold now: status, end time,
owner and attributes (None without a runs row), and whether it has hook and wakeup rows; and the
last feed position handed out (retention may have deleted its event)."""


_INSERT_EVENT = (
    "INSERT INTO events (run_id, sequence, type, schema_version, correlation_id, payload, "
    "recorded_at, position) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _insert_events(count: int) -> str:
    """The statement that inserts `count` events, bound to `_append_one`'s parameters."""
    rows = ", ".join(
        f"(?1, ?2 + {n}, ?{4 * n + 1}, ?{4 * n + 2}, ?{4 * n + 4}, ?{4 * n + 3}, ?3, ?4 + {n})"
        for n in range(1, count + 1)
    )
    return (
        "INSERT INTO events (run_id, sequence, type, schema_version, correlation_id, payload, "
        f"recorded_at, position) VALUES {rows}"
    )


_INSERT_EVENTS = tuple(_insert_events(count) for count in range(1, 17))
"""`_INSERT_EVENTS[n - 1]` inserts `n` events in one statement, bound to the run id, its head,
the time and the last feed position, then each event's encoded row: one statement's start, bind
and reset instead of `executemany`'s one per row (about a sixth of the insert's instructions),
and no row of parameters built per event. An append of more events goes through `executemany`."""


def _append_one(cursor: sqlite3.Cursor, request: Append, known: KnownRuns | None) -> list[Envelope]:
    run_id = request.run_id
    run = None if known is None else known.get(run_id)
    if run is None or known is None or known.position is None:
        (
            last,
            head_position,
            status,
            completed_at,
            owner_id,
            attributes,
            has_hooks,
            has_wakeups,
            next_position,
        ) = cursor.execute(_RUN_STATE, (run_id,)).fetchone()
        head = last or 0
        before = IndexRows(
            status, completed_at, owner_id, attributes, bool(has_hooks), bool(has_wakeups)
        )
    else:
        head, head_position, before = run
        next_position = known.position
    if head != request.expected or (
        request.expected_position is not None and head_position != request.expected_position
    ):
        raise SequenceConflict(run_id, request.expected, head)
    now = time_key(request.recorded_at)
    claims = live_claims(cursor, run_id, request.index, request.recorded_at)
    count = len(request.rows)
    if 0 < count <= len(_INSERT_EVENTS):
        values: list[object] = [run_id, head, now, next_position]
        for row in request.rows:
            values.extend(row)
        cursor.execute(_INSERT_EVENTS[count - 1], values)
    else:
        cursor.executemany(
            _INSERT_EVENT,
            [
                (
                    run_id,
                    head + n,
                    event_type,
                    version,
                    correlation,
                    payload,
                    now,
                    next_position + n,
                )
                for n, (event_type, version, payload, correlation) in enumerate(
                    request.rows, start=1
                )
            ],
        )
    after = write_index(cursor, run_id, request.index, claims, before)
    if known is not None:
        known.wrote(run_id, (head + count, next_position + count, after), next_position + count)
    return [
        make_envelope(run_id, head + n, event, request.recorded_at, next_position + n)
        for n, event in enumerate(request.events, start=1)
    ]


def _refusal(conn: sqlite3.Connection, request: Append, exc: Exception) -> Exception:
    """What a refused append raises: a conflict as it is; an `IntegrityError` is a conflict
    only if the head moved (the primary key backs the head check), else something else refused
    the insert (a constraint or trigger of the user's), a `StoreError` that says so."""
    if not isinstance(exc, sqlite3.IntegrityError):
        return exc
    head = read_head(conn, request.run_id)
    if head != request.expected:
        return SequenceConflict(request.run_id, request.expected, head)
    refusal = StoreError(f"SQLite refused the append to {request.run_id!r}: {exc}")
    refusal.__cause__ = exc
    return refusal


def append_batch(
    conn: sqlite3.Connection, batch: list[Append], known: KnownRuns | None = None
) -> list[list[Envelope] | BaseException]:
    """Every queued append in one transaction, each with its own outcome.

    Most refusals (a conflict) come before an append writes anything, so a batch is first
    written without a savepoint per append (two statements each fewer); only if a refused
    append had changed rows (`total_changes` moved: an insert refused part way) is the
    transaction rolled back and the batch written again, each append in its own savepoint.

    Its statements share one cursor: `Connection.execute` makes and registers a new cursor for
    each statement, which costs about as much as a short statement itself.
    """
    if len(batch) > 1:
        outcomes = _write(conn, batch, known, savepoints=False)
        if outcomes is not None:
            return outcomes
    written = _write(conn, batch, known, savepoints=len(batch) > 1)
    assert written is not None  # with savepoints (or alone), every refusal is undone
    return written


def _write(
    conn: sqlite3.Connection, batch: list[Append], known: KnownRuns | None, *, savepoints: bool
) -> list[list[Envelope] | BaseException] | None:
    """`append_batch`'s transaction; None (rolled back) if, without `savepoints`, a refused
    append of several had changed rows that only a savepoint could undo."""
    outcomes: list[list[Envelope] | BaseException] = []
    cursor = conn.cursor()
    cursor.execute("BEGIN IMMEDIATE")
    try:
        if known is not None:
            known.begin(cursor)
        # A lone append needs no savepoint: if it fails, the transaction holds nothing else.
        alone = len(batch) == 1
        for request in batch:
            if savepoints:
                cursor.execute("SAVEPOINT one_append")
            changes = conn.total_changes
            try:
                envelopes = _append_one(cursor, request, known)
            except (SequenceConflict, TokenConflict, sqlite3.IntegrityError) as exc:
                if alone:
                    cursor.execute("ROLLBACK")
                elif savepoints:
                    cursor.execute("ROLLBACK TO one_append")
                    cursor.execute("RELEASE one_append")
                elif conn.total_changes != changes:
                    cursor.execute("ROLLBACK")
                    if known is not None:
                        known.forget()
                    return None
                outcomes.append(_refusal(conn, request, exc))
                continue
            if savepoints:
                cursor.execute("RELEASE one_append")
            outcomes.append(envelopes)
        if conn.in_transaction:  # a lone append that failed has rolled it back already
            try:
                cursor.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    raise  # still open: rolled back below, nothing was written
                if known is not None:
                    known.forget()
                return settle_commit(conn, batch, outcomes, exc)
            if known is not None:
                known.committed(conn)
    except BaseException:
        if known is not None:
            known.forget()
        if conn.in_transaction:
            cursor.execute("ROLLBACK")
        raise
    return outcomes


_WRITTEN = (
    "SELECT type, schema_version, payload, correlation_id, recorded_at FROM events "
    "WHERE run_id = ? AND sequence > ? ORDER BY sequence LIMIT ?"
)


def settle_commit(
    conn: sqlite3.Connection,
    batch: list[Append],
    outcomes: list[list[Envelope] | BaseException],
    error: sqlite3.Error,
) -> list[list[Envelope] | BaseException]:
    """The outcomes of `batch` after its `COMMIT` raised `error` and ended the transaction.

    Whether it committed is unknown, so each append meant to be written is read back: its own
    rows at `expected + 1 …` mean it was (its envelopes stand); else it was not
    (`StoreUnavailable`). A file that cannot be read gives `CommitUnknown`.
    """
    settled: list[list[Envelope] | BaseException] = []
    for request, outcome in zip(batch, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            settled.append(outcome)  # refused before the commit
            continue
        stamp = time_key(request.recorded_at)
        try:
            rows = conn.execute(_WRITTEN, (request.run_id, request.expected, len(request.rows)))
            found = [tuple(row) for row in rows.fetchall()]
        except sqlite3.Error as again:
            unknown = CommitUnknown(request.run_id, request.expected, f"{error}; then {again}")
            settled.append(unknown)
            continue
        if found == [(*row, stamp) for row in request.rows]:
            settled.append(outcome)
        else:
            settled.append(
                StoreUnavailable(
                    f"SQLite could not commit the append to {request.run_id!r}: {error}; it "
                    "was not written"
                )
            )
    return settled
