"""Reads on the connection thread: a run's events, its head, and the rows of a query."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from runfold.kernel.bulk import BULK, in_bulk
from runfold.stores._sql import run_events_query

__all__ = [
    "CHUNK",
    "LAST_SEQUENCE",
    "SUMMARY",
    "UPDATED_AT",
    "chunks",
    "fetch",
    "fetch_summaries",
    "read_head",
    "read_rows",
]

CHUNK = 500
"""Run ids bound to one statement at most: below every SQLite build's limit on parameters."""

LAST_SEQUENCE = (
    "coalesce((SELECT max(events.sequence) FROM events WHERE events.run_id = runs.run_id), "
    "runs.last_sequence)"
)
"""A runs row's last sequence, where a query names a row of `runs`.

It is the run's head in the events table (a search of their primary key).

An append writes the runs row only when the run's status, end time, owner or attributes change
(`index.write_index`): the row's own `last_sequence` and `updated_at` are those of that write,
and stand only for a run without events."""
UPDATED_AT = (
    "coalesce((SELECT CASE typeof(events.recorded_at) WHEN 'integer' THEN events.recorded_at END "
    "FROM events WHERE events.run_id = runs.run_id ORDER BY events.sequence DESC LIMIT 1), "
    "runs.updated_at)"
)
"""A runs row's time of last change: its run's last event's time (`LAST_SEQUENCE`).

An event row whose time is not an integer is the history's fault (`CorruptEvent` where it is
read), not the index's: the row's own time stands in for it."""
SUMMARY = (
    "runs.run_id, runs.workflow_name, runs.status, runs.parent_run_id, runs.created_at, "
    f"{UPDATED_AT} AS updated_at, runs.completed_at, {LAST_SEQUENCE} AS last_sequence, "
    "runs.attributes, runs.owner_id, runs.queue_name, runs.priority, runs.dedup_id"
)
"""`SUMMARY_COLUMNS` of a row of `runs` on SQLite: the head and its time from the events."""


def fetch(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of `sql` with `params`."""
    return conn.execute(sql, params).fetchall()


def chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    """`ids` in slices of at most `CHUNK`, each bound to one statement.

    Ids are bound one by one, never as a JSON array read with `json_each`: that would not give
    back an id holding a NUL character as it was.
    """
    for first in range(0, len(ids), CHUNK):
        yield ids[first : first + CHUNK]


def fetch_summaries(conn: sqlite3.Connection, run_ids: Sequence[str]) -> list[Any]:
    """The runs rows (`SUMMARY`) of `run_ids`, in no particular order."""
    return [
        row
        for chunk in chunks(run_ids)
        for row in conn.execute(
            f"SELECT {SUMMARY} FROM runs WHERE run_id IN ({', '.join('?' * len(chunk))})",
            chunk,
        )
    ]


def read_head(conn: sqlite3.Connection, run_id: str) -> int:
    """The run's last sequence; 0 for an unknown run."""
    row = conn.execute("SELECT max(sequence) FROM events WHERE run_id = ?", (run_id,)).fetchone()
    return int(row[0] or 0)


def read_rows(
    conn: sqlite3.Connection,
    run_id: str,
    correlation: str | None,
    after: int,
    limit: int | None,
    descending: bool,
) -> list[Any]:
    """The rows of the run's events (of one correlation id) after `after`, as `read` asks."""
    sql, params = run_events_query("events", "?", run_id, correlation, after, descending)
    params.append(-1 if limit is None else max(limit, 0))  # LIMIT -1: every row
    cursor = conn.execute(sql, params)
    # Without a limit the rows may be a whole long history: a tuple each, fetched with the
    # cycle collector paused (a read of a few rows pays a fraction of a microsecond for it).
    return in_bulk(BULK if limit is None else limit, cursor.fetchall)
