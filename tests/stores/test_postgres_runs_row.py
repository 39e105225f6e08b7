"""PostgreSQL's runs row: an append racing the deletion of its ended run.

The run's head is its last event (`postgres.heads`), whose `(run_id, sequence)` primary key is
the run's lock; an append that changes no field of the runs row still holds that row, so it waits
for retention's deletion and then conflicts. The checks both SQL stores share (a row no append
rewrites, the orphans' order, the holds of `claim_due`) are in `test_runs_row.py`.
"""

from __future__ import annotations

import asyncio

import pytest

from runfold.conformance.builders import T0, log, started, write
from runfold.errors import SequenceConflict
from runfold.events import RunCompleted
from runfold.kernel import project_run, run_index
from tests.stores.test_postgres_store import (
    ANYWHERE,
    blocker,
    opened,
    queued_behind,
    rows,
    schema,
)

__all__ = ["schema"]  # the fixture, used by name

pytestmark = pytest.mark.postgres


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
