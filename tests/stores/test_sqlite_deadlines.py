"""SQLite store calls end by their deadline: `StoreTimeout` (nothing written) or `CommitUnknown`.

The lock is a real one: another process holds the file's write lock (`BEGIN IMMEDIATE`) for
as long as the test wants, as an application sharing the file would (`write_lock_held`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from runfold import CommandHandler
from runfold.commands import CreateRun, RecordLog, StartRun
from runfold.conformance.builders import created, envelopes_for, index_after, log
from runfold.errors import CommitUnknown, StoreTimeout, StoreUnavailable
from runfold.store_retry import StoreRetry
from runfold.stores import SQLiteStore
from tests.conftest import T0
from tests.support.sqlite_lock import let_go, write_lock_held


async def append_log(store: SQLiteStore, run_id: str, message: str) -> Any:
    history = await store.read(run_id)
    head = len(history)
    events = [log(message)] if history else [created(), log(message)]
    index = index_after(history, envelopes_for(run_id, head, events, T0))
    return await store.append_if_sequence(run_id, head, events, index=index, recorded_at=T0)


async def test_an_append_that_waits_for_a_foreign_lock_past_its_deadline_times_out(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "runs.db")
    async with await SQLiteStore.open(path, busy_timeout=30.0, call_timeout=0.3) as store:
        await append_log(store, "r", "a")
        with write_lock_held(path):
            started = time.monotonic()
            with pytest.raises(StoreTimeout) as raised:
                await append_log(store, "r", "b")
            took = time.monotonic() - started
            assert isinstance(raised.value, StoreUnavailable)
            assert isinstance(raised.value, TimeoutError)  # caught as asyncio.timeout's too
            assert took < 0.3 + 1.0, took
            # A per-call deadline overrides the store's.
            started = time.monotonic()
            with store.timeout(0.1), pytest.raises(StoreTimeout):
                await append_log(store, "r", "c")
            assert time.monotonic() - started < 0.1 + 1.0
        assert [e.sequence for e in await store.read("r")] == [1, 2]  # nothing written
        [written] = await append_log(store, "r", "d")  # the lock gone, the store works
        assert written.sequence == 3


async def test_a_call_queued_behind_a_lock_wait_ends_by_its_own_deadline(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "runs.db")
    async with await SQLiteStore.open(path, busy_timeout=30.0, call_timeout=3.0) as store:
        await append_log(store, "r", "a")
        with write_lock_held(path) as holder:
            waiting = asyncio.create_task(append_log(store, "r", "b"))  # waits up to 3 s
            await asyncio.sleep(0.1)
            started = time.monotonic()
            with store.timeout(0.2), pytest.raises(StoreTimeout, match="was not made"):
                await store.head("r")  # queued behind it on the connection's thread
            assert time.monotonic() - started < 0.2 + 1.0
            let_go(holder)
            [written] = await waiting  # the lock freed within its deadline: written
        assert written.sequence == 3
        assert await store.head("r") == 3


async def test_a_write_still_running_past_its_deadline_is_commit_unknown(
    tmp_path: Path,
) -> None:
    # What the caller can tell of a transaction the thread is still in: not whether it commits.
    path = str(tmp_path / "runs.db")
    async with await SQLiteStore.open(path, call_timeout=0.1) as store:

        def slow(conn: Any) -> None:
            time.sleep(0.8)

        started = time.monotonic()
        with pytest.raises(CommitUnknown):
            await store._call(
                slow, late=lambda reason: CommitUnknown("r", 0, reason)
            )  # a write's error
        await asyncio.sleep(0.4)  # the thread is done with it
        with pytest.raises(StoreTimeout, match="not waited for"):
            await store._call(slow)  # a read's
        assert time.monotonic() - started < 2 * (0.1 + 1.0)


async def test_the_handler_rides_through_a_foreign_lock_held_past_a_call_deadline(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "runs.db")
    async with await SQLiteStore.open(path, call_timeout=0.2) as store:
        handler = CommandHandler(store, store_retry=StoreRetry(budget=10.0, max_pause=0.2))
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        with write_lock_held(path) as holder:
            logging = asyncio.create_task(
                handler.execute("r", RecordLog(level="info", message="x"))
            )
            await asyncio.sleep(0.8)  # several deadlines pass
            assert not logging.done()
            let_go(holder)
            outcome = await logging
        assert [e.event.event_type for e in outcome.appended] == ["log_recorded"]
        assert [e.sequence for e in await store.read("r")] == [1, 2, 3]


async def test_a_call_timeout_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="call_timeout"):
        await SQLiteStore.open(str(tmp_path / "runs.db"), call_timeout=0)
    async with await SQLiteStore.open(str(tmp_path / "runs.db")) as store:
        with pytest.raises(ValueError, match="positive"), store.timeout(-1):
            pass
