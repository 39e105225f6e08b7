"""Reads on the connection thread: a run's events, its head, and the rows of a query."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from runfold.kernel._gc import BULK, in_bulk

__all__ = ["fetch", "read_head", "read_rows"]


def fetch(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """The rows of `sql` with `params`."""
    return conn.execute(sql, params).fetchall()


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
