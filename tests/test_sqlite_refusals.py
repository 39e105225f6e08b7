"""A SQLite append refused by something other than a lost race says so, at once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from runfold import CommandHandler, RecordLog, SequenceConflict, StoreError
from runfold.stores import SQLiteStore
from tests.test_handler import START


async def test_an_insert_refused_by_a_users_trigger_is_a_store_error_not_a_conflict(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store)
        await handler.execute("r", START)
    with sqlite3.connect(path) as conn:  # a policy of the user's, in the database itself
        conn.execute(
            "CREATE TRIGGER no_logs BEFORE INSERT ON events WHEN NEW.type = 'log_recorded' "
            "BEGIN SELECT RAISE(ABORT, 'logs are refused here'); END"
        )
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store, conflict_backoff=0)
        with pytest.raises(StoreError, match="logs are refused here") as refused:
            await handler.execute("r", RecordLog(level="info", message="x"))
        assert not isinstance(refused.value, SequenceConflict)
        assert isinstance(refused.value.__cause__, sqlite3.IntegrityError)
        assert await store.head("r") == 2
