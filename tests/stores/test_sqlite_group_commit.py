"""`SQLiteStore`'s group commit where the event loop has nothing else to run: appends made
together commit on its thread, in one transaction (`stores.sqlite.group`)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from runfold.events import Envelope, Event
from runfold.stores import SQLiteStore
from tests.conftest import T0
from tests.stores.test_sqlite_store import (
    envelopes_for,
    index_after,
    plain_query,
    positions,
    started,
)


def _tracing(conn: sqlite3.Connection, into: list[str]) -> None:
    conn.set_trace_callback(into.append)


def _begins(statements: Sequence[str]) -> int:
    return sum(1 for s in statements if s.strip().upper().startswith("BEGIN"))


async def _append_at(
    store: SQLiteStore, run_id: str, head: int, history: Sequence[Envelope], *events: Event
) -> list[Envelope]:
    index = index_after(history, envelopes_for(run_id, head, events, T0))
    return await store.append_if_sequence(run_id, head, events, index=index, recorded_at=T0)


async def test_appends_made_together_with_nothing_else_to_run_commit_here_in_one_transaction(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        assert store._inline is not None
        on_driver: list[str] = []
        inline: list[str] = []
        await store._run(_tracing, on_driver)
        _tracing(store._inline, inline)
        tasks = [
            asyncio.ensure_future(_append_at(store, f"r{n}", 0, [], *started())) for n in range(8)
        ]
        await asyncio.wait(tasks)  # this task waits: nothing else is ready while they commit
        assert [[e.sequence for e in task.result()] for task in tasks] == [[1, 2]] * 8
        assert (_begins(inline), _begins(on_driver)) == (1, 0), (inline, on_driver)
        assert plain_query(path, "SELECT count(*) FROM events") == [(16,)]
        feed = await store.read_all()
        assert positions(feed) == list(range(1, 17))

        # Another writer holds the file's lock: they wait for it on the driver's thread, not on
        # the event loop's, and go in once it is free.
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        tasks = [
            asyncio.ensure_future(_append_at(store, f"s{n}", 0, [], *started())) for n in range(3)
        ]
        for _ in range(20):  # the loop keeps running while they wait
            await asyncio.sleep(0.005)
        assert not any(task.done() for task in tasks)
        locker.execute("ROLLBACK")
        locker.close()
        await asyncio.wait(tasks)
        assert [[e.sequence for e in task.result()] for task in tasks] == [[1, 2]] * 3
        assert _begins(on_driver) >= 1


async def test_an_append_written_after_its_caller_left_still_wakes_its_waiters(
    tmp_path: Path,
) -> None:
    # Each written append is posted as it is settled, not by its caller once it resumes: one
    # cancelled while the driver's thread waited for the lock posts its run all the same.
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        waiting = asyncio.ensure_future(store.wait_for_work(30.0))
        await asyncio.sleep(0)  # the wait counts from its first step
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        task = asyncio.ensure_future(_append_at(store, "r", 0, [], *started()))
        for _ in range(5):
            await asyncio.sleep(0.005)
        task.cancel()
        locker.execute("ROLLBACK")
        locker.close()
        assert await waiting is True  # an unowned live run: work for the fleet
        assert task.cancelled()
        assert plain_query(path, "SELECT count(*) FROM events") == [(2,)]
