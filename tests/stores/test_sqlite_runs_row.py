"""SQLite's runs row: written by an append only when what it holds besides the head changes.

The run's head and its time of last change are read from the events (`sqlite.reads.SUMMARY`),
so an append that leaves the run's status, end time, owner and attributes as they were writes
no runs page. These checks look at the row itself, behind the store's back, and at what the
store says of the run: the summary, the orphans' order and the holds of `claim_due`.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from runfold.conformance.builders import T0, kernel_summary, log, started, write
from runfold.events import RunClaimed, RunCompleted
from runfold.stores import SQLiteStore

SECOND = timedelta(seconds=1)
LATER = T0 + timedelta(days=1)


def runs_row(path: Path, run_id: str) -> tuple[Any, ...]:
    """The run's row in `runs`, as stored, on a plain connection."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        conn.close()
    assert row is not None
    return tuple(row)


async def test_an_append_that_changes_no_status_leaves_the_runs_row_as_it_was(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", *started(), at=T0)
        stored = runs_row(path, "r")
        await write(store, "r", log("one"), at=T0 + SECOND)
        await write(store, "r", log("two"), log("three"), at=T0 + 2 * SECOND)
        assert runs_row(path, "r") == stored, "a log line rewrote the runs row"

        [summary] = await store.get_runs(["r"])
        assert summary is not None
        assert (summary.last_sequence, summary.updated_at) == (5, T0 + 2 * SECOND)
        assert summary == await kernel_summary(store, "r")
        assert (await store.list_runs()).items == (summary,)

        await write(store, "r", RunCompleted(output=b""), at=T0 + 3 * SECOND)
        assert runs_row(path, "r") != stored, "the end of the run left its row as it was"
        [ended] = await store.get_runs(["r"])
        assert ended is not None and ended.status == "completed" and ended.last_sequence == 6
        assert ended == await kernel_summary(store, "r")


async def orphan(store: SQLiteStore, run_id: str) -> None:
    """A started run claimed by a worker that is gone, recorded at T0."""
    await write(store, run_id, *started(), RunClaimed(owner_id="gone", epoch=1), at=T0)


async def test_orphans_come_oldest_last_event_first_when_no_append_rewrote_their_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await orphan(store, "first")
        await orphan(store, "second")
        await write(store, "first", log("later"), at=T0 + SECOND)  # no runs row written
        orphans = await store.orphaned_runs(LATER)
        assert [s.run_id for s in orphans] == ["second", "first"]
        assert [s.updated_at for s in orphans] == [T0, T0 + SECOND]


async def test_a_claim_due_hold_lapses_once_the_run_moves_on_without_a_runs_write(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await orphan(store, "r")
        until = LATER + timedelta(minutes=5)
        [due] = await store.claim_due("w1", now=LATER, hold_until=until, limit=10)
        assert due.run_id == "r"
        assert await store.claim_due("w2", now=LATER, hold_until=until, limit=10) == []
        stored = runs_row(path, "r")
        await write(store, "r", log("moved on"), at=T0 + SECOND)
        assert runs_row(path, "r") == stored
        [again] = await store.claim_due("w2", now=LATER, hold_until=until, limit=10)
        assert again.run_id == "r"
