"""Reads on the connection thread: a run's events, its head, and the rows of a query."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from runfold.kernel.bulk import BULK, in_bulk
from runfold.stores._sql import SUMMARY_COLUMNS

__all__ = ["CHUNK", "chunks", "fetch", "fetch_summaries", "read_head", "read_rows"]

CHUNK = 500
"""Run ids bound to one statement at most: below every SQLite build's limit on parameters."""


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
    """The runs rows (`SUMMARY_COLUMNS`) of `run_ids`, in no particular order."""
    return [
        row
        for chunk in chunks(run_ids)
        for row in conn.execute(
            f"SELECT {SUMMARY_COLUMNS} FROM runs WHERE run_id IN ({', '.join('?' * len(chunk))})",
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
    clauses = ["run_id = ?"]
    params: list[Any] = [run_id]
    if correlation is not None:
        clauses.append("correlation_id = ?")
        params.append(correlation)
    if descending:
        if after > 0:
            clauses.append("sequence < ?")
            params.append(after)
    else:
        clauses.append("sequence > ?")
        params.append(after)
    params.append(-1 if limit is None else max(limit, 0))
    cursor = conn.execute(
        "SELECT sequence, type, schema_version, payload, recorded_at, position "
        f"FROM events WHERE {' AND '.join(clauses)} "
        f"ORDER BY sequence {'DESC' if descending else 'ASC'} LIMIT ?",
        params,
    )
    # Without a limit the rows may be a whole long history: a tuple each, fetched with the
    # cycle collector paused (a read of a few rows pays a fraction of a microsecond for it).
    return in_bulk(BULK if limit is None else limit, cursor.fetchall)
