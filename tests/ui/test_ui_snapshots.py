"""The inspector's kept snapshots, over a real SQLite file: caught up with new events only, and
never mistaken for those of a run deleted and made again under the same id."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from runfold import CommandHandler
from runfold.commands import CompleteRun, CreateRun, RecordLog, StartRun
from runfold.kernel import project_run
from runfold.stores import SQLiteStore
from runfold.ui.snapshots import SnapshotCache


async def _run(handler: CommandHandler, run_id: str, logs: int, workflow: str) -> None:
    create = CreateRun(workflow_name=workflow, input=b"{}")
    await handler.execute(run_id, StartRun(create=create))
    for n in range(logs):
        await handler.execute(run_id, RecordLog(level="info", message=f"line {n}"))


async def test_kept_snapshots_catch_up_and_tell_a_run_made_again(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "runs.db") as store:
        handler = CommandHandler(store)
        cache = SnapshotCache(store)
        assert await cache.get("r") is None
        await _run(handler, "r", 3, "first")
        kept = await cache.get("r")
        assert kept is not None and kept.last_sequence == 5
        await handler.execute("r", RecordLog(level="info", message="more"))
        caught_up = await cache.get("r")
        assert caught_up == project_run(await store.read("r"))
        await handler.execute("r", CompleteRun(output=b"{}"))
        await cache.get("r")
        ended = (await store.get_runs(["r"]))[0]
        assert ended is not None and ended.completed_at is not None
        deleted = await store.delete_runs(
            terminal_before=ended.completed_at + timedelta(seconds=1), limit=10, run_ids=["r"]
        )
        assert deleted == 1
        await _run(handler, "r", 9, "second")  # made again, longer than the kept one
        summary = (await store.get_runs(["r"]))[0]
        assert summary is not None
        again = await cache.get("r", created_at=summary.created_at)
        assert again is not None and again.workflow_name == "second"
        assert again == project_run(await store.read("r"))
