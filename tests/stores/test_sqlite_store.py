"""`SQLiteStore` specifics (docs/reference/stores.md): what the conformance kit misses.

Opening (schema, migrations, PRAGMAs, clear refusals), group commit, locking, corruption, SQL
parameters, durability across close and reopen, and several processes sharing one file: racing
appenders (`tests/support/sqlite_worker.py race`) and an appender killed with SIGKILL over and over
(`tests/support/sqlite_worker.py crash`). The generic contract runs against SQLite (a file and
`:memory:`) through the conformance kit (`tests/stores/test_conformance.py`).

A few checks look at the store's own connection (`SQLiteStore._run`), because PRAGMAs such as
`synchronous` and `busy_timeout` are per connection and invisible from any other.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from runfold import CommandHandler, open_store
from runfold.commands import (
    CompleteRun,
    CreateHook,
    CreateRun,
    CreateStep,
    RecordLog,
    SetAttributes,
    StartRun,
)
from runfold.errors import (
    CorruptEvent,
    SequenceConflict,
    StoreClosed,
    StoreError,
    StoreOpenError,
    StoreUnavailable,
    TokenConflict,
)
from runfold.events import (
    Envelope,
    Event,
    HookCreated,
    LogRecorded,
    RunCompleted,
    RunCreated,
    RunStarted,
    WaitCreated,
)
from runfold.kernel import HookClaim, HookHolder, RunIndex, Wakeup, apply, project_run, run_index
from runfold.stores import SQLiteStore
from runfold.stores.paging import encode_cursor
from runfold.stores.protocol import FeedSubscriber, SchemaMigrator
from runfold.stores.sqlite import SCHEMA_VERSION, reads
from runfold.stores.sqlite.leases import orphaned_runs_query
from runfold.stores.sqlite.retention import ENDED_RUNS, chosen_ended_runs
from runfold.stores.sqlite.schema import MIGRATIONS
from runfold.stores.time_keys import time_key
from tests.conftest import T0, Clock
from tests.support.sqlite_worker import (
    CRASH_RUNS,
    batch_time,
    batches_in,
    crash_batch,
    race_events,
)

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: children run `python -m tests.support.sqlite_worker` from here."""

FAR_FUTURE = T0 + timedelta(days=3650)

# --- helpers ------------------------------------------------------------------------------------


def envelopes_for(run_id: str, head: int, events: Sequence[Event], at: datetime) -> list[Envelope]:
    return [
        Envelope(run_id=run_id, sequence=head + offset, event=event, recorded_at=at)
        for offset, event in enumerate(events, start=1)
    ]


def index_after(history: Sequence[Envelope], new: Sequence[Envelope]) -> RunIndex:
    """The index rows the kernel derives for `history + new`."""
    return run_index(apply(project_run(history), new) if history else project_run(new))


async def write(
    store: SQLiteStore, run_id: str, *events: Event, at: datetime = T0
) -> list[Envelope]:
    """Append `events` at the run's head with the kernel's index rows."""
    history = await store.read(run_id)
    head = history[-1].sequence if history else 0
    index = index_after(history, envelopes_for(run_id, head, events, at))
    return await store.append_if_sequence(run_id, head, events, index=index, recorded_at=at)


def started(workflow_name: str = "wf") -> tuple[Event, ...]:
    return (RunCreated(workflow_name=workflow_name, input=b""), RunStarted())


def log(message: str) -> LogRecorded:
    return LogRecorded(level="info", message=message)


def positions(envelopes: Sequence[Envelope]) -> list[int]:
    """The feed positions of `envelopes` (every stored envelope has one)."""
    found = [e.position for e in envelopes if e.position is not None]
    assert len(found) == len(envelopes)
    return found


def strictly_increasing(values: Sequence[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


async def refused(
    path: Path, error: type[StoreError] = StoreOpenError, **options: Any
) -> StoreError:
    """The error opening `path` raises; fails (closing the store first) if it opens."""
    try:
        store = await SQLiteStore.open(path, **options)
    except error as exc:
        return exc
    await store.close()
    pytest.fail(f"{path} opened, but {error.__name__} was expected")


async def pragma(store: SQLiteStore, name: str) -> Any:
    """`PRAGMA name` on the store's own connection (per-connection settings live there)."""

    def query(conn: sqlite3.Connection) -> Any:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]

    return await store._run(query)


def plain_query(path: Path, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """Rows of `sql` on a fresh, plain `sqlite3` connection to `path`."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def plain_execute(path: Path, sql: str, params: Sequence[Any] = ()) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def tampered(path: Path, sql: str, params: Sequence[Any] = ()) -> None:
    """`plain_execute` past the type triggers (dropped for it, then made again): what a tool
    writing to the file behind runfold's back, or a file from before them, can hold."""
    conn = sqlite3.connect(path)
    try:
        triggers = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
        kept = triggers.fetchall()
        for name, _ in kept:
            conn.execute(f'DROP TRIGGER "{name}"')
        conn.execute(sql, params)
        for _, made in kept:
            conn.execute(made)
        conn.commit()
    finally:
        conn.close()


def as_older_file(path: Path, version: int) -> None:
    """Make the runfold file at `path` the file a runfold of schema `version` wrote."""
    conn = sqlite3.connect(path)
    try:
        if version < 6:  # no record of the file's stalls
            conn.execute("DROP TABLE stalls")
        if version < 5:  # no queues, no holds (the triggers of version 4 come back below)
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
                conn.execute(f'DROP TRIGGER "{name}"')
            for index in ("runs_queued", "runs_queue_live"):
                conn.execute(f"DROP INDEX {index}")
            for column in ("queue_name", "priority", "dedup_id"):
                conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
            for table in ("due_holds", "queue_starts", "queue_dedups"):
                conn.execute(f"DROP TABLE {table}")
        if version == 4:  # the type triggers of versions 3 and 4
            conn.executescript(MIGRATIONS[2])
            conn.executescript(MIGRATIONS[3][MIGRATIONS[3].index("DROP TRIGGER") :])
        if version < 4:  # no run owners, no leases (the triggers of version 3 come back below)
            conn.execute("DROP INDEX runs_owner")
            conn.execute("ALTER TABLE runs DROP COLUMN owner_id")
            conn.execute("DROP TABLE leases")
        if version == 3:  # its type triggers
            conn.executescript(MIGRATIONS[2])
        if version < 2:  # no feed high-water mark yet
            conn.execute("DROP TABLE feed_high_water")
        conn.execute("DELETE FROM runfold_schema WHERE version > ?", (version,))
        conn.commit()
    finally:
        conn.close()


def tables(path: Path) -> set[str]:
    return {
        row[0] for row in plain_query(path, "SELECT name FROM sqlite_master WHERE type='table'")
    }


async def everything(store: SQLiteStore, run_ids: Sequence[str]) -> tuple[Any, ...]:
    """All the store answers about `run_ids` (and the whole feed)."""
    return (
        [await store.read(run_id) for run_id in run_ids],
        await store.get_runs(run_ids),
        (await store.list_runs(limit=1000)).items,
        (await store.list_hooks(now=T0, limit=1000)).items,
        await store.due_wakeups(FAR_FUTURE, limit=10_000),
        await store.read_all(limit=100_000),
    )


# --- opening: schema, migrations, PRAGMAs -------------------------------------------------------


async def test_open_creates_the_schema_once_and_reopen_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", *started())
    assert {"runfold_schema", "events", "runs", "hooks", "wakeups"} <= tables(path)
    versions = [(n,) for n in range(1, SCHEMA_VERSION + 1)]
    assert plain_query(path, "SELECT version FROM runfold_schema ORDER BY version") == versions
    async with await SQLiteStore.open(path) as store:  # a current file is not migrated again
        assert await store.head("r") == 2
    assert plain_query(path, "SELECT version FROM runfold_schema ORDER BY version") == versions


async def test_an_older_file_is_migrated_forward_at_open(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", *started())
    as_older_file(path, 1)

    async with await SQLiteStore.open(path) as store:
        assert await store.head("r") == 2
        await write(store, "s", *started())
        positions = [e.position for e in await store.read_all()]
    assert positions == [1, 2, 3, 4]
    assert plain_query(path, "SELECT position FROM feed_high_water") == [(2,)]
    assert plain_query(path, "SELECT max(version) FROM runfold_schema") == [(SCHEMA_VERSION,)]


async def test_migrate_brings_a_file_put_back_to_an_older_version_forward(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        assert isinstance(store, SchemaMigrator) and not isinstance(store, FeedSubscriber)
        assert (store.schema_version, store.migrated_from) == (SCHEMA_VERSION, 0)
        await write(store, "r", *started())
        await store.migrate()  # current: nothing to do
        assert store.migrated_from == 0
        as_older_file(path, 1)  # as a version-1 runfold left it, while the store is open
        await store.migrate()
        assert store.migrated_from == 1
        await write(store, "s", *started())
    assert plain_query(path, "SELECT position FROM feed_high_water") == [(2,)]
    assert plain_query(path, "SELECT max(version) FROM runfold_schema") == [(SCHEMA_VERSION,)]


async def test_a_store_opened_read_only_refuses_to_migrate(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path):
        pass
    async with await SQLiteStore.open(path, read_only=True) as store:
        assert store.migrated_from is None
        with pytest.raises(StoreOpenError, match="read-only"):
            await store.migrate()
    with pytest.raises(StoreClosed):
        await store.migrate()


async def test_open_store_url_opens_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "via-url.db"
    async with await open_store(f"sqlite:///{path}") as store:
        assert isinstance(store, SQLiteStore)
        await CommandHandler(store, clock=Clock()).execute(
            "r", StartRun(create=CreateRun(workflow_name="wf", input=b""))
        )
    assert path.exists()
    async with await SQLiteStore.open(path) as reopened:
        assert await reopened.head("r") == 2


async def test_memory_stores_work_and_are_separate() -> None:
    async with (
        await SQLiteStore.open(":memory:") as first,
        await SQLiteStore.open(":memory:") as second,
    ):
        await write(first, "r", *started())
        assert (await first.head("r"), await second.head("r")) == (2, 0)
        assert [e.sequence for e in await first.read_all()] == [1, 2]


async def test_pragmas_default_to_wal_and_synchronous_full(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        assert await pragma(store, "journal_mode") == "wal"
        assert await pragma(store, "synchronous") == 2  # FULL
        assert await pragma(store, "foreign_keys") == 1
        assert await pragma(store, "busy_timeout") == 5000
    # WAL is a property of the file: any other connection sees it.
    assert plain_query(path, "PRAGMA journal_mode") == [("wal",)]


async def test_synchronous_normal_and_busy_timeout_are_options(tmp_path: Path) -> None:
    async with await SQLiteStore.open(
        tmp_path / "runfold.db", synchronous="NORMAL", busy_timeout=0.25
    ) as store:
        assert await pragma(store, "synchronous") == 1  # NORMAL
        assert await pragma(store, "busy_timeout") == 250
        assert await pragma(store, "journal_mode") == "wal"


async def test_an_unknown_synchronous_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        await SQLiteStore.open(tmp_path / "runfold.db", synchronous="OFF")  # type: ignore[arg-type]
    assert not (tmp_path / "runfold.db").exists()


async def test_an_empty_file_becomes_a_store(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", *started())
        assert await store.head("r") == 2


# --- opening: clear refusals --------------------------------------------------------------------


def _text_file(path: Path) -> Path:
    path.write_text("this is a text file, not a database\n" * 200)
    return path


def _short_text_file(path: Path) -> Path:
    path.write_text("hello\n")
    return path


def _other_sqlite_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    return path


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def _in_missing_directory(path: Path) -> Path:
    return path / "no" / "such" / "dir" / "runfold.db"


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        pytest.param(_text_file, "not a SQLite database", id="text-file"),
        pytest.param(_short_text_file, "not a SQLite database", id="short-text-file"),
        pytest.param(_other_sqlite_db, "not a runfold database", id="other-sqlite-db"),
        pytest.param(_directory, "unable to open", id="directory"),
        pytest.param(_in_missing_directory, "unable to open", id="missing-directory"),
    ],
)
async def test_what_is_not_a_usable_runfold_file_is_refused_at_open(
    tmp_path: Path, make: Callable[[Path], Path], fragment: str
) -> None:
    path = make(tmp_path / "target")
    before = path.read_bytes() if path.is_file() else None
    assert fragment in str(await refused(path))
    if before is not None:  # refused without touching the file
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]
    if make is _in_missing_directory:
        assert not (tmp_path / "no").exists()


async def test_a_database_from_a_newer_runfold_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", *started())
    plain_execute(path, "INSERT INTO runfold_schema (version) VALUES (99)")
    message = str(await refused(path))
    assert "newer runfold" in message and "99" in message
    # Nothing was migrated or dropped: the file is as the newer runfold left it.
    assert plain_query(path, "SELECT max(version) FROM runfold_schema") == [(99,)]
    assert plain_query(path, "SELECT count(*) FROM events") == [(2,)]


@contextmanager
def read_only(*paths: Path) -> Iterator[None]:
    """Make `paths` unwritable for this process, or skip the test where that is impossible.

    chmod does not stop root, so as root the files are made immutable (`chattr +i`, which needs
    CAP_LINUX_IMMUTABLE and a file system that supports it)."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in paths}
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("running as root without chattr: a file cannot be made read-only here")
    made: list[Path] = []
    try:
        for p in paths:
            done = subprocess.run([chattr, "+i", str(p)], capture_output=True, check=False)
            if done.returncode != 0:
                pytest.skip(f"running as root and chattr +i failed: {done.stderr.decode()}")
            made.append(p)
        yield
    finally:
        for p in made:
            subprocess.run([chattr, "-i", str(p)], check=True)


@pytest.mark.parametrize("which", ["file", "directory", "both"])
async def test_a_read_only_store_is_refused_at_open(tmp_path: Path, which: str) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", *started())
    targets = {"file": [path], "directory": [folder], "both": [path, folder]}[which]
    with read_only(*targets):
        message = str(await refused(path))
        assert str(path) in message and "not a SQLite database" not in message
        if which != "file":  # nor can a new store be made in a read-only folder
            await refused(folder / "new.db")
    async with await SQLiteStore.open(path) as store:  # writable again: nothing was lost
        assert await store.head("r") == 2


async def test_opening_while_another_process_writes_past_the_timeout_is_unavailable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", *started())
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        started_at = time.monotonic()
        await refused(path, StoreUnavailable, busy_timeout=0.2)
        assert time.monotonic() - started_at >= 0.15  # it waited for the lock first
        locker.execute("ROLLBACK")
    finally:
        locker.close()
    async with await SQLiteStore.open(path) as store:
        assert await store.head("r") == 2


# --- appends: group commit, locking, parameters -------------------------------------------------


class Unregistered(Event):
    """An event class the codec does not know: encoding it fails before any SQL runs."""

    event_type = "unregistered"


async def test_concurrent_appends_share_one_transaction_and_keep_their_own_outcomes(
    tmp_path: Path,
) -> None:
    async with await SQLiteStore.open(tmp_path / "runfold.db") as store:
        for n in range(5):
            await write(store, f"busy-{n}", *started())
        base = await store.read_all()
        statements: list[str] = []

        def trace(conn: sqlite3.Connection) -> None:
            conn.set_trace_callback(statements.append)

        await store._run(trace)

        # Every request is prepared first (each racer on a busy run saw head 2), then all are
        # made at once, with no await in between: they queue while the first one is written.
        requests: list[tuple[str, int, tuple[Event, ...], RunIndex]] = []
        for n in range(5):
            history = await store.read(f"busy-{n}")
            for racer in range(4):
                events: tuple[Event, ...] = (log(f"{n}:{racer}:0"), log(f"{n}:{racer}:1"))
                index = index_after(history, envelopes_for(f"busy-{n}", 2, events, T0))
                requests.append((f"busy-{n}", 2, events, index))
        for run_id in ("claim-1", "claim-2"):  # both want the same hook token
            events = (*started(), HookCreated(hook_id="h", token="shared-token"))
            requests.append(
                (run_id, 0, events, index_after([], envelopes_for(run_id, 0, events, T0)))
            )
        for n in range(10):
            events = started()
            index = index_after([], envelopes_for(f"fresh-{n}", 0, events, T0))
            requests.append((f"fresh-{n}", 0, events, index))
        bad_index = index_after([], envelopes_for("bad", 0, started(), T0))
        requests.append(("bad", 0, (Unregistered(),), bad_index))  # fails to encode
        statements.clear()
        outcomes = await asyncio.gather(
            *(
                store.append_if_sequence(run_id, head, events, index=index, recorded_at=T0)
                for run_id, head, events, index in requests
            ),
            return_exceptions=True,
        )

        begins = [s for s in statements if s.strip().upper().startswith("BEGIN")]
        assert len(begins) == 1, statements  # 32 appends to write, one transaction
        for n in range(5):
            mine = outcomes[n * 4 : n * 4 + 4]
            winners = [o for o in mine if isinstance(o, list)]
            losers = [o for o in mine if isinstance(o, SequenceConflict)]
            assert len(winners) == 1 and len(losers) == 3, mine
            assert [e.sequence for e in winners[0]] == [3, 4]
            for loser in losers:  # each conflict names the true head: after the winner
                assert (loser.run_id, loser.expected, loser.actual) == (f"busy-{n}", 2, 4)
            assert await store.read(f"busy-{n}", after=2) == winners[0]
        first, second = outcomes[20:22]
        assert isinstance(first, list) and isinstance(second, TokenConflict)
        assert (second.holder_run_id, second.holder_hook_id) == ("claim-1", "h")
        assert await store.head("claim-2") == 0 and await store.get_runs(["claim-2"]) == [None]
        assert all(isinstance(o, list) and len(o) == 2 for o in outcomes[22:32])
        assert isinstance(outcomes[32], TypeError) and await store.head("bad") == 0
        # The feed: one position per written event, no gaps, in the order of the queue.
        feed = await store.read_all()
        assert positions(feed) == list(range(1, len(feed) + 1))
        written = [e for o in outcomes if isinstance(o, list) for e in o]
        assert feed[len(base) :] == written


async def test_a_lone_append_commits_on_the_calling_thread_unless_the_lock_is_taken(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path, busy_timeout=5) as store:
        await write(store, "r", *started())
        on_driver: list[str] = []

        def trace(conn: sqlite3.Connection) -> None:
            conn.set_trace_callback(on_driver.append)

        await store._run(trace)
        await write(store, "r", log("inline"))
        # Committed without the driver's connection, and durable for any other reader.
        assert not [s for s in on_driver if s.upper().startswith("BEGIN")], on_driver
        assert plain_query(path, "SELECT count(*) FROM events WHERE run_id = 'r'") == [(3,)]

        # Another writer holds the file's lock: the append must not wait for it on the event
        # loop's thread, but on the driver's, and go in once the lock is free.
        history = await store.read("r")
        index = index_after(history, envelopes_for("r", 3, [log("queued")], T0))
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        append = asyncio.ensure_future(
            store.append_if_sequence("r", 3, [log("queued")], index=index, recorded_at=T0)
        )
        ticks = 0
        while ticks < 20:  # the loop keeps running while the append waits
            await asyncio.sleep(0.005)
            ticks += 1
        assert not append.done()
        locker.execute("ROLLBACK")
        locker.close()
        assert [e.sequence for e in await append] == [4]
        assert [s for s in on_driver if s.upper().startswith("BEGIN")], on_driver


@pytest.mark.parametrize("commit_inline", [True, False])
async def test_appends_of_any_size_store_every_event_in_its_place(
    tmp_path: Path, commit_inline: bool
) -> None:
    # Up to 16 events go in one multi-row INSERT (its rows bound by number), more through
    # `executemany`: every size on either side keeps each event's row, sequence and position.
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path, commit_inline=commit_inline) as store:
        await write(store, "r", *started())
        expected = [(1, "run_created", None), (2, "run_started", None)]
        for size in (1, 2, 3, 15, 16, 17, 40):
            head = len(expected)
            written = await write(store, "r", *(log(f"{size}-{n}") for n in range(size)))
            assert [e.sequence for e in written] == list(range(head + 1, head + size + 1))
            expected += [(head + n, "log_recorded", None) for n in range(1, size + 1)]
        read = await store.read("r")
        assert [e.event for e in read][2:] == [
            log(f"{size}-{n}") for size in (1, 2, 3, 15, 16, 17, 40) for n in range(size)
        ]
        assert positions(read) == list(range(1, len(expected) + 1))
        rows = plain_query(
            path,
            "SELECT sequence, type, correlation_id, recorded_at, position FROM events "
            "WHERE run_id = 'r' ORDER BY sequence",
        )
        assert [row[:3] for row in rows] == expected
        assert {row[3] for row in rows} == {time_key(T0)}
        assert [row[4] for row in rows] == [row[0] for row in rows]


async def test_a_caller_cancelled_while_its_append_waits_leaves_the_append_in(
    tmp_path: Path,
) -> None:
    async with await SQLiteStore.open(tmp_path / "runfold.db") as store:
        appends = []
        for n in range(3):
            events = started()
            index = index_after([], envelopes_for(f"r{n}", 0, events, T0))
            appends.append(
                asyncio.ensure_future(
                    store.append_if_sequence(f"r{n}", 0, events, index=index, recorded_at=T0)
                )
            )
        await asyncio.sleep(0)  # all three queued: the first writes them together
        appends[1].cancel()
        outcomes = await asyncio.gather(*appends, return_exceptions=True)
        assert isinstance(outcomes[1], asyncio.CancelledError)
        assert all(isinstance(outcomes[n], list) for n in (0, 2)), outcomes
        # The cancelled caller left; its append did not: the batch went in whole.
        assert [await store.head(f"r{n}") for n in range(3)] == [2, 2, 2]
        assert await write(store, "after", *started())  # and the store writes on


async def test_commit_inline_off_hands_every_append_to_the_driver(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "runfold.db", commit_inline=False) as store:
        on_driver: list[str] = []

        def trace(conn: sqlite3.Connection) -> None:
            conn.set_trace_callback(on_driver.append)

        await store._run(trace)
        await write(store, "r", *started())
        assert [s for s in on_driver if s.upper().startswith("BEGIN")], on_driver


async def test_a_write_lock_held_past_the_timeout_is_unavailable_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path, busy_timeout=0.2) as store:
        await write(store, "r", *started())
        before = await everything(store, ["r", "s"])
        locker = sqlite3.connect(path, isolation_level=None)
        try:
            locker.execute("BEGIN IMMEDIATE")
            history = await store.read("r")  # WAL: readers are not blocked by the writer
            index = index_after(history, envelopes_for("r", 2, [log("x")], T0))
            fresh = index_after([], envelopes_for("s", 0, started(), T0))
            outcomes = await asyncio.gather(
                store.append_if_sequence("r", 2, [log("x")], index=index, recorded_at=T0),
                store.append_if_sequence("s", 0, started(), index=fresh, recorded_at=T0),
                return_exceptions=True,
            )
            assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
            with pytest.raises(StoreUnavailable):
                await store.delete_runs(terminal_before=FAR_FUTURE, limit=10)
            assert await everything(store, ["r", "s"]) == before
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        # Transient: the same appends succeed once the lock is gone.
        await store.append_if_sequence("r", 2, [log("x")], index=index, recorded_at=T0)
        await store.append_if_sequence("s", 0, started(), index=fresh, recorded_at=T0)
        assert (await store.head("r"), await store.head("s")) == (3, 2)


async def test_sql_text_is_always_a_parameter(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    evil_run = "r'); DROP TABLE events; --"
    evil_workflow = "wf' OR '1'='1"
    evil_key = "x'); DROP TABLE events; --"
    evil_value = "'); DELETE FROM runs; --"
    other_key = '"; DROP TABLE runs; --'
    evil_token = "tok' OR '1'='1"
    evil_step = "s'); DROP TABLE hooks; --"
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store, clock=Clock())
        create = CreateRun(workflow_name=evil_workflow, input=b"", attributes={evil_key: "a"})
        await handler.execute(evil_run, StartRun(create=create))
        await handler.execute(evil_run, SetAttributes(changes={evil_key: evil_value}))
        await handler.execute(evil_run, SetAttributes(changes={other_key: evil_key}))
        await handler.execute(evil_run, CreateHook(hook_id=evil_step, token=evil_token))
        await handler.execute(evil_run, CreateStep(step_id=evil_step, step_name="n", input=b""))
        await handler.execute("plain", StartRun(create=CreateRun(workflow_name="wf", input=b"")))

        expected = {evil_key: evil_value, other_key: evil_key}
        [summary, missing] = await store.get_runs([evil_run, "x' OR '1'='1"])
        assert missing is None
        assert summary is not None and dict(summary.attributes) == expected
        page = await store.list_runs(workflow_name=evil_workflow)
        assert [(s.run_id, dict(s.attributes)) for s in page.items] == [(evil_run, expected)]
        assert (await store.list_runs(workflow_name="' OR 1=1 --")).items == ()
        holder = await store.find_hook(evil_token, now=T0)
        assert holder == HookHolder(run_id=evil_run, hook_id=evil_step, retained_until=None)
        assert await store.find_hook("' OR '1'='1", now=T0) is None
        hooks = await store.list_hooks(run_id=evil_run, now=T0)
        assert [h.hook_id for h in hooks.items] == [evil_step]
        by_step = await store.read_by_correlation(evil_run, evil_step)
        assert len(by_step) == 2  # the hook and the step share the id
        # A forged cursor is data too.
        forged = encode_cursor(time_key(T0), "q' OR '1'='1")
        assert [s.run_id for s in (await store.list_runs(cursor=forged)).items] == ["plain"]
    assert {"events", "runs", "hooks", "wakeups", "runfold_schema"} <= tables(path)
    assert plain_query(path, "SELECT count(*) FROM events") == [(8,)]
    stored = plain_query(path, "SELECT attributes FROM runs WHERE run_id = ?", (evil_run,))
    assert json.loads(stored[0][0]) == expected


# --- retention and the planner's statistics ----------------------------------------------------


async def ended_runs(path: Path, count: int) -> None:
    """A store at `path` holding `count` runs, every other one completed."""
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store, clock=Clock())
        for n in range(count):
            create = CreateRun(workflow_name="wf", input=b"")
            await handler.execute(f"r{n}", StartRun(create=create))
            if n % 2:
                await handler.execute(f"r{n}", CompleteRun(output=b""))


def plan(path: Path, sql: str, params: Sequence[Any]) -> list[str]:
    return [row[3] for row in plain_query(path, f"EXPLAIN QUERY PLAN {sql}", params)]


@pytest.mark.parametrize("statistics", ["none", "misleading", "true"])
async def test_retention_walks_the_index_of_ended_runs_whatever_the_statistics(
    tmp_path: Path, statistics: str
) -> None:
    path = tmp_path / "runfold.db"
    await ended_runs(path, 6)
    plain_execute(path, "ANALYZE")
    if statistics == "none":
        plain_execute(path, "DELETE FROM sqlite_stat1")
    elif statistics == "misleading":  # every end time shared by all runs, each status by one
        plain_execute(path, "DELETE FROM sqlite_stat1")
        plain_execute(
            path, "INSERT INTO sqlite_stat1 VALUES ('runs', 'runs_ended', '100000 100000')"
        )
        plain_execute(
            path, "INSERT INTO sqlite_stat1 VALUES ('runs', 'runs_status', '100000 1 1 1')"
        )
    plain_execute(path, "ANALYZE sqlite_schema")  # load them
    cutoff = time_key(FAR_FUTURE)
    walked = plan(path, ENDED_RUNS, (cutoff, 500))
    assert "USING INDEX runs_ended" in walked[0] and not any("TEMP B-TREE" in s for s in walked)
    chosen = plan(path, chosen_ended_runs(2), (cutoff, "r1", "r3"))
    assert "USING PRIMARY KEY (run_id=?)" in chosen[0], chosen
    async with await SQLiteStore.open(path) as store:
        assert await store.delete_runs(terminal_before=FAR_FUTURE, limit=2) == 2
        assert await store.delete_runs(terminal_before=FAR_FUTURE, limit=5, run_ids=["r5"] * 2) == 1
        assert [s.run_id for s in (await store.list_runs(limit=10)).items] == ["r4", "r2", "r0"]


@pytest.mark.parametrize("served", [None, 2])
async def test_orphaned_runs_walk_the_index_of_owned_runs(
    tmp_path: Path, served: int | None
) -> None:
    path = tmp_path / "runfold.db"
    await ended_runs(path, 6)  # runs nobody owns: the walk never meets them
    plain_execute(path, "ANALYZE")
    walked = plan(path, orphaned_runs_query(served), (0, 10, *(["wf"] * (served or 0))))
    assert "USING INDEX runs_owner" in walked[0], walked


async def test_served_workflow_names_are_matched_whatever_they_hold(tmp_path: Path) -> None:
    # Bound one by one: a JSON array read with json_each would lose what follows a NUL.
    names = ["wf\x00a", "wf\x00b", "wf"]
    async with await SQLiteStore.open(tmp_path / "runfold.db") as store:
        for name in names:
            await write(
                store, f"run-{name}", *started(name), WaitCreated(wait_id="w", resume_at=T0)
            )
        for name in names:
            due = await store.due_wakeups(FAR_FUTURE, workflow_names=[name])
            assert [w.run_id for w in due] == [f"run-{name}"]
        assert len(await store.due_wakeups(FAR_FUTURE, workflow_names=names)) == 3
        assert await store.due_wakeups(FAR_FUTURE, workflow_names=[]) == []
        first = await store.next_wakeup(workflow_names=["wf\x00a"])
        assert first is not None and first.run_id == "run-wf\x00a"


async def test_retention_deletes_every_row_of_its_runs_whatever_their_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "CHUNK", 2)  # several statements per table for one batch
    path = tmp_path / "runfold.db"
    ended = ["nul\x00id", "quote'\"", "\u00e9\U0001f642", "plain", "p"]
    async with await SQLiteStore.open(path) as store:
        # Through the store: the kernel refuses a control character in a command's run id.
        for run_id in ended:
            await write(store, run_id, *started(), RunCompleted(output=b""))
        await write(store, "live", *started())
        summaries = await store.get_runs([*ended, "unknown"])
        assert [s.run_id if s else None for s in summaries] == [*ended, None]
        assert (
            await store.delete_runs(
                terminal_before=FAR_FUTURE, limit=1, run_ids=["nul\x00id", "nul"]
            )
            == 1
        )
        assert await store.get_runs(["nul\x00id"]) == [None]
        assert await store.delete_runs(terminal_before=FAR_FUTURE, limit=10) == len(ended) - 1
        for run_id in ended:
            assert await store.head(run_id) == 0
        assert await store.head("live") > 0
    for table in ("events", "runs", "hooks", "wakeups"):
        assert set(plain_query(path, f"SELECT run_id FROM {table}")) <= {("live",)}, table


async def test_closing_leaves_the_planner_statistics_fresh(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    await ended_runs(path, 4)
    async with await SQLiteStore.open(path) as store:  # queries on the runs indexes
        assert len((await store.list_runs(status="completed")).items) == 2
        assert await store.delete_runs(terminal_before=FAR_FUTURE, limit=1) == 1
    assert ("runs",) in plain_query(path, "SELECT DISTINCT tbl FROM sqlite_stat1")


# --- durability across close and reopen ---------------------------------------------------------


async def test_reopen_after_close_holds_exactly_what_was_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "runfold.db"
    store = await SQLiteStore.open(path)
    handler = CommandHandler(store, clock=Clock())
    await handler.execute("base", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
    await handler.execute("base", CreateHook(hook_id="h", token="tok"))
    await handler.execute("base", RecordLog(level="info", message="hello"))

    async def append(run_id: str) -> list[Envelope]:
        events = (*started(), log(run_id))
        index = index_after([], envelopes_for(run_id, 0, events, T0))
        return await store.append_if_sequence(run_id, 0, events, index=index, recorded_at=T0)

    first = asyncio.create_task(append("w-0"))
    await first  # at least one append is acknowledged for sure
    tasks = [asyncio.create_task(append(f"w-{n}")) for n in range(1, 30)]
    await asyncio.sleep(0)  # they queue, and the writer task is scheduled
    await asyncio.sleep(0)  # the writer starts their transaction: close must let it finish
    closing = asyncio.create_task(store.close())
    tasks += [asyncio.create_task(append(f"w-{n}")) for n in range(30, 40)]
    outcomes = [first.result(), *await asyncio.gather(*tasks, return_exceptions=True)]
    await closing
    acked = {f"w-{n}": o for n, o in enumerate(outcomes) if isinstance(o, list)}
    refused = [o for o in outcomes if not isinstance(o, list)]
    assert all(isinstance(o, StoreClosed) for o in refused), refused
    assert len(refused) >= 10  # those asked after close began
    with pytest.raises(StoreClosed):
        await store.head("base")
    await store.close()  # closing twice is harmless

    async with await SQLiteStore.open(path) as reopened:
        base = await reopened.read("base")
        assert [type(e.event).__name__ for e in base] == [
            "RunCreated",
            "RunStarted",
            "HookCreated",
            "LogRecorded",
        ]
        for n in range(40):
            run_id = f"w-{n}"
            assert await reopened.read(run_id) == acked.get(run_id, [])
        summaries = await reopened.get_runs([f"w-{n}" for n in range(40)])
        assert [s is not None for s in summaries] == [f"w-{n}" in acked for n in range(40)]
        assert await reopened.find_hook("tok", now=T0) == HookHolder(
            run_id="base", hook_id="h", retained_until=None
        )
        feed = await reopened.read_all(limit=10_000)
        assert len(feed) == len(base) + 3 * len(acked)
        assert strictly_increasing(positions(feed))


# --- corruption ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value"),
    [
        pytest.param("payload", b"\xff\x00", id="payload-not-cbor"),
        pytest.param("payload", b"\xa0", id="payload-missing-fields"),
        pytest.param("payload", b"\x01", id="payload-not-a-map"),
        pytest.param("type", "no_such_event", id="unknown-type"),
        pytest.param("schema_version", 99, id="newer-schema-version"),
        pytest.param("schema_version", "one", id="schema-version-not-a-number"),
        pytest.param("payload", "text, not bytes", id="payload-text"),
        pytest.param("recorded_at", "yesterday", id="recorded-at-not-a-number"),
        pytest.param("recorded_at", 1767225600000000.5, id="recorded-at-real"),
    ],
)
async def test_a_corrupt_row_fails_its_run_only(tmp_path: Path, column: str, value: Any) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store, clock=Clock())
        for run_id in ("a", "b"):
            await handler.execute(run_id, StartRun(create=CreateRun(workflow_name="wf", input=b"")))
            await handler.execute(run_id, CreateStep(step_id="s", step_name="n", input=b""))
            await handler.execute(run_id, RecordLog(level="info", message="two"))
    [(position,)] = plain_query(
        path, "SELECT position FROM events WHERE run_id = 'a' AND sequence = 3"
    )
    tampered(
        path, f"UPDATE events SET {column} = ? WHERE run_id = ? AND sequence = ?", (value, "a", 3)
    )

    async with await SQLiteStore.open(path) as store:
        with pytest.raises(CorruptEvent) as caught:
            await store.read("a")
        assert (caught.value.run_id, caught.value.sequence) == ("a", 3)
        assert isinstance(caught.value, StoreError)
        with pytest.raises(CorruptEvent):
            await store.read_by_correlation("a", "s")
        with pytest.raises(CorruptEvent):
            await store.read_all()
        handler = CommandHandler(store, clock=Clock())
        with pytest.raises(CorruptEvent):
            await handler.execute("a", RecordLog(level="info", message="three"))
        # The rest of run a, its index rows, and every other run keep working.
        assert [e.sequence for e in await store.read("a", after=3)] == [4]
        assert [e.sequence for e in await store.read("a", limit=2)] == [1, 2]
        assert await store.head("a") == 4
        assert [e.sequence for e in await store.read("b")] == [1, 2, 3, 4]
        assert [e.sequence for e in await store.read_by_correlation("b", "s")] == [3]
        outcome = await handler.execute("b", RecordLog(level="info", message="three"))
        assert [e.sequence for e in outcome.appended] == [5]
        summaries = await store.get_runs(["a", "b"])
        assert [s.last_sequence if s else None for s in summaries] == [4, 5]
        assert len((await store.list_runs()).items) == 2
        after = await store.read_all(after_position=position)
        assert ("a", 3) not in {(e.run_id, e.sequence) for e in after}
        assert ("b", 5) in {(e.run_id, e.sequence) for e in after}


# --- several processes on one file --------------------------------------------------------------


def _spawn(mode: str, args: dict[str, Any], stderr: Path) -> subprocess.Popen[bytes]:
    with stderr.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.support.sqlite_worker", mode, json.dumps(args)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a child's log (a line cut short by SIGKILL is not one)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")[:-1]]


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


WORKERS = 8
APPENDS = 50
SHARED = ["shared-0", "shared-1"]


async def test_a_new_file_opens_once_another_connection_lets_go_of_its_write_lock(
    tmp_path: Path,
) -> None:
    """SQLite refuses the switch to WAL at once, without its busy handler, while another
    connection holds the file's reserved lock (processes opening a new file together meet
    this): the store waits for the lock up to its busy timeout, then says it is busy."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="busy"):
            await SQLiteStore.open(str(path), busy_timeout=0.2)
        asyncio.get_running_loop().call_later(0.2, holder.execute, "COMMIT")
        async with await SQLiteStore.open(str(path), busy_timeout=30) as store:
            await write(store, "r", *started())
            assert await store.head("r") == 2
    finally:
        holder.close()


@pytest.mark.slow
async def test_processes_racing_on_shared_and_distinct_runs_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    # The file does not exist yet: the children also race to create it.
    path, go = tmp_path / "race.db", tmp_path / "go"
    children = []
    for worker in range(WORKERS):
        args = {
            "db": str(path),
            "worker": worker,
            "appends": APPENDS,
            "shared": SHARED,
            "go": str(go),
            "out": str(tmp_path / f"w{worker}.jsonl"),
        }
        children.append(_spawn("race", args, tmp_path / f"w{worker}.err"))
    try:
        _wait_until(
            lambda: all((tmp_path / f"w{w}.jsonl.ready").exists() for w in range(WORKERS)),
            60,
            "every child to start",
        )
        go.touch()
        for worker, child in enumerate(children):
            code = child.wait(timeout=120)
            err = (tmp_path / f"w{worker}.err").read_text()
            assert code == 0, f"worker {worker} exited {code}:\n{err}"
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()

    # What each child was told, by run.
    acks: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    conflicts: list[dict[str, Any]] = []
    unavailable = 0
    for worker in range(WORKERS):
        records = _json_lines(tmp_path / f"w{worker}.jsonl")
        mine = [r for r in records if r["kind"] == "ack"]
        assert [r["append"] for r in mine] == list(range(APPENDS))  # every append landed once
        for record in mine:
            acks[record["run"]].append((worker, record))
        conflicts += [r for r in records if r["kind"] == "conflict"]
        unavailable += sum(r["kind"] == "unavailable" for r in records)

    run_ids = [*SHARED, *(f"own-{w}" for w in range(WORKERS))]
    assert sorted(acks) == sorted(run_ids)
    async with await SQLiteStore.open(path) as store:
        feed = await store.read_all(limit=1_000_000)
        feed_positions = {(e.run_id, e.sequence): e.position for e in feed}
        total = 0
        for run_id in run_ids:
            history = await store.read(run_id)
            snapshot = project_run(history)  # contiguous 1..n, a valid run
            total += len(history)
            owner: dict[int, tuple[int, int]] = {}
            for worker, record in acks[run_id]:
                sequences = record["sequences"]
                assert sequences == list(range(sequences[0], sequences[-1] + 1))
                expected = race_events(
                    worker, record["append"], record["size"], create=record["created"]
                )
                assert [history[s - 1].event for s in sequences] == expected
                for sequence, position in zip(sequences, record["positions"], strict=True):
                    assert sequence not in owner, f"{run_id}@{sequence} acknowledged twice"
                    owner[sequence] = (worker, record["append"])
                    assert feed_positions[(run_id, sequence)] == position
            # No lost and no unacknowledged event: the acknowledgements tile the history.
            assert sorted(owner) == list(range(1, len(history) + 1))
            assert [r["sequences"][0] for _, r in acks[run_id] if r["created"]] == [1]
            # No reordering: each worker's appends appear in the order it made them.
            for worker in range(WORKERS):
                firsts = [r["sequences"][0] for w, r in acks[run_id] if w == worker]
                assert firsts == sorted(firsts)
            assert await store.get_runs([run_id]) == [run_index(snapshot).summary]
            boundaries = {0} | {r["sequences"][-1] for _, r in acks[run_id]}
            for conflict in (c for c in conflicts if c["run"] == run_id):
                # The conflict reported a head the run really had, ahead of the one expected.
                assert conflict["expected"] == conflict["head"]
                assert conflict["actual"] > conflict["expected"]
                assert conflict["actual"] in boundaries
        assert len(feed) == total
        assert strictly_increasing(positions(feed))
        for run_id in run_ids:
            assert strictly_increasing(positions([e for e in feed if e.run_id == run_id]))
    assert not [c for c in conflicts if c["run"].startswith("own-")]
    assert conflicts, "the shared runs were never contended: the race did not happen"
    assert unavailable == 0, f"{unavailable} appends hit StoreUnavailable despite a 30 s timeout"


KILLS = 20


def _progressed(acks: Path, seen: int, child: subprocess.Popen[bytes]) -> Callable[[], bool]:
    """Whether the child has acknowledged more than `seen` batches (or has exited)."""
    return lambda: len(_json_lines(acks)) > seen or child.poll() is not None


async def _check_crash_state(path: Path, acked: dict[str, int]) -> None:
    """After a SIGKILL: each run is a whole-batch prefix of its plan holding every acknowledged
    batch, and every index query agrees with the kernel's index of that history."""
    lengths: dict[str, int] = {}
    async with await SQLiteStore.open(path) as store:
        indexes: dict[str, RunIndex] = {}
        tokens: set[str] = set()
        for run_id in CRASH_RUNS:
            history = await store.read(run_id)
            lengths[run_id] = len(history)
            count = batches_in(run_id, len(history))  # whole batches only
            assert count > acked.get(run_id, -1), f"{run_id}: acknowledged batch lost"
            planned: list[Envelope] = []
            for batch in range(count):
                events = crash_batch(run_id, batch)
                assert events is not None
                planned += envelopes_for(run_id, len(planned), events, batch_time(batch))
            assert [(e.sequence, e.event, e.recorded_at) for e in history] == [
                (e.sequence, e.event, e.recorded_at) for e in planned
            ]
            if history:
                indexes[run_id] = run_index(project_run(history))
            tokens |= {e.event.token for e in history if isinstance(e.event, HookCreated)}

        summaries = await store.get_runs(list(CRASH_RUNS))
        assert summaries == [indexes[r].summary if r in indexes else None for r in CRASH_RUNS]
        listed = (await store.list_runs(limit=100)).items
        assert sorted(s.run_id for s in listed) == sorted(indexes)

        claims: dict[str, tuple[str, HookClaim]] = {
            c.token: (run_id, c) for run_id, index in indexes.items() for c in index.hooks
        }
        for token in tokens:
            held = claims.get(token)
            assert await store.find_hook(token, now=T0) == (
                None
                if held is None
                else HookHolder(
                    run_id=held[0], hook_id=held[1].hook_id, retained_until=held[1].retained_until
                )
            )
        hooks = await store.list_hooks(now=T0, limit=100_000)
        assert [(h.run_id, h.hook_id) for h in hooks.items] == sorted(
            (run_id, c.hook_id) for run_id, c in claims.values()
        )

        wakeups: list[Wakeup] = sorted(
            (w for index in indexes.values() for w in index.wakeups),
            key=lambda w: (w.due_at, w.run_id, w.kind, w.subject_id),
        )
        assert await store.due_wakeups(FAR_FUTURE, limit=100_000) == wakeups
        assert await store.next_wakeup() == (wakeups[0] if wakeups else None)

        feed = await store.read_all(limit=1_000_000)
        assert strictly_increasing(positions(feed))
        for run_id in CRASH_RUNS:
            assert [e.sequence for e in feed if e.run_id == run_id] == list(
                range(1, lengths[run_id] + 1)
            )
        assert len(feed) == sum(lengths.values())


@pytest.mark.slow
async def test_sigkill_mid_append_keeps_whole_acknowledged_batches_and_true_indexes(
    tmp_path: Path,
) -> None:
    path, acks = tmp_path / "crash.db", tmp_path / "acks.jsonl"
    rng = random.Random(1234)
    acked: dict[str, int] = {}
    killed = 0
    for round_ in range(KILLS):
        seen = len(_json_lines(acks))
        child = _spawn("crash", {"db": str(path), "out": str(acks)}, tmp_path / "crash.err")
        try:
            if round_ % 5 == 4:  # now and then, kill at any moment (perhaps while opening)
                time.sleep(rng.uniform(0.05, 0.35))
            else:  # mostly, kill in the middle of the stream of appends
                _wait_until(_progressed(acks, seen, child), 60, "the child to append a batch")
                time.sleep(rng.uniform(0.0, 0.03))
            child.send_signal(signal.SIGKILL)
            code = child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        text = acks.read_bytes() if acks.exists() else b""
        acks.write_bytes(text[: text.rfind(b"\n") + 1])  # drop a line the kill cut short
        err = (tmp_path / "crash.err").read_text()
        assert code in (-signal.SIGKILL, 0), f"crash child exited {code}:\n{err}"
        killed += code == -signal.SIGKILL
        for record in _json_lines(acks):
            acked[record["run"]] = max(acked.get(record["run"], -1), record["batch"])
        if not path.exists():
            continue  # killed before it created the file
        await _check_crash_state(path, acked)
    assert killed >= KILLS - 2, f"only {killed} of {KILLS} children were killed mid-stream"
    assert sum(acked.values()) > KILLS  # the runs really grew across the kills


async def test_a_version_4_file_gains_queues_at_open(tmp_path: Path) -> None:
    """A file a runfold of schema 4 (owners and leases, no queues) wrote is migrated: its runs
    are on no queue, and its queued runs are handed out by `claim_due`."""
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await write(store, "r", RunCreated(workflow_name="wf", input=b""))
    as_older_file(path, 4)
    assert "due_holds" not in tables(path)
    async with await SQLiteStore.open(path) as store:
        assert store.migrated_from == 4
        [summary] = await store.get_runs(["r"])
        assert summary is not None
        assert (summary.queue_name, summary.priority, summary.dedup_id) == (None, 0, None)
        due = await store.claim_due("w", T0, hold_until=T0 + timedelta(seconds=30), limit=5)
        assert [(d.run_id, d.reason) for d in due] == [("r", "queued")]
    assert plain_query(path, "SELECT max(version) FROM runfold_schema") == [(SCHEMA_VERSION,)]
