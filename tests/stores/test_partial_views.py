"""Reads never pass a partial view for the whole.

- `runfold verify` on a store being written reports only real problems: a run appended to
  between the listing of index rows and its replay is looked at again.
- A read-only SQLite open that cannot make the `-shm` file cannot see the write-ahead log: with
  a `-wal` file holding data it is refused, never a silent partial listing (it listed 156 of
  300 runs, said a committed run did not exist, and verify said ok).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from runfold import CommandHandler, EventStore
from runfold.cli.verify import VerifyReport, verify_store
from runfold.engine import Engine
from runfold.errors import StoreOpenError
from runfold.kernel import Page, RunSummary
from runfold.stores import SQLiteStore
from runfold.testing import DelegatingStore
from tests.cli.test_cli import Parked
from tests.conftest import Clock
from tests.stores.test_sqlite_store import read_only, refused


class WrittenMeanwhile(DelegatingStore):
    """A store another engine writes to right after verify lists its runs."""

    def __init__(self, inner: EventStore, engine: Engine) -> None:
        super().__init__(inner)
        self.engine = engine
        self.writes = 0

    async def list_runs(self, **options: object) -> Page[RunSummary]:
        page = await self.inner.list_runs(**options)  # type: ignore[arg-type]
        self.writes += 1
        if self.writes == 1:  # the first two listings are overtaken by a write
            await self.engine.resume_wait("b", "nap")  # b awaits its hook
        elif self.writes == 2:
            await self.engine.deliver("token-b", b"")  # b completes
        return page


async def test_verify_on_a_store_being_written_reports_only_real_problems(
    store: EventStore, clock: Clock
) -> None:
    engine = Engine(CommandHandler(store, clock=clock), Parked())
    for run_id in ("a", "b"):
        await engine.start("parked", b"", run_id=run_id)
    live = WrittenMeanwhile(store, engine)
    assert await verify_store(live, now=clock.now) == VerifyReport(runs=2, problems=())
    assert live.writes == 3  # the second look was overtaken too, the third stood still


async def committed_in_the_wal(path: Path, runs: int) -> Path:
    """A copy of a store at `path`, whose last `runs` runs are only in its `-wal` file."""
    async with await SQLiteStore.open(path) as store:
        engine = Engine(CommandHandler(store), Parked())
        for n in range(runs):
            await engine.start("parked", b"", run_id=f"run-{n}")
        folder = path.parent / "copy"
        folder.mkdir()
        for suffix in ("", "-wal"):  # as a crash leaves them: no -shm, the WAL not checkpointed
            shutil.copyfile(f"{path}{suffix}", f"{folder / path.name}{suffix}")
    return folder / path.name


async def test_a_read_only_open_that_cannot_see_the_wal_is_refused(tmp_path: Path) -> None:
    copy = await committed_in_the_wal(tmp_path / "runfold.db", 300)
    assert Path(f"{copy}-wal").stat().st_size > 0
    with read_only(copy.parent):  # nobody can make the -shm file beside it
        error = await refused(copy, StoreOpenError, read_only=True)
        message = str(error)
        assert "runfold.db-wal" in message and "-shm" in message
    async with await SQLiteStore.open(copy, read_only=True) as store:  # now it can: all 300
        listed = await store.list_runs(limit=1000)
        assert len(listed.items) == 300


async def test_a_read_only_open_without_a_wal_reads_the_file_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "ro" / "runfold.db"
    path.parent.mkdir()
    async with await SQLiteStore.open(path) as store:
        engine = Engine(CommandHandler(store), Parked())
        await engine.start("parked", b"", run_id="r")
    assert not Path(f"{path}-wal").exists()  # closing checkpointed it
    with read_only(path.parent):
        async with await SQLiteStore.open(path, read_only=True) as store:
            assert [s.run_id for s in (await store.list_runs()).items] == ["r"]
