"""PostgreSQL's runs row: written by an append only when a field it holds changes.

The run's head is its last event (`postgres.heads`), whose `(run_id, sequence)` primary key is
the run's lock, so an append that leaves the run's status, end time, owner and attributes as
they were writes no runs row. These checks look at the row itself (its `xmin`: the transaction
that last wrote it), at what the store says of the run (the summary, the orphans' order, the
holds of `claim_due`), and at an append racing the deletion of its ended run.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from runfold.conformance.builders import T0, created, kernel_summary, log, started, write
from runfold.errors import SequenceConflict
from runfold.events import RunClaimed, RunCompleted, RunStarted
from runfold.kernel import project_run, run_index
from tests.stores.test_postgres_store import (
    ANYWHERE,
    blocker,
    opened,
    prepared,
    queued_behind,
    rows,
    schema,
)

__all__ = ["schema"]  # the fixture, used by name

pytestmark = pytest.mark.postgres

SECOND = timedelta(seconds=1)
LATER = T0 + timedelta(days=1)


def runs_row(schema: str, run_id: str) -> tuple[Any, ...]:
    """The run's row in `runs` with the transaction that wrote it, as stored."""
    [row] = rows(f'SELECT xmin::text, * FROM "{schema}".runs WHERE run_id = %s', (run_id,))
    return row


async def test_an_append_that_changes_no_status_leaves_the_runs_row_as_it_was(schema: str) -> None:
    async with opened(schema) as store:
        await write(store, "r", *started(), at=T0)
        stored = runs_row(schema, "r")
        await write(store, "r", log("one"), at=T0 + SECOND)  # one statement
        await write(store, "r", log("two"), log("three"), at=T0 + 2 * SECOND)  # plain batch
        assert runs_row(schema, "r") == stored, "a log line rewrote the runs row"

        [summary] = await store.get_runs(["r"])
        assert summary is not None
        assert (summary.last_sequence, summary.updated_at) == (5, T0 + 2 * SECOND)
        assert summary == await kernel_summary(store, "r")
        assert (await store.list_runs()).items == (summary,)
        assert await store.head("r") == 5

        await write(store, "r", RunCompleted(output=b""), at=T0 + 3 * SECOND)
        assert runs_row(schema, "r") != stored, "the end of the run left its row as it was"
        [ended] = await store.get_runs(["r"])
        assert ended is not None and ended.status == "completed" and ended.last_sequence == 6
        assert ended == await kernel_summary(store, "r")


async def test_an_append_of_several_events_alone_writes_what_append_events_would(
    schema: str,
) -> None:
    """A plain append of several events, written alone, goes as `append_plain_batch` of that one
    append (the engine's steps are such appends): it leaves the row alone or ends the run, and
    where it writes nothing the store says why (a conflict) or hands it to `append_events` (the
    run still has a wakeup row to clear)."""
    deadline = T0 + timedelta(hours=1)
    async with opened(schema) as store:
        await write(store, "plain", *started(), at=T0)
        await write(store, "timed", created(deadline=deadline), RunStarted(), at=T0)
        stored = runs_row(schema, "plain")
        await write(store, "plain", log("a"), log("b"), at=T0 + SECOND)
        assert runs_row(schema, "plain") == stored, "two log lines rewrote the runs row"
        await write(store, "plain", log("c"), RunCompleted(output=b""), at=T0 + 2 * SECOND)
        assert runs_row(schema, "plain") != stored, "the end of the run left its row as it was"
        # The run had a wakeup and its end takes it away: `append_events` clears its row.
        await write(store, "timed", log("t"), RunCompleted(output=b""), at=T0 + 3 * SECOND)
        assert rows(f'SELECT count(*) FROM "{schema}".wakeups') == [(0,)]
        for run_id in ("plain", "timed"):
            [summary] = await store.get_runs([run_id])
            assert summary is not None and summary.status == "completed"
            assert summary == await kernel_summary(store, run_id)
        await write(store, "live", *started(), at=T0)
        head, index = await prepared(store, "live", [log("x"), log("y")])
        with pytest.raises(SequenceConflict) as conflict:
            await store.append_if_sequence(
                "live", head - 1, [log("x"), log("y")], index=index, recorded_at=T0
            )
        assert (conflict.value.expected, conflict.value.actual) == (head - 1, head)
        _, ghost = await prepared(store, "ghost", [*started(), log("x")])
        with pytest.raises(SequenceConflict) as conflict:
            await store.append_if_sequence(
                "ghost", 4, [log("x"), log("y")], index=ghost, recorded_at=T0
            )
        assert conflict.value.actual == 0
        assert [e.sequence for e in await store.read("plain")] == [1, 2, 3, 4, 5, 6]


async def test_orphans_come_oldest_last_event_first_when_no_append_rewrote_their_row(
    schema: str,
) -> None:
    async with opened(schema) as store:
        await write(store, "first", *started(), RunClaimed(owner_id="gone", epoch=1), at=T0)
        await write(store, "second", *started(), RunClaimed(owner_id="gone", epoch=1), at=T0)
        await write(store, "first", log("later"), at=T0 + SECOND)  # no runs row written
        orphans = await store.orphaned_runs(LATER)
        assert [s.run_id for s in orphans] == ["second", "first"]
        assert [s.updated_at for s in orphans] == [T0, T0 + SECOND]
        due = await store.claim_due("w1", now=LATER, hold_until=LATER + SECOND, limit=10)
        assert [d.run_id for d in due] == ["second", "first"]


async def test_a_claim_due_hold_lapses_once_the_run_moves_on_without_a_runs_write(
    schema: str,
) -> None:
    async with opened(schema) as store:
        await write(store, "r", *started(), RunClaimed(owner_id="gone", epoch=1), at=T0)
        until = LATER + timedelta(minutes=5)
        [due] = await store.claim_due("w1", now=LATER, hold_until=until, limit=10)
        assert due.run_id == "r"
        assert await store.claim_due("w2", now=LATER, hold_until=until, limit=10) == []
        stored = runs_row(schema, "r")
        await write(store, "r", log("moved on"), at=T0 + SECOND)
        assert runs_row(schema, "r") == stored
        [again] = await store.claim_due("w2", now=LATER, hold_until=until, limit=10)
        assert again.run_id == "r"


async def test_an_append_to_an_ended_run_waits_for_its_deletion_then_conflicts(
    schema: str,
) -> None:
    async with opened(schema) as store:
        await write(store, "r", *started(), RunCompleted(output=b""), at=T0)
        # The ended run's own index rows, unchanged: the kernel would refuse the late event, the
        # store writes what it is given.
        history = await store.read("r")
        head, index = len(history), run_index(project_run(history))
        async with blocker() as holder:
            # What retention does: lock the ended run's row, delete its rows, commit.
            await holder.execute(
                f'SELECT FROM "{schema}".runs WHERE run_id = %s FOR UPDATE', ("r",)
            )
            appending = asyncio.create_task(
                store.append_if_sequence("r", head, [log("late")], index=index, recorded_at=T0)
            )
            await queued_behind(holder, 1)  # the append holds the row it writes nothing to
            for table in ("events", "runs"):
                await holder.execute(f'DELETE FROM "{schema}".{table} WHERE run_id = %s', ("r",))
            await holder.commit()
            with pytest.raises(SequenceConflict) as conflict:
                await asyncio.wait_for(appending, ANYWHERE)
        assert (conflict.value.expected, conflict.value.actual) == (head, 0)
        assert rows(f'SELECT count(*) FROM "{schema}".events') == [(0,)]
