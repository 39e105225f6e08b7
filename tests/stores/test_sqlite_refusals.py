"""SQLiteStore facing the unexpected: an append refused by the user's own trigger, and a DEBUG
log that must not hold hook tokens."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import CreateHook, RecordLog
from runfold.errors import HookNotFound, SequenceConflict, StoreError
from runfold.stores import SQLiteStore
from tests.handler.test_handler import START


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


async def test_no_hook_token_reaches_a_debug_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """aiosqlite logs every call it runs at DEBUG; a token, valid or guessed, is not in them."""
    secret = "tok-7f3a9c1e-secret"
    guessed = "tok-guessed-by-an-attacker"
    caplog.set_level(logging.DEBUG)
    async with await SQLiteStore.open(tmp_path / "runs.db") as store:
        handler = CommandHandler(store)
        await handler.execute("r", START)
        await handler.execute("r", CreateHook(hook_id="h", token=secret))
        assert await store.find_hook(secret, now=handler.clock()) is not None
        with pytest.raises(HookNotFound):
            await handler.deliver(guessed, b"")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "runfold SQLite call" in logged  # the calls were logged, by name
    assert secret not in logged and guessed not in logged
