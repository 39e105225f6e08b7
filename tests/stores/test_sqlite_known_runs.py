"""What each of `SQLiteStore`'s connections remembers of the runs its own appends wrote
(`stores.sqlite.known.KnownRuns`).

A run's state is remembered only while nothing else can have written the file: every check here
writes behind the store's back (another store on the file, or another call on the same
connection) and expects the fence to hold as if nothing were remembered.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from runfold.errors import SequenceConflict
from runfold.events import Envelope, Event, RunCompleted
from runfold.stores import SQLiteStore
from tests.conftest import T0
from tests.stores.test_sqlite_store import (
    FAR_FUTURE,
    envelopes_for,
    index_after,
    log,
    plain_query,
    positions,
    started,
    write,
)


async def _append_at(
    store: SQLiteStore, run_id: str, head: int, history: Sequence[Envelope], *events: Event
) -> list[Envelope]:
    index = index_after(history, envelopes_for(run_id, head, events, T0))
    return await store.append_if_sequence(run_id, head, events, index=index, recorded_at=T0)


async def test_an_append_after_the_connection_s_own_reads_nothing_back(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "runfold.db") as store:
        assert store._inline is not None
        statements: list[str] = []
        await write(store, "r", *started())
        store._inline.set_trace_callback(statements.append)
        [third] = await _append_at(store, "r", 2, await store.read("r"), log("next"))
        assert third.sequence == 3 and third.position == 3
        reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
        assert reads == [], statements  # the head, the index rows and the feed: as it left them
        assert [e.sequence for e in await write(store, "other", *started())] == [1, 2]
        assert positions(await store.read_all()) == [1, 2, 3, 4, 5]


async def test_a_run_written_by_another_store_is_read_again_not_remembered(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    for commit_inline in (True, False):
        run_id = f"r-{commit_inline}"
        async with (
            await SQLiteStore.open(path, commit_inline=commit_inline) as store,
            await SQLiteStore.open(path) as other,
        ):
            first = await write(store, run_id, *started())
            await write(store, run_id, log("mine"))  # remembered by the store's connection
            await write(other, run_id, log("theirs"))  # behind its back: head 4
            with_three = [*first, *(await store.read(run_id))[2:3]]
            with pytest.raises(SequenceConflict) as raised:
                await _append_at(store, run_id, 3, with_three, log("stale"))
            assert (raised.value.expected, raised.value.actual) == (3, 4)
            [fifth] = await write(store, run_id, log("after"))
            assert fifth.sequence == 5
            feed = await store.read_all()
            assert positions(feed) == list(range(1, len(feed) + 1))


async def test_a_run_changed_by_another_call_on_the_same_connection_is_read_again(
    tmp_path: Path,
) -> None:
    # Every append goes to the driver's connection, as retention does: the deletion must make
    # the store forget what its appends left of the run.
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path, commit_inline=False) as store:
        history = await write(store, "r", *started())
        await write(store, "r", RunCompleted(output=b""))  # remembered: head 3, completed
        assert await store.delete_runs(terminal_before=FAR_FUTURE, limit=10) == 1
        assert await store.head("r") == 0
        with pytest.raises(SequenceConflict) as raised:
            await _append_at(store, "r", 2, history, log("stale"))
        assert (raised.value.expected, raised.value.actual) == (2, 0)
        again = await write(store, "r", *started())
        assert [e.sequence for e in again] == [1, 2]
        [row] = plain_query(path, "SELECT status FROM runs WHERE run_id = 'r'")
        assert row == ("running",)
