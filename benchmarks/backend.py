"""What a database gives the benchmarks that run on several of them (appends, contention,
replay, command cost, workflows): runfold's store on it, the raw driver floor, and the peers'
settings, all on the same file system or server with the same durability."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from benchmarks.harness import Target, Trial
from benchmarks.store_alone import Append
from runfold import EventStore

__all__ = ["Backend"]


class Backend(Protocol):
    name: str
    """As rows and headings say it: "SQLite", "PostgreSQL"."""
    floor: str
    """The raw driver as rows name it: "raw sqlite3", "raw psycopg"."""
    parallel_writers: bool
    """Whether the database runs writers in parallel, so that a raw floor with several
    connections means something (SQLite has one writer at a time)."""
    append_vs_raw: Target | None
    append_vs_hop: Target | None
    """The target of a sequential append against the one-hop ceiling (`raw_through_driver`)."""
    append_vs_eventsourcing: Target
    distinct_vs_one: Mapping[int, Target]
    """Targets of N writers on distinct runs against one writer, by N."""
    distinct_vs_raw: Mapping[int, Target]
    """Targets of N writers on distinct runs against the raw floor with N connections, by N."""
    replay_vs_eventsourcing: Target | None

    def version(self) -> str | None:
        """The database's version, or None (said on stderr) when it cannot be reached."""
        ...

    def describe(self) -> str:
        """The "on" column: what runs where, with its durability settings."""
        ...

    def store(
        self, loop: asyncio.AbstractEventLoop, *, connections: int = 1
    ) -> AbstractContextManager[EventStore]:
        """A fresh, empty runfold store (a new file or schema), closed and removed afterwards."""
        ...

    def raw_inserts(
        self, loop: asyncio.AbstractEventLoop, *, writers: int, count: int, batch: int
    ) -> AbstractContextManager[Callable[[], None]]:
        """The floor: the bare driver, `writers` connections each committing `count`
        transactions of `batch` INSERTs into a table keyed like runfold's."""
        ...

    def raw_through_driver(
        self, loop: asyncio.AbstractEventLoop, *, count: int
    ) -> AbstractContextManager[Callable[[], None] | None]:
        """The floor's single-INSERT transactions, `count` of them, each run as one call on
        the async driver's worker thread and awaited from the event loop, or None for a driver
        that runs on the event loop: the best any store on this driver could do."""
        ...

    def append_statement(
        self, loop: asyncio.AbstractEventLoop, *, count: int
    ) -> AbstractContextManager[Trial | None]:
        """runfold's own single-event append statement on runfold's schema, sent `count` times
        by the bare driver with its parameters made once: what runfold's store could do with
        no client cost of its own beyond the floor's, or None where it is not measured."""
        ...

    def store_transactions(
        self, loop: asyncio.AbstractEventLoop, workflow: Sequence[Append], count: int
    ) -> AbstractContextManager[Trial | None]:
        """The store's own transaction of each of `workflow`'s appends, `count` copies of the
        workflow one after the other, called straight with their rows encoded beforehand:
        the statements and the commit without the store's Python around them, or None where
        it is not measured."""
        ...

    def eventsourcing_env(self) -> AbstractContextManager[dict[str, str]]:
        """Settings of a fresh `eventsourcing` recorder on this database."""
        ...

    def dbos_config(self) -> AbstractContextManager[dict[str, str]]:
        """`DBOSConfig` entries for a fresh DBOS system database on this database."""
        ...
