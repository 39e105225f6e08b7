"""`SQLiteStore`: the store class, its group commit, and the calls it makes on its thread."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiosqlite

from runfold.kernel import (
    Envelope,
    HookHolder,
    Limits,
    RunIndex,
    RunSummary,
    StoreClosed,
    StoreError,
    StoreOpenError,
    Wakeup,
)
from runfold.kernel.limits import DEFAULT_LIMITS
from runfold.stores import arguments
from runfold.stores._sql import (
    IndexReads,
    envelopes_from_rows,
    holder_from_row,
    replay_rows,
    summary_from_row,
    wakeup_from_row,
    wakeups_query,
)
from runfold.stores.base import StoreBase
from runfold.stores.protocol import ReplayedRun
from runfold.stores.signals import BoardSignals, SignalBoard
from runfold.stores.sqlite.deadline import Budget, call_on_thread, call_timeout
from runfold.stores.sqlite.due_work import SQLiteDueWork
from runfold.stores.sqlite.group import GroupCommits
from runfold.stores.sqlite.index import TOKEN_HOLDER, rewrite_run_index
from runfold.stores.sqlite.inline import inline_connection
from runfold.stores.sqlite.known import KnownRuns
from runfold.stores.sqlite.leases import SQLiteLeases
from runfold.stores.sqlite.reads import SUMMARY, fetch, fetch_summaries, read_head, read_rows
from runfold.stores.sqlite.retention import delete_ended_runs
from runfold.stores.sqlite.schema import (
    OPTIMIZE_INTERVAL,
    SCHEMA_VERSION,
    check_read_only,
    optimize,
    prepare,
)
from runfold.stores.sqlite.stalls import Stalls
from runfold.stores.sqlite.thread import connect, ready, result_code
from runfold.stores.sqlite.writer import Append
from runfold.stores.time_keys import time_key

__all__ = ["SQLiteStore", "Synchronous"]


T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL"]
"""The `synchronous` settings `SQLiteStore.open` accepts."""


class SQLiteStore(GroupCommits, IndexReads, SQLiteLeases, SQLiteDueWork, BoardSignals, StoreBase):
    """An `EventStore` in one SQLite file, opened with `await SQLiteStore.open(path)`.

    It keeps worker leases too (`WorkerLeases`), so a fleet of workers can share the file.
    """

    MARK = "?"
    SUMMARY = SUMMARY

    def __init__(
        self,
        db: aiosqlite.Connection,
        path: str,
        inline: sqlite3.Connection | None = None,
        budget: Budget | None = None,
    ) -> None:
        """Use `SQLiteStore.open`; this wraps the connections it has already prepared."""
        self._db = db
        self._budget = budget if budget is not None else Budget(30.0, 5000)
        self._inline = inline  # for appends that find no other in flight (`commit_inline`)
        self._path = path
        self._closed = False
        self._stalls = Stalls()  # its own long calls, and lock waits not yet in the file
        self._signals = SignalBoard()
        self.migrated_from: int | None = None
        """The schema version `open` found and migrated from (0: it created the schema), or None
        when the file was already at this runfold's version."""
        self._schema_work: tuple[int, Synchronous] | None = None  # `prepare`'s; None: read-only
        self._optimize_at = time.monotonic() + OPTIMIZE_INTERVAL  # see `delete_runs`
        # Group commit: while a transaction of appends is in flight (not `_idle`), appends wait in
        # `_queue`, and the `_writer` task writes them together in the next one.
        self._idle = asyncio.Event()
        self._idle.set()
        self._queue: list[Append] = []
        self._writer: asyncio.Task[None] | None = None
        # What each connection's own appends wrote last, so the next need not read it back.
        self._known = KnownRuns()
        self._known_inline = KnownRuns()

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 5.0,
        read_only: bool = False,
        commit_inline: bool = True,
        call_timeout: float = 30.0,
    ) -> SQLiteStore:
        """Open (creating or migrating) the store at `path`, or `":memory:"`.

        With `read_only`, the file is opened read-only (`mode=ro`): nothing is created or
        migrated and no lock is taken, so it can be read while another process writes (WAL
        readers do not wait for writers) and when the file itself is read-only; a file that is
        missing, not a runfold database, or at another schema version is refused, and appends
        fail with `StoreUnavailable`. Where no `-shm` file exists and none can be made (a
        read-only folder), SQLite cannot read the write-ahead log: the file is then read as it
        is if there is no `-wal` file (or an empty one), and refused with `StoreOpenError` if
        there is, rather than listing only what was checkpointed.

        `synchronous="FULL"` (the default) makes every acknowledged append survive power loss;
        `"NORMAL"` is faster in WAL mode and survives a crash of the process, but the last
        transactions before a power loss may be lost. `busy_timeout` is how long an append waits
        for another process's write lock before `StoreUnavailable`.

        `call_timeout` is every call's deadline, in seconds (`timeout(seconds)` changes it for
        the calls made in a block): a call that waits for the calls queued before it, or for
        another connection's write lock, past its deadline raises `StoreTimeout` and has
        written nothing; an append still being written `0.5` s past it raises `CommitUnknown`
        (it may yet commit: read the run back, as `CommandHandler` does).

        With `commit_inline` (the default; a file only), an append that finds no other in flight
        is committed on the calling thread, the event loop's, through a second connection,
        instead of being handed to the driver's thread and back: that hand-off costs about as
        much as the commit itself. So are appends made at the same moment (runs woken together)
        when nothing else is ready to run on the event loop, in one transaction. The event loop
        waits for the commit (its `fsync`, with `FULL`) meanwhile. Appends that arrive while one
        is being written are grouped on the driver's thread as before, and an append that finds
        the file's write lock taken waits for it there, never on the event loop's thread.

        Raises `StoreOpenError` for a file that is not a runfold database, was written by a newer
        runfold, or cannot be written; `StoreUnavailable` if another connection holds the write
        lock past `busy_timeout`.
        """
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        if not call_timeout > 0:
            raise ValueError("call_timeout must be a positive number of seconds")
        location = str(path)
        busy_ms = int(busy_timeout * 1000)
        if not read_only:
            db = await connect(location, location)
            found = await ready(db, location, prepare, busy_ms, synchronous)
        else:
            uri = Path(location).absolute().as_uri() + "?mode=ro"
            db = await connect(location, uri)
            try:
                found = await ready(db, location, check_read_only, busy_ms)
            except StoreOpenError as exc:
                if not isinstance(exc.__cause__, sqlite3.Error) or result_code(
                    exc.__cause__
                ) not in (
                    sqlite3.SQLITE_READONLY,
                    sqlite3.SQLITE_CANTOPEN,
                ):
                    raise
                # A WAL file is read through its -shm file, which nobody has made and this
                # process cannot make (a read-only folder): then nobody is writing the file
                # either, and SQLite may read it as immutable. Immutable, it ignores the -wal
                # file: one holding transactions would leave them out (a partial view passed
                # for the whole), so it is refused instead.
                wal = Path(location + "-wal")
                if wal.exists() and wal.stat().st_size > 0:
                    raise StoreOpenError(
                        f"cannot open SQLite store {location!r} read-only: its write-ahead log "
                        f"{wal.name!r} may hold committed transactions, which SQLite reads only "
                        f"through a {Path(location).name + '-shm'!r} file, and none can be made "
                        "beside it; open the store once for writing (which checkpoints the log "
                        "into the file), or copy both files where the folder is writable"
                    ) from exc
                db = await connect(location, uri + "&immutable=1")
                found = await ready(db, location, check_read_only, busy_ms)
        inline = None
        if commit_inline and not read_only:
            inline = await asyncio.to_thread(inline_connection, location, synchronous)
        store = cls(db, location, inline, Budget(call_timeout, busy_ms))
        store.migrated_from = found
        store._schema_work = None if read_only else (busy_ms, synchronous)
        return store

    def timeout(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """`with store.timeout(2.0):` the store's calls in the block have `seconds` each.

        That is, instead of `call_timeout`, for the calls this task makes in the block and those
        of the tasks it starts there. Raises `ValueError` unless `seconds` is positive.
        """
        return call_timeout(seconds)

    @property
    def schema_version(self) -> int:
        """The schema version this runfold writes and reads (`SchemaMigrator`)."""
        return SCHEMA_VERSION

    async def migrate(self) -> None:
        """Create or upgrade the file's schema to `SCHEMA_VERSION`; idempotent.

        `open` has done it already, unless another process has since put an older runfold's
        schema in its place. Raises `StoreOpenError` for a file written by a newer runfold, or
        a store opened read-only.
        """
        if self._closed:
            raise StoreClosed(f"the SQLite store {self._path!r} is closed")
        if self._schema_work is None:
            raise StoreOpenError(
                f"the SQLite store {self._path!r} is open read-only: open it for writing to "
                "migrate it"
            )
        found = await self._run(prepare, *self._schema_work)
        if found is not None:
            self.migrated_from = found

    async def close(self) -> None:
        """Close the store; later calls raise `StoreClosed`, closing again is harmless."""
        if self._closed:
            return
        self._closed = True
        self._signals.wake_all()
        await self._idle.wait()  # appends already accepted are written
        if self._schema_work is not None:  # opened for writing: leave the statistics fresh
            with contextlib.suppress(StoreError, sqlite3.Error):  # best effort
                await self._call(optimize)
        if self._inline is not None:
            self._inline.close()
        await self._db.close()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(connection, *args)` on the connection thread, translating driver errors."""
        if self._closed:
            raise StoreClosed(f"the SQLite store {self._path!r} is closed")
        return await self._call(fn, *args)

    async def _call(
        self,
        fn: Callable[..., T],
        *args: Any,
        deadline: float | None = None,
        late: Callable[[str], Exception] | None = None,
    ) -> T:
        """`_run` without the closed check: for appends accepted before `close`.

        It ends by `deadline` (a `time.monotonic()`; by default `call_timeout` from now), as
        `deadline.call_on_thread` says; `late` makes the error of a write still running then.
        """
        return await call_on_thread(
            self._db,
            self._budget,
            self._path,
            self._stalls.timed(fn),
            *args,
            deadline=deadline,
            late=late,
        )

    # --- reads --------------------------------------------------------------------------------

    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        """The run's envelopes after `after`, at most `limit` (`EventStore.read`)."""
        rows = await self._run(read_rows, run_id, None, after, limit, descending)
        return envelopes_from_rows(rows, run_id)

    async def replay(self, run_id: str, *, limits: Limits = DEFAULT_LIMITS) -> ReplayedRun | None:
        """The run's snapshot folded as its rows are read (`Replayer.replay`)."""
        arguments.check_text(run_id, "run_id")
        rows = await self._run(read_rows, run_id, None, 0, None, False)
        return replay_rows(rows, run_id, limits)

    async def _read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        after: int,
        limit: int | None,
        descending: bool,
        /,
    ) -> list[Envelope]:
        """The run's envelopes of one correlation id (`EventStore.read_by_correlation`)."""
        rows = await self._run(read_rows, run_id, correlation_id, after, limit, descending)
        return envelopes_from_rows(rows, run_id)

    async def _head(self, run_id: str, /) -> int:
        """The run's last sequence; 0 for an unknown run."""
        return await self._run(read_head, run_id)

    async def _read_all(self, after_position: int, limit: int, /) -> list[Envelope]:
        """The global feed after `after_position`, in position order (`EventStore.read_all`)."""
        rows = await self._run(
            fetch,
            "SELECT run_id, sequence, type, schema_version, payload, recorded_at, position "
            "FROM events WHERE position > ? ORDER BY position LIMIT ?",
            (after_position, max(limit, 0)),
        )
        return envelopes_from_rows(rows)

    # --- index queries ------------------------------------------------------------------------

    def _table(self, name: str) -> str:
        return name

    async def _rows(self, query: str, params: Sequence[Any]) -> list[Any]:
        return await self._run(fetch, query, params)

    async def _get_runs(self, run_ids: Sequence[str], /) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids."""
        wanted = list(dict.fromkeys(run_ids))
        if not wanted:
            if self._closed:
                raise StoreClosed(f"the SQLite store {self._path!r} is closed")
            return []
        rows = await self._run(fetch_summaries, wanted)
        found = {row[0]: summary_from_row(row) for row in rows}
        return [found.get(run_id) for run_id in run_ids]

    async def _find_hook(self, token: str, now: datetime, /) -> HookHolder | None:
        """The live holder of a hook token at `now`, or None."""
        rows = await self._run(fetch, TOKEN_HOLDER, (token, time_key(now)))
        return holder_from_row(rows[0]) if rows else None

    async def _wakeups(
        self, workflow_names: Collection[str] | None, due: int | None, limit: int
    ) -> list[Wakeup]:
        params: tuple[object, ...] = (limit,) if due is None else (due, limit)
        # The names are bound one by one, not as a JSON array: `json_each` would not give back
        # a name holding a NUL character as it was. An engine serves a handful.
        served = None
        if workflow_names is not None:
            served = f"IN ({', '.join('?' * len(workflow_names))})"
            params = (*sorted(workflow_names), *params)
        query = wakeups_query("", "?", served=served, due=due is not None)
        rows = await self._run(fetch, query, params)
        return [wakeup_from_row(row) for row in rows]

    async def rewrite_index(self, run_id: str, index: RunIndex | None, *, now: datetime) -> None:
        """Replace the run's index rows with `index` (None: remove them), appending nothing.

        The repair behind `runfold verify --rebuild-index`: an optional capability, not part of
        `EventStore`.

        Fenced like an append, in one transaction: `index` must describe the run's head
        (`index.summary.last_sequence`; 0, no events, for None), else `SequenceConflict`; a token
        another run's live hook holds at `now` raises `TokenConflict`. Nothing is written when
        either is raised.
        """
        arguments.check_rewrite_index(run_id, index, now=now)
        await self._run(rewrite_run_index, run_id, index, now)

    # --- retention ----------------------------------------------------------------------------

    async def _delete_runs(
        self, terminal_before: datetime, limit: int, run_ids: Collection[str] | None, /
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before` (the protocol's rules)."""
        if self._closed:
            raise StoreClosed(f"the SQLite store {self._path!r} is closed")
        chosen = None if run_ids is None else sorted(set(run_ids))
        deleted = await self._run(
            delete_ended_runs, time_key(terminal_before), max(limit, 0), chosen
        )
        if time.monotonic() >= self._optimize_at:  # retention is the store's periodic upkeep
            self._optimize_at = time.monotonic() + OPTIMIZE_INTERVAL
            await self._run(optimize)
        return deleted
