"""The parts the PostgreSQL store's appends are written of, each once, and their refusals.

An append checks that the run's head, its last event (`last_event`), is where the caller left it
(`at_head`), inserts the events (`insert_events`), whose primary key refuses a concurrent append
at the same head, and writes the run's row only where a field it holds changes (`differs`,
`write_run`). The appends that compose them are in `functions` (`append_events`, the one every
append can go through) and `plain` (the cheaper ones onto live runs without hook claims or
wakeups). `s` is the quoted schema name throughout.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "CASTS",
    "CHANGING",
    "EVENTS",
    "FIXED",
    "OWN",
    "POSITIONS_PER_TRANSACTION",
    "SEQUENCE_CONFLICT",
    "TOKEN_CONFLICT",
    "XACT",
    "Fields",
    "at_head",
    "differs",
    "function_field",
    "insert_events",
    "last_event",
    "write_run",
]

POSITIONS_PER_TRANSACTION = 1_000_000
"""Feed positions are `transaction id × POSITIONS_PER_TRANSACTION + ordinal`."""

SEQUENCE_CONFLICT = "RF001"
"""The SQLSTATE `append_events` refuses with when the head is not the one expected.

Its detail is the true head.
"""
TOKEN_CONFLICT = "RF002"
"""The SQLSTATE `append_events` refuses with when another run holds a claimed token.

Its detail is JSON naming the claim's ordinal and its holder, never the token.
"""

_P = POSITIONS_PER_TRANSACTION
XACT = "pg_current_xact_id()::text::bigint"
"""The id of the writing transaction: its events' positions are `id × P + ordinal`."""
CHANGING = ("status", "updated_at", "completed_at", "last_sequence", "attributes", "owner_id")
"""The summary columns an append may change; the others are fixed when the run is created."""
OWN = ("status", "completed_at", "attributes", "owner_id")
"""The changing columns the runs row holds for itself.

`updated_at` and `last_sequence` are its last event's (`heads`), so a change of these alone
leaves the row as it is.
"""
CASTS = {
    "status": "::text",
    "completed_at": "::bigint",
    "attributes": "::text",
    "owner_id": "::text",
    "expected": "::integer",
    "expected_position": "::bigint",
}
"""The types of statement parameters that may come untyped (NULL)."""
FIXED = (
    "workflow_name",
    "parent_run_id",
    "created_at",
    "queue_name",
    "priority",
    "dedup_id",
)
"""The summary columns fixed when the run is created: no append changes them."""

Fields = Callable[[str], str]
"""Where a variant finds a field of the append.

`r.status` in a function, `%(status)s` in a statement.
"""


def function_field(name: str) -> str:
    """`Fields` of a plpgsql function, whose append is its argument `r`."""
    return f"r.{name}"


def last_event(s: str, field: Fields) -> str:
    """The `SELECT` of the run's head, its last event: `(sequence, position)`, no row for none."""
    return (
        f"SELECT e.sequence, e.position FROM {s}.events e WHERE e.run_id = {field('run_id')} "
        "ORDER BY e.sequence DESC LIMIT 1"
    )


def at_head(field: Fields, *, head: str, position: str, xact: str) -> str:
    """Whether the head found (`head`, its event at `position`) is the one the append expects.

    That is: the head is `field("expected")`, its event at `field("expected_position")` (when
    given), and written by a transaction older than `xact` (an unmultiplied id): a run's events
    come in the feed in the order they were appended.
    """
    return (
        f"{head} = {field('expected')} "
        f"AND {position} = coalesce({field('expected_position')}, {position}) "
        f"AND {position} < ({xact} + 1) * {_P}"
    )


def differs(
    field: Fields,
    columns: tuple[str, ...],
    *,
    extra: tuple[tuple[str, str], ...] = (),
    casts: bool = False,
) -> str:
    """Whether the runs row holds other values than the append's in `columns`.

    `extra` adds (column, value) pairs; `casts` types the statement parameters, which come
    untyped when NULL."""
    names = [*columns, *(column for column, _ in extra)]
    values = [field(c) + (CASTS.get(c, "") if casts else "") for c in columns]
    values += [value for _, value in extra]
    return f"({', '.join(names)}) IS DISTINCT FROM ({', '.join(values)})"


def write_run(
    s: str, field: Fields, *, count: str, position: str, every_column: bool = False, also: str = ""
) -> str:
    """The `UPDATE` of the run's row to the append's summary, its head `count` events on.

    `position` is the new head's; `every_column` sets the fixed summary columns too (a repair
    may change them); `also` adds to the `SET` list."""
    columns = (*FIXED, *CHANGING) if every_column else CHANGING
    sets = [f"{column} = {field(column)}" for column in columns]
    sets += [f"head = {field('expected')} + {count}", f"head_position = {position}"]
    if also:
        sets.append(also)
    return f"UPDATE {s}.runs SET {', '.join(sets)} WHERE run_id = {field('run_id')}"


EVENTS = (
    "unnest(r.types, r.versions, r.correlation_ids, r.payloads) "
    "WITH ORDINALITY AS e(type, version, correlation_id, payload, n)"
)
"""The events of `append_request` `r`, numbered from 1."""


def insert_events(s: str, field: Fields, *, base: str, events: str = EVENTS) -> str:
    """The `INSERT` of the events, the `n`-th at sequence expected + n and position base + n.

    `events` yields `e(type, version, correlation_id, payload, n)`.
    """
    return (
        f"INSERT INTO {s}.events (run_id, sequence, type, schema_version, correlation_id, "
        f"payload, recorded_at, position) SELECT {field('run_id')}, {field('expected')} + e.n, "
        f"e.type, e.version, e.correlation_id, e.payload, {field('recorded_at')}, {base} + e.n "
        f"FROM {events}"
    )
