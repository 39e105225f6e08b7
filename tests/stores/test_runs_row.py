"""The runs row of the SQL stores: written by an append only when what it holds besides the head
changes.

SQLite reads the run's head and its time of last change from the events (`sqlite.reads.SUMMARY`);
PostgreSQL's head is the run's last event (`postgres.heads`), whose `(run_id, sequence)` primary
key is the run's lock. So on both an append that leaves the run's status, end time, owner and
attributes as they were writes no runs row. These checks look at the row itself, behind the
store's back (on PostgreSQL with its `xmin`: the transaction that last wrote it), and at what the
store says of the run: the summary, the orphans' order and the holds of `claim_due`. PostgreSQL's
own check, an append racing the deletion of its ended run, is in `test_postgres_runs_row.py`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from runfold.conformance.builders import T0, kernel_summary, log, started, write
from runfold.events import RunClaimed, RunCompleted
from runfold.stores import PostgresStore, SQLiteStore
from tests.support.postgres_support import DSN, admin, schema_name

SECOND = timedelta(seconds=1)
LATER = T0 + timedelta(days=1)


@attrs.define
class Backend:
    """A SQL store, and a way to read a run's row in `runs` behind its back."""

    store: SQLiteStore | PostgresStore
    runs_row: Callable[[str], tuple[Any, ...]]
    """The run's row as stored (on PostgreSQL with the transaction that wrote it)."""


def sqlite_runs_row(path: Path, run_id: str) -> tuple[Any, ...]:
    """The run's row in `runs`, as stored, on a plain connection."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        conn.close()
    assert row is not None
    return tuple(row)


def postgres_runs_row(schema: str, run_id: str) -> tuple[Any, ...]:
    """The run's row in `runs` with the transaction that wrote it, as stored."""
    [row] = (
        admin()
        .execute(f'SELECT xmin::text, * FROM "{schema}".runs WHERE run_id = %s', (run_id,))
        .fetchall()
    )
    return row


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        path = tmp_path / "runfold.db"
        async with await SQLiteStore.open(path) as store:
            yield Backend(store, lambda run_id: sqlite_runs_row(path, run_id))
        return
    admin()  # skips (fails under CI=true) without a server
    schema = schema_name("runsrow")
    async with await PostgresStore.open(DSN, schema=schema) as pg_store:
        yield Backend(pg_store, lambda run_id: postgres_runs_row(schema, run_id))


async def test_an_append_that_changes_no_status_leaves_the_runs_row_as_it_was(
    backend: Backend,
) -> None:
    store, runs_row = backend.store, backend.runs_row
    await write(store, "r", *started(), at=T0)
    stored = runs_row("r")
    await write(store, "r", log("one"), at=T0 + SECOND)  # PostgreSQL: one statement
    await write(store, "r", log("two"), log("three"), at=T0 + 2 * SECOND)  # a plain batch
    assert runs_row("r") == stored, "a log line rewrote the runs row"

    [summary] = await store.get_runs(["r"])
    assert summary is not None
    assert (summary.last_sequence, summary.updated_at) == (5, T0 + 2 * SECOND)
    assert summary == await kernel_summary(store, "r")
    assert (await store.list_runs()).items == (summary,)
    assert await store.head("r") == 5

    await write(store, "r", RunCompleted(output=b""), at=T0 + 3 * SECOND)
    assert runs_row("r") != stored, "the end of the run left its row as it was"
    [ended] = await store.get_runs(["r"])
    assert ended is not None and ended.status == "completed" and ended.last_sequence == 6
    assert ended == await kernel_summary(store, "r")


async def orphan(store: SQLiteStore | PostgresStore, run_id: str) -> None:
    """A started run claimed by a worker that is gone, recorded at T0."""
    await write(store, run_id, *started(), RunClaimed(owner_id="gone", epoch=1), at=T0)


async def test_orphans_come_oldest_last_event_first_when_no_append_rewrote_their_row(
    backend: Backend,
) -> None:
    store = backend.store
    await orphan(store, "first")
    await orphan(store, "second")
    await write(store, "first", log("later"), at=T0 + SECOND)  # no runs row written
    orphans = await store.orphaned_runs(LATER)
    assert [s.run_id for s in orphans] == ["second", "first"]
    assert [s.updated_at for s in orphans] == [T0, T0 + SECOND]
    due = await store.claim_due("w1", now=LATER, hold_until=LATER + SECOND, limit=10)
    assert [d.run_id for d in due] == ["second", "first"]


async def test_a_claim_due_hold_lapses_once_the_run_moves_on_without_a_runs_write(
    backend: Backend,
) -> None:
    store, runs_row = backend.store, backend.runs_row
    await orphan(store, "r")
    until = LATER + timedelta(minutes=5)
    [due] = await store.claim_due("w1", now=LATER, hold_until=until, limit=10)
    assert due.run_id == "r"
    assert await store.claim_due("w2", now=LATER, hold_until=until, limit=10) == []
    stored = runs_row("r")
    await write(store, "r", log("moved on"), at=T0 + SECOND)
    assert runs_row("r") == stored
    [again] = await store.claim_due("w2", now=LATER, hold_until=until, limit=10)
    assert again.run_id == "r"
