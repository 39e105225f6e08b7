"""Retention on SQLite: deleting runs that ended, with all their rows, in one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from runfold.stores._sql import holds_at
from runfold.stores.sqlite.reads import chunks

__all__ = ["ENDED_RUNS", "TERMINAL", "chosen_ended_runs", "delete_ended_runs"]

TERMINAL = ("completed", "failed", "cancelled", "timed_out")
"""The statuses of runs that ended."""


_ENDED = (
    f"completed_at IS NOT NULL AND completed_at < ?1 AND status IN {TERMINAL!r} "
    "AND NOT EXISTS (SELECT 1 FROM hooks WHERE hooks.run_id = runs.run_id "
    f"AND {holds_at('?1')})"
)

ENDED_RUNS = (
    f"SELECT run_id FROM runs INDEXED BY runs_ended WHERE {_ENDED} "
    "ORDER BY completed_at, runs.run_id LIMIT ?2"
)
"""The runs `delete_runs` deletes: up to `?2` that ended before `?1`, retaining no token past it.

`INDEXED BY` holds the planner to the partial index of ended runs, in the order it wants them,
whatever its statistics say: without them, it would walk every finished run by status and sort
them, inside the write transaction every append on the file waits behind.
"""


def chosen_ended_runs(count: int) -> str:
    """`ENDED_RUNS` among `count` distinct runs bound as `?2`, `?3`, …, each found by its key.

    It gives `(completed_at, run_id)` rows, unordered and unlimited. The ids are bound one by
    one: a JSON array read with `json_each` would not give back an id holding a NUL character
    as it was.
    """
    marks = ", ".join(f"?{number}" for number in range(2, count + 2))
    return f"SELECT completed_at, run_id FROM runs WHERE run_id IN ({marks}) AND {_ENDED}"


def _delete_rows(conn: sqlite3.Connection, doomed: list[str]) -> None:
    """Delete every row of the runs `doomed`, one statement per table for each `reads.CHUNK` runs.

    Not one statement per run: SQLite sorts an `IN` list first and deletes in key order, and the
    driver binds and steps once per table instead of once per run (at scale, most of a batch's
    CPU went to those per-run statements). The ids are bound as parameters, not as a JSON
    array: `json_each` does not give back an id holding a NUL character as it was.
    """
    for chunk in chunks(doomed):
        marks = ", ".join("?" * len(chunk))
        for table in ("events", "hooks", "wakeups", "runs"):
            conn.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", chunk)


def delete_ended_runs(
    conn: sqlite3.Connection, terminal_before: int, limit: int, run_ids: Sequence[str] | None
) -> int:
    """Delete the runs `ENDED_RUNS` selects, with all their rows; how many.

    `run_ids`: the distinct runs to choose from (`chosen_ended_runs`), or None for any.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        if run_ids is None:
            doomed = [row[0] for row in conn.execute(ENDED_RUNS, (terminal_before, limit))]
        else:  # oldest first among the chosen, as `ENDED_RUNS` orders them
            ended = [
                row
                for chunk in chunks(run_ids)
                for row in conn.execute(chosen_ended_runs(len(chunk)), (terminal_before, *chunk))
            ]
            doomed = [run_id for _, run_id in sorted(ended)[:limit]]
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
