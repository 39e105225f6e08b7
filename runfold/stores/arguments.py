"""The store contract's argument rules: one check per `EventStore` method, shared by every store.

A store calls the check of a method first thing in it (`check_read(run_id, after=after, …)` at
the top of `read`), so every store refuses the same arguments in the same way: with
`InvalidArgument` (a `ValueError`) naming the argument, before any I/O and before it looks at
whether it is closed. What a driver would otherwise make of a bad argument differs from store
to store (a SQLite `OverflowError`, a PostgreSQL `UnicodeEncodeError`, an empty answer from a
dict), and a webhook caller reaches `find_hook` with any token it likes.

The rules (the store contract page lists them too):

- Text (run ids, correlation ids, hook tokens, workflow names, cursors, and each id of a
  collection of them) is a `str` that UTF-8 can encode: a lone surrogate is refused. U+0000 is
  text like any other.
- A collection of text (`run_ids`, `workflow_names`) is a collection, never a single `str`.
- Counts and offsets (`limit`, `after`, `after_position`) are `int`s (never `bool`) that a 64-bit
  signed column holds; a negative one means 0. `expected_sequence` and `expected_position` are
  `int`s of any size: a value no run has is a `SequenceConflict`, as the fence says.
- Times are timezone-aware `datetime`s that exist in UTC.
- `descending` is a `bool`; `status` is None or a `RunStatus`.
- A cursor is one the store made: the store decodes it before any I/O and refuses another with
  `InvalidArgument` (`paging.run_cursor_key` and `hook_cursor_key` do, for the cursors of
  `runs_page` and `hooks_page`).
"""

from __future__ import annotations

import typing
from collections.abc import Collection, Sequence
from datetime import UTC, datetime

from runfold.kernel import Event, InvalidArgument, RunIndex, RunStatus

__all__ = [
    "MAX_COUNT",
    "MIN_COUNT",
    "check_append",
    "check_append_if_sequence",
    "check_collection",
    "check_count",
    "check_delete_runs",
    "check_due_wakeups",
    "check_find_hook",
    "check_flag",
    "check_get_runs",
    "check_head",
    "check_index",
    "check_list_hooks",
    "check_list_runs",
    "check_next_wakeup",
    "check_read",
    "check_read_all",
    "check_read_by_correlation",
    "check_rewrite_index",
    "check_text",
    "check_time",
]

MIN_COUNT = -(2**63)
"""The lowest count or offset a store takes (a negative one means 0)."""
MAX_COUNT = 2**63 - 1
"""The highest count or offset a store takes: what a 64-bit signed column holds."""
_RUN_STATUSES = frozenset(typing.get_args(RunStatus))


def check_text(value: object, name: str) -> None:
    """`value` is a `str` UTF-8 can encode (no lone surrogate).

    The message names the argument and never quotes its value: a hook token is a secret.
    """
    if type(value) is str and value.isascii():
        return  # most text: nothing more to ask
    if not isinstance(value, str):
        raise InvalidArgument(name, f"must be a str, not {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidArgument(name, "is not valid Unicode (a lone surrogate)") from None


def check_collection(values: object, name: str) -> None:
    """`values` is a collection of text (each checked by `check_text`), never a single `str`."""
    if isinstance(values, str | bytes) or not isinstance(values, Collection):
        raise InvalidArgument(name, f"must be a collection of str, not {type(values).__name__}")
    for value in values:
        check_text(value, f"an item of {name}")


def check_count(value: object, name: str) -> None:
    """`value` is an `int` (not a `bool`) from `MIN_COUNT` to `MAX_COUNT`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(name, f"must be an int, not {type(value).__name__}")
    if not MIN_COUNT <= value <= MAX_COUNT:
        raise InvalidArgument(name, "is outside the 64-bit integer range")


def _check_fence(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(name, f"must be an int, not {type(value).__name__}")


def check_flag(value: object, name: str) -> None:
    """`value` is a `bool`."""
    if not isinstance(value, bool):
        raise InvalidArgument(name, f"must be a bool, not {type(value).__name__}")


def check_time(value: object, name: str) -> None:
    """`value` is a timezone-aware `datetime` that exists in UTC."""
    if not isinstance(value, datetime):
        raise InvalidArgument(name, f"must be a datetime, not {type(value).__name__}")
    if value.tzinfo is UTC:  # every append's time, as the handler's clock gives it: in range
        return
    if value.utcoffset() is None:
        raise InvalidArgument(name, "must be timezone-aware (a naive datetime names no instant)")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise InvalidArgument(name, "is outside the datetime range once in UTC") from None


def _optional(check: typing.Callable[[object, str], None], value: object, name: str) -> None:
    if value is not None:
        check(value, name)


def _check_range(after: object, limit: object, descending: object) -> None:
    check_count(after, "after")
    _optional(check_count, limit, "limit")
    check_flag(descending, "descending")


def check_append_if_sequence(
    run_id: object,
    expected_sequence: object,
    events: Sequence[Event],
    *,
    index: RunIndex,
    recorded_at: object,
    expected_position: object,
) -> None:
    """The arguments of `append_if_sequence`.

    Also refused: an empty `events`, a non-event in it, an `index` of another run.
    """
    if (  # the usual append, as the handler makes it: every check below at once
        type(run_id) is str
        and run_id.isascii()
        and type(expected_sequence) is int
        and type(events) in (list, tuple)
        and events
        and type(index) is RunIndex
        and index.summary.run_id == run_id
        and type(recorded_at) is datetime
        and recorded_at.tzinfo is UTC
        and (expected_position is None or type(expected_position) is int)
    ):
        for event in events:
            if not isinstance(event, Event):
                break
        else:
            return
    check_text(run_id, "run_id")
    _check_fence(expected_sequence, "expected_sequence")
    # A list or a tuple (what callers pass) spares `Sequence`'s ABC check, ~1 µs an append.
    if type(events) not in (list, tuple) and (
        isinstance(events, str | bytes) or not isinstance(events, Sequence)
    ):
        kind = type(events).__name__
        raise InvalidArgument("events", f"must be a sequence of events, not {kind}")
    for event in events:
        if not isinstance(event, Event):
            raise InvalidArgument("events", f"holds a {type(event).__name__}, not an Event")
    if not isinstance(index, RunIndex):
        raise InvalidArgument("index", f"must be a RunIndex, not {type(index).__name__}")
    check_time(recorded_at, "recorded_at")
    _optional(_check_fence, expected_position, "expected_position")
    check_append(run_id, events, index)  # type: ignore[arg-type]  # checked: a str


def check_read(run_id: object, *, after: object, limit: object, descending: object) -> None:
    """The arguments of `read`."""
    check_text(run_id, "run_id")
    _check_range(after, limit, descending)


def check_head(run_id: object) -> None:
    """The argument of `head`."""
    check_text(run_id, "run_id")


def check_read_by_correlation(
    run_id: object, correlation_id: object, *, after: object, limit: object, descending: object
) -> None:
    """The arguments of `read_by_correlation`."""
    check_text(run_id, "run_id")
    check_text(correlation_id, "correlation_id")
    _check_range(after, limit, descending)


def check_list_runs(
    *,
    workflow_name: object,
    status: object,
    parent_run_id: object,
    created_before: object,
    cursor: object,
    limit: object,
) -> None:
    """The arguments of `list_runs`.

    A cursor is only checked to be text: the store decodes it (`run_cursor_key` decodes those of
    `runs_page`) and refuses one it did not make with `InvalidArgument`, before any I/O too.
    """
    _optional(check_text, workflow_name, "workflow_name")
    if status is not None and status not in _RUN_STATUSES:
        raise InvalidArgument("status", f"must be None or one of {sorted(_RUN_STATUSES)}")
    _optional(check_text, parent_run_id, "parent_run_id")
    _optional(check_time, created_before, "created_before")
    _optional(check_text, cursor, "cursor")
    check_count(limit, "limit")


def check_get_runs(run_ids: object) -> None:
    """The argument of `get_runs`."""
    check_collection(run_ids, "run_ids")


def check_find_hook(token: object, *, now: object) -> None:
    """The arguments of `find_hook`."""
    check_text(token, "token")
    check_time(now, "now")


def check_list_hooks(*, run_id: object, cursor: object, limit: object, now: object) -> None:
    """The arguments of `list_hooks` (a cursor as in `check_list_runs`: `hook_cursor_key`)."""
    _optional(check_text, run_id, "run_id")
    _optional(check_text, cursor, "cursor")
    check_count(limit, "limit")
    check_time(now, "now")


def check_due_wakeups(now: object, *, limit: object, workflow_names: object) -> None:
    """The arguments of `due_wakeups`."""
    check_time(now, "now")
    check_count(limit, "limit")
    _optional(check_collection, workflow_names, "workflow_names")


def check_next_wakeup(*, workflow_names: object) -> None:
    """The argument of `next_wakeup`."""
    _optional(check_collection, workflow_names, "workflow_names")


def check_read_all(*, after_position: object, limit: object) -> None:
    """The arguments of `read_all`."""
    check_count(after_position, "after_position")
    check_count(limit, "limit")


def check_delete_runs(*, terminal_before: object, limit: object, run_ids: object) -> None:
    """The arguments of `delete_runs`."""
    check_time(terminal_before, "terminal_before")
    check_count(limit, "limit")
    _optional(check_collection, run_ids, "run_ids")


def check_rewrite_index(run_id: object, index: object, *, now: object) -> None:
    """The arguments of `rewrite_index` (`IndexRewriter`): also an `index` of another run."""
    check_text(run_id, "run_id")
    if index is not None and not isinstance(index, RunIndex):
        raise InvalidArgument("index", f"must be a RunIndex or None, not {type(index).__name__}")
    check_time(now, "now")
    check_index(run_id, index)  # type: ignore[arg-type]  # checked: a str


def check_append(run_id: str, events: Sequence[Event], index: RunIndex) -> None:
    """Check the arguments of `append_if_sequence` the way every store must.

    Raises:
        InvalidArgument: `events` is empty, or `index` was computed for another run.
    """
    if not events:
        raise InvalidArgument("events", "must hold at least one event")
    check_index(run_id, index)


def check_index(run_id: str, index: RunIndex | None) -> None:
    """Check that `index` (if any) is `run_id`'s, as every write of index rows must.

    Raises:
        InvalidArgument: `index` was computed for another run.
    """
    if index is not None and index.summary.run_id != run_id:
        raise InvalidArgument("index", f"is for run {index.summary.run_id!r}, not {run_id!r}")
