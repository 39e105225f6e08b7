"""The stores at scale: retention, run listings and due wakeups on 1,000, 10,000 and 100,000 runs.

Each size is a fresh store (a SQLite file, a PostgreSQL schema) holding two template runs written
through runfold (one that ended, one live with a deadline), copied by SQL until the store holds
`size` runs: three in four ended, one in four live with a wakeup, ten workflow names. Copying
keeps the rows exactly as the store writes them, and makes 100,000 runs a matter of seconds.
A query whose plan walks what it does not need shows as a rate that falls with the size. SQLite's
file has no planner statistics (as a store never closed cleanly), PostgreSQL's tables are
vacuumed and analyzed (as autovacuum leaves them). Retention's rate also falls as the deletes of
a batch dirty pages spread over larger indexes, which its commit writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg

from benchmarks.harness import Measurement, Remark, Result, Trial, compare, event_loop, measure
from benchmarks.postgres import POSTGRES, dsn, fresh_schema
from benchmarks.sqlite import SQLITE
from benchmarks.targets import SCALE_FLAT
from benchmarks.workloads import T0
from runfold import CommandHandler, EventStore
from runfold.commands import CompleteRun, CreateRun, StartRun
from runfold.stores import PostgresStore, SQLiteStore

__all__ = ["bench_scale"]

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000,)
BATCH = 100
"""Runs per `delete_runs` call of the retention rows."""
CALLS = 50
"""Queries per timed run of the listing and wakeup rows."""
WORKFLOWS = 10
"""Workflow names the runs are spread over."""
ENDED, LIVE = "ended", "live"
FAR_FUTURE = T0 + timedelta(days=3650)
_SPACING = 10
"""Feed positions each copy of a template run may take (a template run has fewer events)."""


async def _templates(store: EventStore) -> None:
    """The two runs every other is a copy of, written through runfold."""
    handler = CommandHandler(store, clock=lambda: T0)
    await handler.execute(ENDED, StartRun(create=CreateRun(workflow_name="wf-0", input=b"")))
    await handler.execute(ENDED, CompleteRun(output=b"done"))
    deadline = T0 + timedelta(hours=1)
    live = CreateRun(workflow_name="wf-0", input=b"", deadline=deadline)
    await handler.execute(LIVE, StartRun(create=live))


def _copies(size: int) -> tuple[int, int]:
    """How many copies of each template make `size` runs (with the templates): ended, live."""
    ended = size * 3 // 4
    return ended - 1, size - ended - 1


# Copy number `i` of a template: run id `<template>-<i>` (`i` zero-padded, so ids sort in the order
# the runs were created, as runfold's own run ids do), times `i` microseconds later, workflow
# `wf-<i mod WORKFLOWS>`, feed positions in a range of its own.
_SQLITE_COPY = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :copies)
INSERT INTO {table} SELECT {columns} FROM {table}, n WHERE run_id = :template
"""


def _fill_sqlite(path: Path, size: int) -> None:
    ended, live = _copies(size)
    copy = {
        "runs": "run_id || '-' || printf('%06d', i), 'wf-' || (i % {w}), status, parent_run_id, "
        "created_at + i, updated_at + i, completed_at + i, last_sequence, attributes, owner_id, "
        "queue_name, priority, dedup_id",
        "events": "run_id || '-' || printf('%06d', i), sequence, type, schema_version, "
        "correlation_id, payload, recorded_at + i, :offset + i * {s} + sequence",
        "wakeups": "run_id || '-' || printf('%06d', i), kind, subject_id, due_at + i",
    }
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        for number, (template, copies) in enumerate(((ENDED, ended), (LIVE, live))):
            offset = 1_000 + number * size * _SPACING  # above the templates' own positions
            for table, columns in copy.items():
                conn.execute(
                    _SQLITE_COPY.format(
                        table=table, columns=columns.format(w=WORKFLOWS, s=_SPACING)
                    ),
                    {"copies": copies, "template": template, "offset": offset},
                )
        conn.execute("UPDATE feed_high_water SET position = (SELECT max(position) FROM events)")
        analyzed = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_stat1'"
        ).fetchone()
        if analyzed:  # the statistics of the templates, if any: as if never analyzed
            conn.execute("DELETE FROM sqlite_stat1")
        conn.execute("COMMIT")


_POSTGRES_COPY = """
INSERT INTO {s}.{table} SELECT {columns}
FROM {s}.{table}, generate_series(1, %(copies)s) AS i WHERE run_id = %(template)s
"""


async def _fill_postgres(schema: str, size: int) -> None:
    ended, live = _copies(size)
    # PostgreSQL's positions are transaction ids × 1,000,000: the copies' stay far below.
    copy = {
        "runs": "run_id || '-' || lpad(i::text, 6, '0'), 'wf-' || mod(i, {w}), status, "
        "parent_run_id, created_at + i, updated_at + i, completed_at + i, last_sequence, "
        "attributes, head, %(offset)s + i * {s} + head, has_hooks, has_wakeups, owner_id, "
        "queue_name, priority, dedup_id",
        "events": "run_id || '-' || lpad(i::text, 6, '0'), sequence, type, schema_version, "
        "correlation_id, payload, recorded_at + i, %(offset)s + i * {s} + sequence",
        "wakeups": "run_id || '-' || lpad(i::text, 6, '0'), kind, subject_id, due_at + i",
    }
    async with await psycopg.AsyncConnection.connect(dsn(), autocommit=True) as conn:
        async with conn.transaction():
            for number, (template, copies) in enumerate(((ENDED, ended), (LIVE, live))):
                offset = number * size * _SPACING
                for table, columns in copy.items():
                    query = _POSTGRES_COPY.format(
                        s=f'"{schema}"',
                        table=table,
                        columns=columns.format(w=WORKFLOWS, s=_SPACING),
                    )
                    params = {"copies": copies, "template": template, "offset": offset}
                    await conn.execute(query, params)
        # As autovacuum leaves tables in a steady state; left to it, it would run meanwhile.
        await conn.execute(f'VACUUM ANALYZE "{schema}".runs, "{schema}".events, "{schema}".wakeups')


@contextlib.contextmanager
def _sqlite_store(loop: asyncio.AbstractEventLoop, size: int) -> Iterator[EventStore]:
    with tempfile.TemporaryDirectory(prefix="runfold-bench-") as directory:
        path = Path(directory) / "scale.db"
        writer = loop.run_until_complete(SQLiteStore.open(path, synchronous="FULL"))
        loop.run_until_complete(_templates(writer))
        loop.run_until_complete(writer.close())
        _fill_sqlite(path, size)
        store = loop.run_until_complete(SQLiteStore.open(path, synchronous="FULL"))
        try:
            yield store
        finally:
            loop.run_until_complete(store.close())


@contextlib.contextmanager
def _postgres_store(loop: asyncio.AbstractEventLoop, size: int) -> Iterator[EventStore]:
    with fresh_schema() as schema:
        store = loop.run_until_complete(PostgresStore.open(dsn(), schema=schema, pool_max=2))
        try:
            loop.run_until_complete(_templates(store))
            loop.run_until_complete(_fill_postgres(schema, size))
            yield store
        finally:
            loop.run_until_complete(store.close())


def _queries(loop: asyncio.AbstractEventLoop, store: EventStore, size: int) -> dict[str, Trial]:
    """The read queries timed at each size, `CALLS` calls each."""
    middle = loop.run_until_complete(store.list_runs(limit=size // 2)).cursor  # untimed

    def calls(query: Callable[[], Awaitable[object]]) -> Trial:
        async def run() -> None:
            for _ in range(CALLS):
                await query()

        return Trial(run=lambda: loop.run_until_complete(run()))

    return {
        "list_runs, the newest page of 20": calls(lambda: store.list_runs(limit=20)),
        "list_runs by status (live runs), a page of 20": calls(
            lambda: store.list_runs(status="running", limit=20)
        ),
        "list_runs by workflow name, a page of 20": calls(
            lambda: store.list_runs(workflow_name="wf-3", limit=20)
        ),
        "list_runs, a page of 20 from the middle (cursor)": calls(
            lambda: store.list_runs(limit=20, cursor=middle)
        ),
        "due_wakeups, a page of 100 (every live run due)": calls(
            lambda: store.due_wakeups(FAR_FUTURE, limit=100)
        ),
    }


def _retention(loop: asyncio.AbstractEventLoop, store: EventStore) -> Trial:
    async def delete() -> None:
        deleted = await store.delete_runs(terminal_before=FAR_FUTURE, limit=BATCH)
        assert deleted == BATCH, deleted

    return Trial(run=lambda: loop.run_until_complete(delete()))


def bench_scale(quick: bool) -> list[Result | Remark]:
    """Retention, listings and due wakeups at each size, on SQLite and on PostgreSQL."""
    sizes = QUICK_SIZES if quick else SIZES
    repeats = 2 if quick else 5
    found: list[Result | Remark] = []
    backends: list[tuple[str, str, Callable[..., contextlib.AbstractContextManager[EventStore]]]]
    backends = [(SQLITE.name, SQLITE.describe(), _sqlite_store)]
    if POSTGRES.version() is not None:
        backends.append((POSTGRES.name, POSTGRES.describe(), _postgres_store))
    else:
        found.append(Remark(group="PostgreSQL scale", text="no PostgreSQL server: not measured"))
    for name, on, opening in backends:
        group = f"{name} scale"
        smallest: dict[str, Measurement] = {}
        for size in sizes:
            with event_loop() as loop, opening(loop, size) as store:
                rates = {
                    what: measure(trial, units=CALLS, repeats=repeats)
                    for what, trial in _queries(loop, store, size).items()
                }
                retention = measure(_retention(loop, store), units=BATCH, repeats=repeats)
            for what, rate in [("delete_runs", retention), *rates.items()]:
                first = smallest.setdefault(what, rate)
                case = (
                    f"delete_runs of {BATCH} ended runs at a time (retention)"
                    if what == "delete_runs"
                    else what
                )
                found.append(
                    Result(
                        group=group,
                        case=f"{case}, {size:,} runs",
                        on=on,
                        unit="runs/s" if what == "delete_runs" else "queries/s",
                        value=rate,
                        comparisons=()
                        if size == sizes[0]
                        else compare(
                            rate,
                            f"{sizes[0]:,} runs",
                            first,
                            SCALE_FLAT if size == SIZES[-1] else None,
                        ),
                    )
                )
    return found
