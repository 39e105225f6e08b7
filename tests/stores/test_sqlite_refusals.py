"""SQLiteStore facing the unexpected: an append refused by the user's own trigger (alone, and
part way through its writes in a group commit), and a DEBUG log that must not hold hook
tokens."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import CreateHook, RecordLog
from runfold.conformance.builders import created, envelopes_for, index_after, log
from runfold.errors import HookNotFound, SequenceConflict, StoreError
from runfold.stores import SQLiteStore
from runfold.stores.sqlite.writer import Append, append_batch
from tests.conftest import T0
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


async def test_a_group_commit_undoes_only_the_append_refused_after_its_first_rows(
    tmp_path: Path,
) -> None:
    """A group commit writes its appends without a savepoint each; one refused after it wrote
    its events (the runs row refused by a trigger) is undone alone, the others still written."""
    path = tmp_path / "runs.db"
    await (await SQLiteStore.open(path)).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            "CREATE TRIGGER no_run_b BEFORE INSERT ON runs WHEN NEW.run_id = 'b' "
            "BEGIN SELECT RAISE(ABORT, 'run b is refused here'); END"
        )
        batch: list[Append] = []
        for run_id in ("a", "b", "c", "a"):
            expected = 2 if batch and run_id == "a" else 0
            events = [log("more")] if expected else [created(), log("first")]
            before = envelopes_for(run_id, 0, [created(), log("first")], T0) if expected else []
            index = index_after(before, envelopes_for(run_id, expected, events, T0))
            batch.append(Append(run_id, expected, events, index, T0, None))
        outcomes = append_batch(conn, batch)
        refused = outcomes[1]
        assert isinstance(refused, StoreError) and "run b is refused" in str(refused)
        assert isinstance(refused.__cause__, sqlite3.IntegrityError)
        assert [len(o) for o in outcomes if isinstance(o, list)] == [2, 2, 1]
        heads = dict(conn.execute("SELECT run_id, max(sequence) FROM events GROUP BY run_id"))
        assert heads == {"a": 3, "c": 2}  # nothing of b's: its events were undone
        runs = [row[0] for row in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
        assert runs == ["a", "c"]
    finally:
        conn.close()


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
