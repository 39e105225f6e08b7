"""Where the PostgreSQL store reads a run's head: from its last event, not from its runs row.

An append writes the runs row only when a field the row holds for itself changes (status, end
time, owner, attributes, the fixed fields of a repair, whether it has hook or wakeup rows): its
head is its last event, which the events' primary key `(run_id, sequence)` finds in one search,
and which that key keeps from being written twice. The row's `head`, `head_position`,
`last_sequence` and `updated_at` are those of the row's last write, and stand only for a run
without events. `{s}` is the quoted schema name; `runs` names the row of the `runs` table.
"""

from __future__ import annotations

__all__ = ["HEAD", "LAST_SEQUENCE", "UPDATED_AT", "derived", "summary_columns"]

LAST_SEQUENCE = (
    "coalesce((SELECT max(e.sequence) FROM {s}.events e WHERE e.run_id = runs.run_id), "
    "runs.last_sequence)"
)
"""A runs row's last sequence: its run's last event's (`runs.last_sequence` without events)."""

UPDATED_AT = (
    "coalesce((SELECT e.recorded_at FROM {s}.events e WHERE e.run_id = runs.run_id "
    "ORDER BY e.sequence DESC LIMIT 1), runs.updated_at)"
)
"""A runs row's time of last change: its run's last event's time (`LAST_SEQUENCE`)."""

HEAD = "SELECT coalesce(max(sequence), 0) FROM {s}.events WHERE run_id = %s"
"""The head of the run whose id is the one parameter: its last sequence, 0 for none."""


def summary_columns(s: str) -> str:
    """`SUMMARY_COLUMNS` of a row of `runs` in schema `s`: the head and its time from the events."""
    return (
        "runs.run_id, runs.workflow_name, runs.status, runs.parent_run_id, runs.created_at, "
        f"{UPDATED_AT.format(s=s)} AS updated_at, runs.completed_at, "
        f"{LAST_SEQUENCE.format(s=s)} AS last_sequence, runs.attributes, runs.owner_id, "
        "runs.queue_name, runs.priority, runs.dedup_id"
    )


def derived(sql: str, s: str | None = None) -> str:
    """`sql` reading `runs.last_sequence` and `runs.updated_at` from the events instead.

    Each is replaced by `LAST_SEQUENCE` or `UPDATED_AT`, whose `{s}` is left for the caller to
    format, or replaced by `s` when given (`sql` may then hold other braces). A select list
    names them `AS last_sequence` and `AS updated_at`, so that its column keeps its name."""
    sql = sql.replace("runs.last_sequence", LAST_SEQUENCE).replace("runs.updated_at", UPDATED_AT)
    return sql if s is None else sql.replace("{s}", s)
