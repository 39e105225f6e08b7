"""The SQLite backend: every contender writes a file of its own, in a fresh directory under the
same temporary directory (one file system), in WAL mode with `synchronous=FULL` (every
acknowledged commit survives power loss)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import aiosqlite

from benchmarks.harness import Target, Trial, opened
from benchmarks.store_alone import Append, renamed_copies
from benchmarks.targets import (
    SQLITE_64_TASKS_VS_ONE,
    SQLITE_APPEND_VS_EVENTSOURCING,
    SQLITE_APPEND_VS_ONE_HOP,
    SQLITE_REPLAY_VS_EVENTSOURCING,
)
from benchmarks.workloads import LOG_EVENT
from runfold import EventStore
from runfold.kernel import encode_event
from runfold.stores import SQLiteStore
from runfold.stores.sqlite import inline, writer
from runfold.stores.sqlite.known import KnownRuns
from runfold.stores.sqlite.thread import on_thread as _on_thread

__all__ = ["SQLITE", "SQLiteBackend", "default_synchronous", "transaction_trial"]


def _file_system(path: Path) -> str:
    """The type of the file system `path` is on (the longest matching mount point)."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1]
            if str(path).startswith(point) and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def _wal_full(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")


def _raw_schema(conn: sqlite3.Connection) -> None:
    """The raw floor's table, keyed like runfold's events, in a WAL, synchronous=FULL file."""
    _wal_full(conn)
    conn.execute(
        "CREATE TABLE events (run_id TEXT, sequence INTEGER, type TEXT, payload BLOB, "
        "PRIMARY KEY (run_id, sequence)) WITHOUT ROWID"
    )


@contextlib.contextmanager
def _raw_connection(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        _raw_schema(conn)
        yield conn
    finally:
        conn.close()


_PAYLOAD = encode_event(LOG_EVENT)[2]


def _raw_transactions(
    conn: sqlite3.Connection, run_id: str, count: int, batch: int, first: int = 1
) -> None:
    """`count` transactions of `batch` INSERTs each into the raw table, from sequence `first`."""
    for start in range(first, first + count * batch, batch):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?)",
            [(run_id, s, "log", _PAYLOAD) for s in range(start, start + batch)],
        )
        conn.execute("COMMIT")


@contextlib.contextmanager
def transaction_trial(
    path: Path, loop: asyncio.AbstractEventLoop, workflow: Sequence[Append], count: int
) -> Iterator[Trial]:
    """A trial that commits `count` copies of `workflow`'s appends into a new store's file at
    `path`, each by the store's own transaction, called as a workflow one at a time commits.

    That is `append_inline` on a connection like the store's inline one, with its `KnownRuns`,
    each append's rows encoded beforehand (`Trial.prepare`): the statements, the pages they
    write and the commit, with none of the store's Python around them.
    """
    with opened(loop, SQLiteStore.open(path, synchronous="FULL")):
        pass  # the file and its schema, as the store makes them
    location = str(path)
    conn = inline.inline_connection(location, "FULL")
    assert conn is not None, "a file has an inline connection"
    known = KnownRuns()
    copies: list[list[writer.Append]] = []

    async def encoded() -> None:  # a queued append is made on a running loop (its future)
        copies[:] = [
            [
                writer.Append(
                    a.run_id,
                    a.expected_sequence,
                    a.events,
                    a.index,
                    a.recorded_at,
                    a.expected_position,
                )
                for a in appends
            ]
            for appends in renamed_copies(workflow, count)
        ]

    def run() -> None:
        for appends in copies:
            position: int | None = None
            for append in appends:
                if append.expected_position is not None:
                    append.expected_position = position  # the copy's own, as the engine names it
                outcomes = inline.append_inline(conn, [append], location, known)
                assert outcomes is not None, "nothing else writes the file"
                [written] = outcomes
                assert isinstance(written, list), f"the transaction failed: {written!r}"
                position = written[-1].position

    try:
        yield Trial(prepare=lambda: loop.run_until_complete(encoded()), run=run)
    finally:
        conn.close()


class SQLiteBackend:
    name = "SQLite"
    floor = "raw sqlite3"
    parallel_writers = False
    append_vs_raw: Target | None = None  # a thread hop costs what it costs: see append_vs_hop
    append_vs_hop: Target | None = SQLITE_APPEND_VS_ONE_HOP
    append_vs_eventsourcing = SQLITE_APPEND_VS_EVENTSOURCING
    distinct_vs_one: Mapping[int, Target] = {64: SQLITE_64_TASKS_VS_ONE}
    distinct_vs_raw: Mapping[int, Target] = {}
    replay_vs_eventsourcing: Target | None = SQLITE_REPLAY_VS_EVENTSOURCING

    def __init__(self) -> None:
        self._files = itertools.count(1)

    def version(self) -> str | None:
        return sqlite3.sqlite_version

    def describe(self) -> str:
        where = Path(tempfile.gettempdir())
        return (
            f"SQLite {sqlite3.sqlite_version} file in {where} ({_file_system(where)}), "
            "WAL, synchronous=FULL"
        )

    @contextlib.contextmanager
    def _file(self, name: str) -> Iterator[Path]:
        """A path in a fresh temporary directory, removed afterwards."""
        with tempfile.TemporaryDirectory(prefix="runfold-bench-") as directory:
            yield Path(directory) / f"{name}-{next(self._files)}.db"

    @contextlib.contextmanager
    def store(
        self, loop: asyncio.AbstractEventLoop, *, connections: int = 1
    ) -> Iterator[EventStore]:
        # SQLiteStore has one connection whatever `connections` says; appends that arrive
        # together share its transactions (group commit).
        with (
            self._file("runfold") as path,
            opened(loop, SQLiteStore.open(path, synchronous="FULL")) as store,
        ):
            yield store

    @contextlib.contextmanager
    def store_transactions(
        self, loop: asyncio.AbstractEventLoop, workflow: Sequence[Append], count: int
    ) -> Iterator[Trial | None]:
        with (
            self._file("transactions") as path,
            transaction_trial(path, loop, workflow, count) as trial,
        ):
            yield trial

    @contextlib.contextmanager
    def raw_inserts(
        self, loop: asyncio.AbstractEventLoop, *, writers: int, count: int, batch: int
    ) -> Iterator[Callable[[], None]]:
        if writers != 1:
            raise ValueError("SQLite has one writer at a time: its raw floor has one connection")
        with self._file("raw") as path, _raw_connection(path) as conn:
            runs = itertools.count(1)
            yield lambda: _raw_transactions(conn, f"raw-{next(runs)}", count, batch)

    @contextlib.contextmanager
    def raw_through_driver(
        self, loop: asyncio.AbstractEventLoop, *, count: int
    ) -> Iterator[Callable[[], None] | None]:
        # What `SQLiteStore` does with its own SQL: each transaction one call on aiosqlite's
        # connection thread, awaited from the event loop.
        with self._file("driver") as path:
            conn = loop.run_until_complete(aiosqlite.connect(path, isolation_level=None))
            loop.run_until_complete(_on_thread(conn, _raw_schema))
            runs = itertools.count(1)

            async def transactions() -> None:
                run_id = f"raw-{next(runs)}"
                for sequence in range(1, count + 1):
                    await _on_thread(conn, _raw_transactions, run_id, 1, 1, sequence)

            try:
                yield lambda: loop.run_until_complete(transactions())
            finally:
                loop.run_until_complete(conn.close())

    @contextlib.contextmanager
    def append_statement(
        self, loop: asyncio.AbstractEventLoop, *, count: int
    ) -> Iterator[Trial | None]:
        yield None  # the one-hop ceiling above is this store's reading of what is possible

    @contextlib.contextmanager
    def eventsourcing_env(self) -> Iterator[dict[str, str]]:
        # The recorder puts a file database in WAL mode and keeps the default synchronous=FULL.
        with self._file("eventsourcing") as path:
            yield {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}

    @contextlib.contextmanager
    def dbos_config(self) -> Iterator[dict[str, str]]:
        # DBOS opens the file with SQLite's defaults (synchronous=FULL); journal_mode=WAL is
        # kept in the file, so setting it first gives DBOS the same durability as the others.
        with self._file("dbos") as path:
            with contextlib.closing(sqlite3.connect(path)) as conn:
                _wal_full(conn)
            yield {"system_database_url": f"sqlite:///{path}"}


SQLITE = SQLiteBackend()


def default_synchronous() -> str:
    """SQLite's `synchronous` on a fresh connection, as DBOS's connections get it."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        row = conn.execute("PRAGMA synchronous").fetchone()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(int(row[0]), str(row[0]))
