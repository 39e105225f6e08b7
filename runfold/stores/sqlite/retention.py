"""Retention on SQLite: deleting runs that ended, with all their rows, in one transaction."""

from __future__ import annotations

import sqlite3

from runfold.stores._sql import holds_at

__all__ = ["TERMINAL", "delete_ended_runs"]

TERMINAL = ("completed", "failed", "cancelled", "timed_out")
"""The statuses of runs that ended."""


def delete_ended_runs(
    conn: sqlite3.Connection, terminal_before: int, limit: int, run_ids: str | None
) -> int:
    """`run_ids`: a JSON array of the runs to choose from, or None for any."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        doomed = [
            row[0]
            for row in conn.execute(
                "SELECT run_id FROM runs WHERE completed_at IS NOT NULL AND completed_at < ? "
                f"AND status IN {TERMINAL!r} AND NOT EXISTS (SELECT 1 FROM hooks "
                f"WHERE hooks.run_id = runs.run_id AND {holds_at('?')}) "
                "AND (? IS NULL OR run_id IN (SELECT value FROM json_each(?))) "
                "ORDER BY completed_at, run_id LIMIT ?",
                (terminal_before, terminal_before, run_ids, run_ids, limit),
            )
        ]
        conn.execute(
            "UPDATE feed_high_water SET position = max(position, "
            "coalesce((SELECT max(position) FROM events), 0))"
        )
        for table in ("events", "hooks", "wakeups", "runs"):
            conn.executemany(f"DELETE FROM {table} WHERE run_id = ?", [(r,) for r in doomed])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(doomed)
