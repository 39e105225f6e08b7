"""The SQLite backend: every contender writes a file of its own, in a fresh directory under the
same temporary directory (one file system), in WAL mode with `synchronous=FULL` (every
acknowledged commit survives power loss)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import aiosqlite

from benchmarks.harness import Target, opened
from benchmarks.targets import (
    SQLITE_64_TASKS_VS_ONE,
    SQLITE_APPEND_VS_EVENTSOURCING,
    SQLITE_APPEND_VS_RAW,
    SQLITE_REPLAY_VS_EVENTSOURCING,
)
from benchmarks.workloads import LOG_EVENT
from runfold import EventStore, encode_event
from runfold.stores import SQLiteStore

__all__ = ["SQLITE", "SQLiteBackend", "default_synchronous"]


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


class SQLiteBackend:
    name = "SQLite"
    floor = "raw sqlite3"
    parallel_writers = False
    append_vs_raw = SQLITE_APPEND_VS_RAW
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
    def raw_inserts(
        self, loop: asyncio.AbstractEventLoop, *, writers: int, count: int, batch: int
    ) -> Iterator[Callable[[], None]]:
        if writers != 1:
            raise ValueError("SQLite has one writer at a time: its raw floor has one connection")
        _, _, payload = encode_event(LOG_EVENT)
        with self._file("raw") as path:
            conn = sqlite3.connect(path, isolation_level=None)
            _wal_full(conn)
            conn.execute(
                "CREATE TABLE events (run_id TEXT, sequence INTEGER, type TEXT, payload BLOB, "
                "PRIMARY KEY (run_id, sequence)) WITHOUT ROWID"
            )
            runs = itertools.count(1)

            def work() -> None:
                run_id = f"raw-{next(runs)}"
                for first in range(1, count * batch + 1, batch):
                    conn.execute("BEGIN IMMEDIATE")
                    conn.executemany(
                        "INSERT INTO events VALUES (?, ?, ?, ?)",
                        [(run_id, s, "log", payload) for s in range(first, first + batch)],
                    )
                    conn.execute("COMMIT")

            try:
                yield work
            finally:
                conn.close()

    @contextlib.contextmanager
    def thread_hops(
        self, loop: asyncio.AbstractEventLoop, *, count: int
    ) -> Iterator[Callable[[], None] | None]:
        # aiosqlite runs each call on its connection's thread: `SELECT 1` there and back.
        with self._file("hops") as path:
            conn = loop.run_until_complete(aiosqlite.connect(path))

            async def calls() -> None:
                for _ in range(count):
                    await conn.execute_fetchall("SELECT 1")

            try:
                yield lambda: loop.run_until_complete(calls())
            finally:
                loop.run_until_complete(conn.close())

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
