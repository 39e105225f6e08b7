"""Time keys: how stores keep instants (integer microseconds since the Unix epoch, in UTC).

A store keeps a time as `time_key(moment)`, exact and sortable in any database, and reads it
back with `from_key` (one) or `times_from_keys` (a read's worth): always in UTC, whatever offset
the caller used. `index_in_utc` does the same for a store that keeps index rows as objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import accumulate, repeat
from operator import add, mul, sub

import attrs

from runfold.kernel import RunIndex

__all__ = ["from_key", "index_in_utc", "time_key", "times_from_keys"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def index_in_utc(index: RunIndex) -> RunIndex:
    """`index` with every time in UTC (summary times, retention deadlines, wakeups' due times).

    A store keeps instants and reads them back in UTC, whatever offset the caller used: a store
    that keeps index rows as objects (not as UTC microseconds) stores this instead.
    """
    summary = index.summary
    if (
        summary.created_at.tzinfo is UTC
        and summary.updated_at.tzinfo is UTC
        and (summary.completed_at is None or summary.completed_at.tzinfo is UTC)
        and not index.hooks
        and (not index.wakeups or all(w.due_at.tzinfo is UTC for w in index.wakeups))
    ):
        return index  # already so: what the engine's clock gives on every append
    return RunIndex(
        summary=attrs.evolve(
            summary,
            created_at=summary.created_at.astimezone(UTC),
            updated_at=summary.updated_at.astimezone(UTC),
            completed_at=_optional_utc(summary.completed_at),
        ),
        hooks=tuple(
            attrs.evolve(c, retained_until=_optional_utc(c.retained_until)) for c in index.hooks
        ),
        wakeups=tuple(attrs.evolve(w, due_at=w.due_at.astimezone(UTC)) for w in index.wakeups),
    )


def _optional_utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(UTC)


def time_key(value: datetime) -> int:
    """Microseconds since the Unix epoch: the exact, sortable form stores keep times in."""
    return (value - _EPOCH) // _MICROSECOND


def from_key(micros: int) -> datetime:
    """The UTC time stored as `micros` (the inverse of `time_key`).

    Raises:
        TypeError: `micros` is not an `int` (a REAL or a text SQLite's loose typing let in).
    """
    if type(micros) is not int:
        raise TypeError(f"a time must be integer microseconds, not {type(micros).__name__}")
    return _EPOCH + timedelta(0, 0, micros)


def times_from_keys(keys: Sequence[int]) -> list[datetime]:
    """The UTC times stored as `keys` (see `from_key`); equal keys share one `datetime`.

    Rows of one append share their time, so each distinct key is converted once, and from the
    one before it: adding a small `timedelta` is cheaper than building one from a large
    count of microseconds.
    """
    distinct = list(dict.fromkeys(keys))
    if set(map(type, distinct)) != {int}:
        return list(map(from_key, keys))  # the loose values SQLite may hold, one by one
    gaps = map(mul, repeat(_MICROSECOND), map(sub, distinct[1:], distinct))
    found = dict(zip(distinct, accumulate(gaps, add, initial=from_key(distinct[0])), strict=True))
    return list(map(found.__getitem__, keys))
