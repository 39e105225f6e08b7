"""PostgreSQL's runs row: a plain append of several events, and an append racing the deletion
of its ended run.

The run's head is its last event (`postgres.heads`), whose `(run_id, sequence)` primary key is
the run's lock. A plain append of several events goes as `append_plain_batch`, which writes the
runs row only where `append_events` would. An append that changes no field of the runs row still
holds that row, so it waits for retention's deletion and then conflicts. The checks both SQL
stores share (a row no append rewrites, the orphans' order, the holds of `claim_due`) are in
`test_runs_row.py`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from runfold.conformance.builders import T0, created, kernel_summary, log, started, write
from runfold.errors import SequenceConflict
from runfold.events import RunCompleted, RunStarted
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
from tests.stores.test_runs_row import SECOND
from tests.stores.test_runs_row import postgres_runs_row as runs_row

__all__ = ["schema"]  # the fixture, used by name

pytestmark = pytest.mark.postgres


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
