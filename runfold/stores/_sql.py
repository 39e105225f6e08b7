"""What the SQL stores (SQLite, PostgreSQL) share: row ↔ record mapping and the run listing.

Both keep times as integer microseconds since the Unix epoch and the same `runs` columns, so the
code that turns rows into `RunSummary`/`Wakeup` records and builds the listing queries lives here
once; `mark` is the driver's parameter placeholder (`?` or `%s`).

Index rows are data too: one that does not decode into its record (attributes that are not a JSON
object of strings, a time that is not an integer, an unknown status) is `CorruptIndex` naming
its run, never skipped and never an untyped error.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from itertools import repeat
from typing import Any

from runfold.kernel import (
    CorruptEvent,
    CorruptIndex,
    Envelope,
    EventDecodeError,
    HookHolder,
    Limits,
    Page,
    RunStatus,
    RunSummary,
    Wakeup,
    WakeupKind,
    decode_event,
    decode_events,
    make_envelopes,
    project_rows,
)
from runfold.kernel.bulk import in_bulk
from runfold.stores.arguments import MAX_COUNT
from runfold.stores.paging import hook_cursor_key, hooks_page, run_cursor_key, runs_page
from runfold.stores.protocol import ReplayedRun
from runfold.stores.time_keys import from_key, time_key, times_from_keys

__all__ = [
    "EVENT_COLUMNS",
    "SUMMARY_COLUMNS",
    "IndexReads",
    "envelopes_from_rows",
    "holder_from_row",
    "list_hooks_query",
    "list_runs_query",
    "optional_time",
    "replay_rows",
    "run_events_query",
    "summary_from_row",
    "token_holder_query",
    "wakeup_from_row",
    "wakeups_query",
]

_RUN_STATUSES = frozenset(typing.get_args(RunStatus))
_WAKEUP_KINDS = frozenset(typing.get_args(WakeupKind))

EVENT_COLUMNS = "sequence, type, schema_version, payload, recorded_at, position"
"""An event row's columns, as `envelopes_from_rows` reads them."""

SUMMARY_COLUMNS = (
    "run_id, workflow_name, status, parent_run_id, created_at, updated_at, completed_at, "
    "last_sequence, attributes, owner_id, queue_name, priority, dedup_id"
)
"""The `runs` columns a `RunSummary` is read from, in `summary_from_row` order."""


def envelopes_from_rows(rows: Iterable[Sequence[Any]], run_id: str | None = None) -> list[Envelope]:
    """The envelopes of event rows, decoded together (`decode_events`).

    A row is `(sequence, type, schema_version, payload, recorded_at key, position)` of `run_id`'s
    events or, without `run_id`, the same led by the row's run id (the feed). A row that does
    not decode, or has a column of the wrong type, is `CorruptEvent` naming its run and
    sequence.
    """
    rows = rows if isinstance(rows, list) else list(rows)
    return in_bulk(len(rows), _envelopes, rows, run_id) if rows else []


def _envelopes(rows: list[Sequence[Any]], run_id: str | None) -> list[Envelope]:
    # Column by column, so the per-row work left in Python is structuring each event.
    run_ids: Iterable[Any]
    try:
        if run_id is None:
            run_ids, sequences, types, versions, payloads, keys, positions = zip(*rows, strict=True)
        else:
            # A run's own reads leave the run id out of the rows: fetching it again for every
            # row is a noticeable part of a SQLite row's fetch.
            sequences, types, versions, payloads, keys, positions = zip(*rows, strict=True)
            run_ids = repeat(run_id)
        events = decode_events(types, versions, payloads)
        times = times_from_keys(keys)
    except (EventDecodeError, TypeError, ValueError, OverflowError):
        _check_rows(rows, run_id)  # raises CorruptEvent for the first row that is wrong
        raise
    return make_envelopes(len(rows), run_ids, sequences, events, times, positions)


def replay_rows(rows: Sequence[Sequence[Any]], run_id: str, limits: Limits) -> ReplayedRun | None:
    """The `Replayer.replay` of `run_id`'s event rows, all of them, in sequence order.

    A row is `(sequence, type, schema_version, payload, recorded_at key, position)`, as
    `envelopes_from_rows` takes it; they are folded with `project_rows`. A row that does not
    decode, or has a column of the wrong type, is `CorruptEvent` naming its sequence.
    """
    if not rows:
        return None
    # Splitting the rows into columns takes an iterator per row: with the collector paused too.
    return in_bulk(len(rows), _replay, rows, run_id, limits)


def _replay(rows: Sequence[Sequence[Any]], run_id: str, limits: Limits) -> ReplayedRun:
    try:
        sequences, types, versions, payloads, keys, positions = zip(*rows, strict=True)
        snapshot = project_rows(run_id, sequences, types, versions, payloads, keys, limits=limits)
    except (EventDecodeError, TypeError, ValueError, OverflowError):
        _check_rows(rows, run_id)  # raises CorruptEvent for the first row that is wrong
        raise
    return ReplayedRun(snapshot=snapshot, first_position=positions[0], last_position=positions[-1])


def _check_rows(rows: Iterable[Sequence[Any]], run_id: str | None) -> None:
    """Decode event rows one by one, raising `CorruptEvent` for the first that is wrong."""
    rows_of_runs = (
        zip(repeat(run_id), rows) if run_id is not None else ((row[0], row[1:]) for row in rows)
    )
    for row_run_id, (sequence, event_type, version, payload, recorded, _) in rows_of_runs:
        try:
            from_key(recorded)
            decode_event(event_type, version, payload)
        except EventDecodeError as exc:
            raise CorruptEvent(row_run_id, sequence, exc.reason) from None
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. SQLite's loose typing
            raise CorruptEvent(row_run_id, sequence, f"malformed row: {exc}") from None


def holds_at(moment: str, hook: str = "") -> str:
    """SQL for `HookClaim.holds_at`: the hook row keeps its token at `moment`.

    `moment` is a placeholder or expression holding a time key; `hook` prefixes the columns.
    """
    return f"({hook}retained_until IS NULL OR {hook}retained_until > {moment})"


def token_holder_query(mark: str, table: str) -> str:
    """The query for the row of `table` holding a token at a moment.

    It selects `(run_id, hook_id, retained_until)`; its parameters are the token and the
    moment's time key.
    """
    return (
        f"SELECT run_id, hook_id, retained_until FROM {table} "
        f"WHERE token = {mark} AND {holds_at(mark)}"
    )


def optional_time(micros: int | None) -> datetime | None:
    """`from_key`, passing None through."""
    return None if micros is None else from_key(micros)


def _text(value: Any, column: str) -> str:
    if type(value) is not str:
        raise TypeError(f"{column} must be text, not {type(value).__name__}")
    return value


def _optional_text(value: Any, column: str) -> str | None:
    return None if value is None else _text(value, column)


def _integer(value: Any, column: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{column} must be an integer, not {type(value).__name__}")
    return value


def _attributes(text: Any) -> dict[str, str]:
    found = json.loads(_text(text, "attributes"))
    if type(found) is not dict or not all(
        type(k) is str and type(v) is str for k, v in found.items()
    ):
        raise TypeError("attributes must be a JSON object of strings")
    return found


def _corrupt(row: Any, what: str, exc: Exception) -> CorruptIndex:
    run_id = row[0] if row and type(row[0]) is str else repr(row[0] if row else None)
    return CorruptIndex(run_id, f"{what}: {exc}")


def summary_from_row(row: Any) -> RunSummary:
    """A `RunSummary` from a row of `SUMMARY_COLUMNS` (attributes stored as JSON text).

    Raises:
        CorruptIndex: The row does not decode into a summary.
    """
    try:
        run_id, name, status, parent, created, updated, completed, last, attributes, owner = row[
            :10
        ]
        queue_name, priority, dedup_id = row[10:]
        if status not in _RUN_STATUSES:
            raise ValueError(f"unknown status {status!r}")
        return RunSummary(
            run_id=_text(run_id, "run_id"),
            workflow_name=_text(name, "workflow_name"),
            status=status,
            parent_run_id=_optional_text(parent, "parent_run_id"),
            created_at=from_key(created),
            updated_at=from_key(updated),
            completed_at=optional_time(completed),
            last_sequence=_integer(last, "last_sequence"),
            attributes=_attributes(attributes),
            owner_id=_optional_text(owner, "owner_id"),
            queue_name=_optional_text(queue_name, "queue_name"),
            priority=_integer(priority, "priority"),
            dedup_id=_optional_text(dedup_id, "dedup_id"),
        )
    except (TypeError, ValueError, OverflowError) as exc:  # JSONDecodeError is a ValueError
        raise _corrupt(row, "summary row", exc) from None


def wakeup_from_row(row: Any) -> Wakeup:
    """A `Wakeup` from a `(run_id, kind, subject_id, due_at)` row.

    Raises:
        CorruptIndex: The row does not decode into a wakeup.
    """
    try:
        run_id, kind, subject_id, due_at = row
        if kind not in _WAKEUP_KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        return Wakeup(
            run_id=_text(run_id, "run_id"),
            kind=kind,
            subject_id=_text(subject_id, "subject_id"),
            due_at=from_key(due_at),
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise _corrupt(row, "wakeup row", exc) from None


def holder_from_row(row: Any) -> HookHolder:
    """A `HookHolder` from a `(run_id, hook_id, retained_until)` row.

    Raises:
        CorruptIndex: The row does not decode into a holder.
    """
    try:
        run_id, hook_id, retained = row
        return HookHolder(
            run_id=_text(run_id, "run_id"),
            hook_id=_text(hook_id, "hook_id"),
            retained_until=optional_time(retained),
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise _corrupt(row, "hook row", exc) from None


class IndexReads:
    """The index queries both SQL stores share, written once over three hooks of each store.

    The hooks are its parameter mark (`MARK`), its table names (`_table`) and how it fetches a
    query's rows (`_rows`). `list_runs`, `list_hooks`, `due_wakeups` and `next_wakeup` live
    here; each store keeps `get_runs`, `find_hook` and `_wakeups`, whose SQL differs.
    """

    MARK: str
    """The driver's parameter placeholder: `?` or `%s`."""
    SUMMARY: str = SUMMARY_COLUMNS
    """The store's `SUMMARY_COLUMNS` of a row of its `runs` table (SQLite derives some)."""

    def _table(self, name: str) -> str:
        """`name` as the store's queries name it (schema-qualified, or bare)."""
        raise NotImplementedError

    async def _rows(self, query: str, params: Sequence[Any]) -> list[Any]:
        """The rows `query` with `params` returns."""
        raise NotImplementedError

    async def _wakeups(
        self, workflow_names: Collection[str] | None, due: int | None, limit: int
    ) -> list[Wakeup]:
        """Wakeups in due order, `due_at <= due` (a `time_key`) unless None, at most `limit`."""
        raise NotImplementedError

    async def _list_runs(
        self,
        workflow_name: str | None,
        status: RunStatus | None,
        parent_run_id: str | None,
        created_before: datetime | None,
        cursor: str | None,
        limit: int,
        /,
    ) -> Page[RunSummary]:
        """Run summaries, newest first, filtered, a page at a time (`EventStore.list_runs`)."""
        query, params = list_runs_query(
            self.MARK,
            self._table("runs"),
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
            columns=self.SUMMARY,
        )
        rows = await self._rows(query, params)
        return runs_page([summary_from_row(row) for row in rows], limit)

    async def _list_hooks(
        self, run_id: str | None, cursor: str | None, limit: int, now: datetime, /
    ) -> Page[HookHolder]:
        """Live and still-retained hooks at `now`, a page at a time (`EventStore.list_hooks`)."""
        query, params = list_hooks_query(
            self.MARK, self._table("hooks"), run_id=run_id, cursor=cursor, limit=limit, now=now
        )
        rows = await self._rows(query, params)
        return hooks_page([holder_from_row(row) for row in rows], limit)

    async def _due_wakeups(
        self, now: datetime, limit: int, workflow_names: Collection[str] | None, /
    ) -> list[Wakeup]:
        """Wakeups due at `now`, oldest first, at most `limit` (of runs of `workflow_names`)."""
        return await self._wakeups(workflow_names, time_key(now), max(limit, 0))

    async def _next_wakeup(self, workflow_names: Collection[str] | None, /) -> Wakeup | None:
        """The earliest pending wakeup (of a run of `workflow_names`), or None."""
        found = await self._wakeups(workflow_names, None, 1)
        return found[0] if found else None


def run_events_query(
    table: str,
    mark: str,
    run_id: str,
    correlation: str | None,
    after: int,
    descending: bool,
) -> tuple[str, list[Any]]:
    """The SELECT of a run's event rows as `EventStore.read` asks, and its parameters but one.

    The last parameter, the limit's, is the caller's to append: "no limit" is NULL on
    PostgreSQL, -1 on SQLite. The rows hold `EVENT_COLUMNS`. `table` is the events table
    (schema-qualified on PostgreSQL), `mark` the driver's parameter mark (`?` or `%s`);
    `correlation`, when given, keeps the rows of one correlation id.
    """
    clauses = [f"run_id = {mark}"]
    params: list[Any] = [run_id]
    if correlation is not None:
        clauses.append(f"correlation_id = {mark}")
        params.append(correlation)
    if descending:
        if after > 0:
            clauses.append(f"sequence < {mark}")
            params.append(after)
    else:
        clauses.append(f"sequence > {mark}")
        params.append(after)
    sql = (
        f"SELECT {EVENT_COLUMNS} FROM {table} WHERE {' AND '.join(clauses)} "
        f"ORDER BY sequence {'DESC' if descending else 'ASC'} LIMIT {mark}"
    )
    return sql, params


def wakeups_query(schema: str, mark: str, *, served: str | None, due: bool) -> str:
    """Wakeups in due order (then run id, kind, subject id), `LIMIT mark`.

    `schema` prefixes the table names (`""` or `"name."`). `served`, when given, is the SQL test
    a run's `workflow_name` must pass (its parameter first): the filter is a join with the runs
    index, so a page is never filled by other workflows' wakeups. `due` adds `due_at <= mark`.
    """
    served_join = (
        f" JOIN {schema}runs r ON r.run_id = w.run_id AND r.workflow_name {served}"
        if served
        else ""
    )
    due_clause = f" WHERE w.due_at <= {mark}" if due else ""
    return (
        f"SELECT w.run_id, w.kind, w.subject_id, w.due_at FROM {schema}wakeups w{served_join}"
        f"{due_clause} ORDER BY w.due_at, w.run_id, w.kind, w.subject_id LIMIT {mark}"
    )


def list_runs_query(
    mark: str,
    table: str,
    *,
    workflow_name: str | None,
    status: str | None,
    parent_run_id: str | None,
    created_before: datetime | None,
    cursor: str | None,
    limit: int,
    columns: str = SUMMARY_COLUMNS,
) -> tuple[str, list[Any]]:
    """The `list_runs` query on `table` and its parameters: `limit + 1` rows, newest first.

    `columns` are the store's `SUMMARY_COLUMNS` (`IndexReads.SUMMARY`).

    Raises:
        InvalidArgument: `cursor` is not one `runs_page` made.
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
        clauses.append(f"(created_at, run_id) < ({mark}, {mark})")
        params += run_cursor_key(cursor)
    return _page_query(mark, columns, table, clauses, params, "created_at DESC, run_id DESC", limit)


def list_hooks_query(
    mark: str, table: str, *, run_id: str | None, cursor: str | None, limit: int, now: datetime
) -> tuple[str, list[Any]]:
    """The `list_hooks` query on `table` and its parameters: `limit + 1` rows, after `cursor`.

    It selects the claims live or still retained at `now`, by `(run_id, hook_id)`.

    Raises:
        InvalidArgument: `cursor` is not one `hooks_page` made.
    """
    clauses = [holds_at(mark)]
    params: list[Any] = [time_key(now)]
    if run_id is not None:
        clauses.append(f"run_id = {mark}")
        params.append(run_id)
    if cursor is not None:
        clauses.append(f"(run_id, hook_id) > ({mark}, {mark})")
        params += hook_cursor_key(cursor)
    return _page_query(
        mark, "run_id, hook_id, retained_until", table, clauses, params, "run_id, hook_id", limit
    )


def _page_query(
    mark: str,
    columns: str,
    table: str,
    clauses: list[str],
    params: list[Any],
    order: str,
    limit: int,
) -> tuple[str, list[Any]]:
    """A listing query: `limit + 1` rows, the one past the page telling that there is more."""
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    query = f"SELECT {columns} FROM {table}{where} ORDER BY {order} LIMIT {mark}"
    return query, [*params, min(max(limit, 0) + 1, MAX_COUNT)]
