"""A run's details as its page shows them: a page of each table, and the timeline of those rows.

A run may hold thousands of steps, waits, hooks or progress reports; the page shows
`TABLE_PAGE` of each at a time (`steps_from=…` and so on pick which), the last
`DELIVERIES_SHOWN` deliveries of a hook, and a timeline of the rows shown only. The timeline's
events are read per shown row (`read_by_correlation`, at most `ROW_EVENTS` each), never the
whole history, so what a page costs and weighs does not grow with the run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import attrs

from runfold.kernel import LIVE_RUN_STATUSES, Envelope, Snapshot
from runfold.stores import EventStore
from runfold.ui.timeline import Timeline, build_timeline

V = TypeVar("V")

__all__ = [
    "DELIVERIES_SHOWN",
    "ROW_EVENTS",
    "TABLES",
    "TABLE_PAGE",
    "Details",
    "TablePage",
    "run_details",
]

TABLE_PAGE = 20
"""Rows of each table (steps, waits, hooks, progress, children) a run's page shows at once."""
ROW_EVENTS = 40
"""The most events of one step, wait or hook the timeline draws (its first ones)."""
DELIVERIES_SHOWN = 3
"""A hook's latest deliveries its table row shows; the history lists them all."""
TABLES = ("steps", "waits", "hooks", "progress", "children")
"""The tables of a run's page, each paged by its own `<name>_from` query parameter."""


@attrs.frozen(kw_only=True, slots=True)
class TablePage(Generic[V]):
    """Rows `first` … `first + len(rows) - 1` (from 0) of a table of `total` rows."""

    rows: tuple[V, ...]
    first: int
    total: int
    previous: int | None
    next: int | None


@attrs.frozen(kw_only=True, slots=True)
class Details:
    """What the details part of a run's page shows."""

    run: Snapshot
    live: bool
    timeline: Timeline
    tables: Mapping[str, TablePage[Any]]


def _page(items: Mapping[str, V], first: int) -> TablePage[V]:
    total = len(items)
    first = min(first, max(total - 1, 0))
    rows = tuple(itertools.islice(items.values(), first, first + TABLE_PAGE))
    return TablePage(
        rows=rows,
        first=first,
        total=total,
        previous=max(first - TABLE_PAGE, 0) if first > 0 else None,
        next=first + TABLE_PAGE if first + TABLE_PAGE < total else None,
    )


async def run_details(store: EventStore, run: Snapshot, offsets: Mapping[str, int]) -> Details:
    """The details of `run` with each table from its offset in `offsets` (0 when absent)."""
    steps = _page(run.steps, offsets.get("steps", 0))
    waits = _page(run.waits, offsets.get("waits", 0))
    hooks = _page(run.hooks, offsets.get("hooks", 0))
    progress = _page(run.progress, offsets.get("progress", 0))
    children = _page(run.children, offsets.get("children", 0))
    tables: dict[str, TablePage[Any]] = {
        "steps": steps,
        "waits": waits,
        "hooks": hooks,
        "progress": progress,
        "children": children,
    }
    shown = [
        *(s.step_id for s in steps.rows),
        *(w.wait_id for w in waits.rows),
        *(h.hook_id for h in hooks.rows),
        *(p.progress_id for p in progress.rows),
    ]
    events = await _events_of(store, run.run_id, shown)
    live = run.status in LIVE_RUN_STATUSES
    timeline = build_timeline(events, now=datetime.now(UTC) if live else None, run=run)
    return Details(run=run, live=live, timeline=timeline, tables=tables)


async def _events_of(store: EventStore, run_id: str, subjects: Iterable[str]) -> list[Envelope]:
    """The first `ROW_EVENTS` events of each subject (step, wait, hook, progress id), in order."""
    found: dict[int, Envelope] = {}
    for subject in dict.fromkeys(subjects):
        for envelope in await store.read_by_correlation(run_id, subject, limit=ROW_EVENTS):
            found[envelope.sequence] = envelope
    return [found[sequence] for sequence in sorted(found)]
