"""What the SQL stores (SQLite, PostgreSQL) share: row ↔ record mapping and the run listing.

Both keep times as integer microseconds since the Unix epoch and the same `runs` columns, so the
code that turns rows into `RunSummary`/`Wakeup` records and builds a `list_runs` query lives here
once; `mark` is the driver's parameter placeholder (`?` or `%s`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from runfold.kernel import HookHolder, Page, RunSummary, Wakeup
from runfold.stores.protocol import decode_cursor, encode_cursor, time_key

__all__ = [
    "SUMMARY_COLUMNS",
    "from_key",
    "hook_filters",
    "hook_page",
    "optional_time",
    "run_filters",
    "summary_from_row",
    "summary_page",
    "wakeup_from_row",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

SUMMARY_COLUMNS = (
    "run_id, workflow_name, status, parent_run_id, created_at, updated_at, completed_at, "
    "last_sequence, attributes"
)
"""The `runs` columns a `RunSummary` is read from, in `summary_from_row` order."""


def from_key(micros: int) -> datetime:
    """The UTC time stored as `micros` (see `time_key`)."""
    return _EPOCH + timedelta(microseconds=micros)


def optional_time(micros: int | None) -> datetime | None:
    """`from_key`, passing None through."""
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def summary_from_row(row: Any) -> RunSummary:
    """A `RunSummary` from a row of `SUMMARY_COLUMNS` (attributes stored as JSON text)."""
    run_id, workflow_name, status, parent, created, updated, completed, last, attributes = row
    return RunSummary(
        run_id=run_id,
        workflow_name=workflow_name,
        status=status,
        parent_run_id=parent,
        created_at=from_key(created),
        updated_at=from_key(updated),
        completed_at=optional_time(completed),
        last_sequence=last,
        attributes=json.loads(attributes),
    )


def wakeup_from_row(row: Any) -> Wakeup:
    """A `Wakeup` from a `(run_id, kind, subject_id, due_at)` row."""
    run_id, kind, subject_id, due_at = row
    return Wakeup(run_id=run_id, kind=kind, subject_id=subject_id, due_at=from_key(due_at))


def run_filters(
    mark: str,
    *,
    workflow_name: str | None,
    status: str | None,
    parent_run_id: str | None,
    created_before: datetime | None,
    cursor: str | None,
) -> tuple[str, list[Any]]:
    """The `WHERE …` clause (or "") and its parameters for a `list_runs` query, newest first.

    Raises:
        ValueError: `cursor` is not one `summary_page` made.
    """
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("workflow_name", workflow_name),
        ("status", status),
        ("parent_run_id", parent_run_id),
    ):
        if value is not None:
            clauses.append(f"{column} = {mark}")
            params.append(value)
    if created_before is not None:
        clauses.append(f"created_at < {mark}")
        params.append(time_key(created_before))
    if cursor is not None:
        micros, last_run_id = decode_cursor(cursor, 2)
        clauses.append(f"(created_at, run_id) < ({mark}, {mark})")
        params += [int(micros), last_run_id]
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def summary_page(rows: Sequence[Any], limit: int) -> Page[RunSummary]:
    """The page of `list_runs` from up to `limit + 1` rows (the extra row says `has_more`)."""
    items = tuple(summary_from_row(row) for row in rows[: max(limit, 0)])
    has_more = len(rows) > len(items)
    next_cursor = (
        encode_cursor(time_key(items[-1].created_at), items[-1].run_id)
        if has_more and items
        else None
    )
    return Page(items=items, cursor=next_cursor, has_more=has_more)


def hook_filters(
    mark: str, *, run_id: str | None, cursor: str | None, now: datetime
) -> tuple[str, list[Any]]:
    """The `WHERE …` clause and parameters of a `list_hooks` query, placeholders written `mark`.

    It selects the claims live or still retained at `now`, after `cursor`, by `(run_id, hook_id)`.

    Raises:
        ValueError: `cursor` is not one `hook_page` made.
    """
    clauses = [f"(retained_until IS NULL OR retained_until > {mark})"]
    params: list[Any] = [time_key(now)]
    if run_id is not None:
        clauses.append(f"run_id = {mark}")
        params.append(run_id)
    if cursor is not None:
        last_run, last_hook = decode_cursor(cursor, 2)
        clauses.append(f"(run_id, hook_id) > ({mark}, {mark})")
        params += [last_run, last_hook]
    return f"WHERE {' AND '.join(clauses)}", params


def hook_page(rows: Sequence[Any], limit: int) -> Page[HookHolder]:
    """The page of `list_hooks` from up to `limit + 1` `(run_id, hook_id, retained_until)` rows."""
    items = tuple(
        HookHolder(run_id=r, hook_id=h, retained_until=optional_time(t))
        for r, h, t in rows[: max(limit, 0)]
    )
    has_more = len(rows) > len(items)
    next_cursor = encode_cursor(items[-1].run_id, items[-1].hook_id) if has_more and items else None
    return Page(items=items, cursor=next_cursor, has_more=has_more)
