"""Retention on SQLite: deleting runs that ended, with all their rows, in one transaction."""

from __future__ import annotations

import sqlite3

from runfold.stores._sql import holds_at

__all__ = ["CHOSEN_ENDED_RUNS", "ENDED_RUNS", "TERMINAL", "delete_ended_runs"]

TERMINAL = ("completed", "failed", "cancelled", "timed_out")
"""The statuses of runs that ended."""


_ENDED = (
    f"completed_at IS NOT NULL AND completed_at < ?1 AND status IN {TERMINAL!r} "
    "AND NOT EXISTS (SELECT 1 FROM hooks WHERE hooks.run_id = runs.run_id "
    f"AND {holds_at('?1')}) ORDER BY completed_at, runs.run_id LIMIT ?2"
)

ENDED_RUNS = f"SELECT run_id FROM runs INDEXED BY runs_ended WHERE {_ENDED}"
"""The runs `delete_runs` deletes: up to `?2` that ended before `?1`, retaining no token past it.

`INDEXED BY` holds the planner to the partial index of ended runs, in the order it wants them,
whatever its statistics say: without them, it would walk every finished run by status and sort
them, inside the write transaction every append on the file waits behind.
"""

CHOSEN_ENDED_RUNS = (
    "SELECT runs.run_id FROM json_each(?3) AS chosen CROSS JOIN runs "
    f"ON runs.run_id = chosen.value WHERE {_ENDED}"
)
"""`ENDED_RUNS` among the runs of the JSON array `?3` (distinct ids), each found by its key.

`CROSS JOIN` makes SQLite read the chosen ids first, whatever its statistics.
"""


CHUNK = 500
"""Run ids bound to one DELETE at most: below every SQLite build's limit on parameters."""


def _delete_rows(conn: sqlite3.Connection, doomed: list[str]) -> None:
    """Delete every row of the runs `doomed`, one statement per table for each `CHUNK` runs.

    Not one statement per run: SQLite sorts an `IN` list first and deletes in key order, and the
    driver binds and steps once per table instead of once per run (at scale, most of a batch's
    CPU went to those per-run statements). The ids are bound as parameters, not as a JSON
    array: `json_each` does not give back an id holding a NUL character as it was.
    """
    for first in range(0, len(doomed), CHUNK):
        chunk = doomed[first : first + CHUNK]
        marks = ", ".join("?" * len(chunk))
        for table in ("events", "hooks", "wakeups", "runs"):
            conn.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", chunk)


def delete_ended_runs(
    conn: sqlite3.Connection, terminal_before: int, limit: int, run_ids: str | None
) -> int:
    """Delete the runs `ENDED_RUNS` selects, with all their rows; how many.

    `run_ids`: a JSON array of the distinct runs to choose from (`CHOSEN_ENDED_RUNS`), or None
    for any.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        if run_ids is None:
            found = conn.execute(ENDED_RUNS, (terminal_before, limit))
        else:
            found = conn.execute(CHOSEN_ENDED_RUNS, (terminal_before, limit, run_ids))
        doomed = [row[0] for row in found]
        conn.execute(
            "UPDATE feed_high_water SET position = max(position, "
            "coalesce((SELECT max(position) FROM events), 0))"
        )
        _delete_rows(conn, doomed)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(doomed)
