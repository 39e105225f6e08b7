"""`SQLiteStore`: the embedded default, on aiosqlite.

One file (or `:memory:`), WAL, `busy_timeout`, `foreign_keys=ON`, `synchronous=FULL` by default.

- **Schema**: created and migrated by the store (a `runfold_schema` table, forward-only numbered
  migrations). A file written by a newer runfold is refused at open.
- **Append**: one `BEGIN IMMEDIATE … COMMIT` that checks the head, inserts the batch, assigns
  global-feed positions and replaces the run's index rows; the `(run_id, sequence)` primary key is
  the backstop. aiosqlite makes a thread hop per call, so the whole transaction runs as one
  function on its connection thread (one hop per transaction). Appends that arrive while a
  transaction is running are combined into the next one (group commit), each inside its own
  SAVEPOINT so it keeps its own all-or-nothing outcome and its own conflict.
- **Feed**: SQLite has one writer at a time, so positions taken inside the write transaction
  commit in order: a tailing reader can never see a lower position appear later.
- **Times** are stored as integer microseconds since the Unix epoch.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple, Self, TypeVar

import aiosqlite

from runfold.kernel import (
    Envelope,
    Event,
    HookClaim,
    HookHolder,
    Limits,
    Page,
    RunIndex,
    RunStatus,
    RunSummary,
    SequenceConflict,
    StoreClosed,
    StoreError,
    StoreOpenError,
    StoreUnavailable,
    TokenConflict,
    Wakeup,
    correlation_id,
    encode_event,
    make_envelope,
)
from runfold.kernel._gc import BULK, in_bulk
from runfold.stores._sql import (
    SUMMARY_COLUMNS,
    WakeupReads,
    envelopes_from_rows,
    holds_at,
    hook_page,
    list_hooks_query,
    list_runs_query,
    optional_time,
    replay_rows,
    summary_from_row,
    summary_page,
    token_holder_query,
    wakeup_from_row,
    wakeups_query,
)
from runfold.stores.protocol import ReplayedRun, check_append, check_index, time_key

__all__ = ["SQLiteStore"]

T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DEFAULT_LIMITS = Limits()
_TERMINAL = ("completed", "failed", "cancelled", "timed_out")

# Forward-only: migration N takes a database at version N-1 to version N. Never edit one that
# shipped; add the next.
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE events (
        run_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        type TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        correlation_id TEXT,
        payload BLOB NOT NULL,
        recorded_at INTEGER NOT NULL,
        position INTEGER NOT NULL,
        PRIMARY KEY (run_id, sequence)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX events_position ON events (position);
    CREATE INDEX events_correlation ON events (run_id, correlation_id, sequence)
        WHERE correlation_id IS NOT NULL;
    CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        workflow_name TEXT NOT NULL,
        status TEXT NOT NULL,
        parent_run_id TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        completed_at INTEGER,
        last_sequence INTEGER NOT NULL,
        attributes TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX runs_newest ON runs (created_at, run_id);
    CREATE INDEX runs_workflow ON runs (workflow_name, created_at, run_id);
    CREATE INDEX runs_status ON runs (status, created_at, run_id);
    CREATE INDEX runs_parent ON runs (parent_run_id, created_at, run_id)
        WHERE parent_run_id IS NOT NULL;
    CREATE INDEX runs_ended ON runs (completed_at) WHERE completed_at IS NOT NULL;
    CREATE TABLE hooks (
        token TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        hook_id TEXT NOT NULL,
        retained_until INTEGER
    ) WITHOUT ROWID;
    CREATE INDEX hooks_run ON hooks (run_id, hook_id);
    CREATE TABLE wakeups (
        run_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        subject_id TEXT NOT NULL,
        due_at INTEGER NOT NULL,
        PRIMARY KEY (run_id, kind, subject_id)
    ) WITHOUT ROWID;
    CREATE INDEX wakeups_due ON wakeups (due_at, run_id, kind, subject_id);
    """,
    # Retention may delete the events holding the highest positions; the feed must still never
    # hand a position out twice, so the highest one ever assigned is kept apart from the events.
    """
    CREATE TABLE feed_high_water (position INTEGER NOT NULL);
    INSERT INTO feed_high_water (position) SELECT coalesce(max(position), 0) FROM events;
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)


class _Append:
    """One queued append and the future its caller awaits."""

    __slots__ = (
        "events",
        "expected",
        "expected_position",
        "future",
        "index",
        "recorded_at",
        "rows",
        "run_id",
    )

    def __init__(
        self,
        run_id: str,
        expected: int,
        events: Sequence[Event],
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None,
    ) -> None:
        self.run_id = run_id
        self.expected = expected
        self.expected_position = expected_position if expected > 0 else None
        self.events = events
        self.index = index
        self.recorded_at = recorded_at
        self.future: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        # Encode here, on the event loop, so a bad event fails before any SQL runs.
        self.rows = [(*encode_event(event), correlation_id(event)) for event in events]


def _settle(request: _Append, outcome: list[Envelope] | BaseException) -> None:
    """Hand a queued append its outcome."""
    if request.future.done():
        return
    if isinstance(outcome, BaseException):
        request.future.set_exception(outcome)
    else:
        request.future.set_result(outcome)


class SQLiteStore(WakeupReads):
    """An `EventStore` in one SQLite file, opened with `await SQLiteStore.open(path)`."""

    def __init__(self, db: aiosqlite.Connection, path: str) -> None:
        """Use `SQLiteStore.open`; this wraps a connection it has already prepared."""
        self._db = db
        self._path = path
        self._closed = False
        self.migrated_from: int | None = None
        """The schema version `open` found and migrated from (0: it created the schema), or None
        when the file was already at this runfold's version."""
        # Group commit: while a transaction of appends is in flight (not `_idle`), appends wait in
        # `_queue`, and the `_writer` task writes them together in the next one.
        self._idle = asyncio.Event()
        self._idle.set()
        self._queue: list[_Append] = []
        self._writer: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 5.0,
        read_only: bool = False,
    ) -> SQLiteStore:
        """Open (creating or migrating) the store at `path`, or `":memory:"`.

        With `read_only`, the file is opened read-only (`mode=ro`): nothing is created or
        migrated and no lock is taken, so it can be read while another process writes (WAL
        readers do not wait for writers) and when the file itself is read-only; a file that is
        missing, not a runfold database, or at another schema version is refused, and appends
        fail with `StoreUnavailable`.

        `synchronous="FULL"` (the default) makes every acknowledged append survive power loss;
        `"NORMAL"` is faster in WAL mode and survives a crash of the process, but the last
        transactions before a power loss may be lost. `busy_timeout` is how long an append waits
        for another process's write lock before `StoreUnavailable`.

        Raises `StoreOpenError` for a file that is not a runfold database, was written by a newer
        runfold, or cannot be written; `StoreUnavailable` if another connection holds the write
        lock past `busy_timeout`.
        """
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be 'FULL' or 'NORMAL'")
        location = str(path)
        busy_ms = int(busy_timeout * 1000)
        if not read_only:
            db = await _connect(location, location)
            found = await _ready(db, location, _prepare, busy_ms, synchronous)
        else:
            uri = Path(location).absolute().as_uri() + "?mode=ro"
            db = await _connect(location, uri)
            try:
                found = await _ready(db, location, _check_read_only, busy_ms)
            except StoreOpenError as exc:
                if not isinstance(exc.__cause__, sqlite3.Error) or _code(exc.__cause__) not in (
                    sqlite3.SQLITE_READONLY,
                    sqlite3.SQLITE_CANTOPEN,
                ):
                    raise
                # A WAL file is read through its -shm file, which nobody has made and this
                # process cannot make (a read-only folder): then nobody is writing the file
                # either, and SQLite may read it as immutable.
                db = await _connect(location, uri + "&immutable=1")
                found = await _ready(db, location, _check_read_only, busy_ms)
        store = cls(db, location)
        store.migrated_from = found
        return store

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the store; later calls raise `StoreClosed`, closing again is harmless."""
        if self._closed:
            return
        self._closed = True
        await self._idle.wait()  # appends already accepted are written
        await self._db.close()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(connection, *args)` on the connection thread, translating driver errors."""
        if self._closed:
            raise StoreClosed(f"the SQLite store {self._path!r} is closed")
        return await self._call(fn, *args)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """`_run` without the closed check: for appends accepted before `close`."""
        try:
            return await _on_thread(self._db, fn, *args)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"SQLite store {self._path!r}: {exc}") from None
        except ValueError as exc:  # aiosqlite: "Connection closed"
            raise StoreClosed(f"the SQLite store {self._path!r} is closed: {exc}") from None

    # --- append (group commit) ----------------------------------------------------------------

    async def append_if_sequence(
        self,
        run_id: str,
        expected_sequence: int,
        events: Sequence[Event],
        *,
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None = None,
    ) -> list[Envelope]:
        """Append `events` if the run's head is `expected_sequence`, all or nothing.

        `EventStore.append_if_sequence`, with its errors. Appends made while a transaction is
        in flight are written together in the next one, each with its own outcome.
        """
        check_append(run_id, events, index)
        if self._closed:
            raise StoreClosed(f"the SQLite store {self._path!r} is closed")
        request = _Append(run_id, expected_sequence, events, index, recorded_at, expected_position)
        self._queue.append(request)
        if self._idle.is_set():
            self._idle.clear()
            try:
                await asyncio.sleep(0)  # appends made at this same moment join this one
            except BaseException:
                self._write_queue_or_rest()  # those joined wait for it; this one goes too
                raise
            if len(self._queue) == 1:
                # Alone: this task writes it, sparing the hand-offs to and from the writer task
                # (most of a sequential append's cost, but for the commit). If cancelled
                # meanwhile, it leaves; the connection thread still finishes the transaction
                # and runs whatever comes next only after it.
                self._queue = []
                try:
                    (outcome,) = await self._call(_append_batch, [request])
                finally:
                    self._write_queue_or_rest()
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
            self._write_queue_or_rest()
        # Shielded: a caller that is cancelled leaves; its append stays in the batch.
        return await asyncio.shield(request.future)

    def _write_queue_or_rest(self) -> None:
        """Start the writer task for the queued appends, or, with none, mark the store idle."""
        if self._queue:
            self._writer = asyncio.create_task(self._write_queued())
        else:
            self._idle.set()

    async def _write_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                outcomes = await self._call(_append_batch, batch)
            except BaseException as exc:  # the whole transaction failed: all of it
                for request in batch:
                    _settle(request, exc)
                if not isinstance(exc, Exception):
                    self._idle.set()
                    raise
                continue
            for request, outcome in zip(batch, outcomes, strict=True):
                _settle(request, outcome)
        self._idle.set()

    # --- reads --------------------------------------------------------------------------------

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """The run's envelopes after `after`, at most `limit` (`EventStore.read`)."""
        rows = await self._run(_read_rows, run_id, None, after, limit, descending)
        return envelopes_from_rows(rows, run_id)

    async def replay(self, run_id: str, *, limits: Limits = _DEFAULT_LIMITS) -> ReplayedRun | None:
        """The run's snapshot folded as its rows are read (`Replayer.replay`)."""
        rows = await self._run(_read_rows, run_id, None, 0, None, False)
        return replay_rows(rows, run_id, limits)

    async def read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[Envelope]:
        """The run's envelopes of one correlation id (`EventStore.read_by_correlation`)."""
        rows = await self._run(_read_rows, run_id, correlation_id, after, limit, descending)
        return envelopes_from_rows(rows, run_id)

    async def head(self, run_id: str) -> int:
        """The run's last sequence; 0 for an unknown run."""
        return await self._run(_head, run_id)

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The global feed after `after_position`, in position order (`EventStore.read_all`)."""
        rows = await self._run(
            _fetch,
            "SELECT run_id, sequence, type, schema_version, payload, recorded_at, position "
            "FROM events WHERE position > ? ORDER BY position LIMIT ?",
            (after_position, max(limit, 0)),
        )
        return envelopes_from_rows(rows)

    # --- index queries ------------------------------------------------------------------------

    async def list_runs(
        self,
        *,
        workflow_name: str | None = None,
        status: RunStatus | None = None,
        parent_run_id: str | None = None,
        created_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 20,
    ) -> Page[RunSummary]:
        """Run summaries, newest first, filtered, a page at a time (`EventStore.list_runs`)."""
        query, params = list_runs_query(
            "?",
            "runs",
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
        )
        return summary_page(await self._run(_fetch, query, params), limit)

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids."""
        wanted = list(dict.fromkeys(run_ids))
        if not wanted:
            if self._closed:
                raise StoreClosed(f"the SQLite store {self._path!r} is closed")
            return []
        rows = await self._run(
            _fetch,
            f"SELECT {SUMMARY_COLUMNS} FROM runs WHERE run_id IN (SELECT value FROM json_each(?))",
            (json.dumps(wanted),),
        )
        found = {row[0]: summary_from_row(row) for row in rows}
        return [found.get(run_id) for run_id in run_ids]

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """The live holder of a hook token at `now`, or None."""
        rows = await self._run(_fetch, _TOKEN_HOLDER, (token, time_key(now)))
        if not rows:
            return None
        run_id, hook_id, retained = rows[0]
        return HookHolder(run_id=run_id, hook_id=hook_id, retained_until=optional_time(retained))

    async def list_hooks(
        self,
        *,
        run_id: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime,
    ) -> Page[HookHolder]:
        """Live and still-retained hooks at `now`, a page at a time (`EventStore.list_hooks`)."""
        query, params = list_hooks_query(
            "?", "hooks", run_id=run_id, cursor=cursor, limit=limit, now=now
        )
        return hook_page(await self._run(_fetch, query, params), limit)

    async def _wakeups(
        self, workflow_names: Collection[str] | None, due: int | None, limit: int
    ) -> list[Wakeup]:
        params: tuple[object, ...] = (limit,) if due is None else (due, limit)
        served = None if workflow_names is None else "IN (SELECT value FROM json_each(?))"
        query = wakeups_query("", "?", served=served, due=due is not None)
        if workflow_names is not None:
            params = (json.dumps(sorted(workflow_names)), *params)
        rows = await self._run(_fetch, query, params)
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
        check_index(run_id, index)
        await self._run(_rewrite_index, run_id, index, now)

    # --- retention ----------------------------------------------------------------------------

    async def delete_runs(
        self, *, terminal_before: datetime, limit: int, run_ids: Collection[str] | None = None
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before` (the protocol's rules)."""
        if self._closed:
            raise StoreClosed(f"the SQLite store {self._path!r} is closed")
        chosen = None if run_ids is None else json.dumps(sorted(run_ids))
        return await self._run(_delete_runs, time_key(terminal_before), max(limit, 0), chosen)


# --- functions that run on the connection thread -------------------------------------------------


async def _connect(location: str, target: str) -> aiosqlite.Connection:
    """A connection to `target` (a path, or a `file:` URI), in autocommit mode."""
    connecting = aiosqlite.connect(target, isolation_level=None, uri=target.startswith("file:"))
    try:
        return await connecting
    except sqlite3.Error as exc:
        # On a failed connect aiosqlite stops its worker thread with a future nobody awaits;
        # let the thread end while this loop runs, or it posts to a closed loop and raises.
        for _ in range(5000):
            if not connecting._thread.is_alive():
                break
            await asyncio.sleep(0.001)
        raise StoreOpenError(f"cannot open SQLite store {location!r}: {exc}") from None


async def _ready(
    db: aiosqlite.Connection, location: str, prepare: Callable[..., T], *args: Any
) -> T:
    """`prepare(connection, *args)`, its driver errors as runfold's; `db` closed if it fails."""
    try:
        return await _on_thread(db, prepare, *args)
    except StoreOpenError:
        await db.close()
        raise
    except sqlite3.Error as exc:
        await db.close()
        if _code(exc) == sqlite3.SQLITE_BUSY:
            # Another connection held the write lock past busy_timeout: transient.
            raise StoreUnavailable(f"SQLite store {location!r} is busy: {exc}") from None
        raise StoreOpenError(f"cannot use SQLite store {location!r}: {exc}") from exc


def _code(exc: sqlite3.Error) -> int:
    """The primary result code of a driver error (0 if it has none)."""
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


async def _on_thread(db: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(sqlite3_connection, *args)` on aiosqlite's connection thread, in one hop.

    aiosqlite executes each of its own calls as a function queued to that thread (`_execute`);
    handing it our function is how a whole transaction costs one hop instead of one per
    statement. `_execute` and `_conn` are aiosqlite internals, stable since 0.17; the test suite
    runs against the installed version.
    """
    call = _Call(fn, args)
    result: T = await db._execute(call, db._conn)  # type: ignore[no-untyped-call]
    return result


class _Call:
    """`fn(connection, *args)`, shown by its function's name alone.

    aiosqlite logs every call it runs, with its arguments, at DEBUG; ours carry hook tokens
    (`find_hook`, appends that claim one), which must never reach a log.
    """

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args

    def __call__(self, conn: sqlite3.Connection) -> Any:
        return self.fn(conn, *self.args)

    def __repr__(self) -> str:
        return f"<runfold SQLite call {getattr(self.fn, '__name__', 'function')}>"


def _tables(conn: sqlite3.Connection, busy_ms: int) -> set[str]:
    """The file's table names; `StoreOpenError` if it is not a SQLite file, or not runfold's."""
    conn.execute(f"PRAGMA busy_timeout = {busy_ms:d}")
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        if _code(exc) != sqlite3.SQLITE_NOTADB:
            raise  # e.g. unreadable, or its folder is read-only: `open` reports it with the path
        raise StoreOpenError(f"not a SQLite database: {exc}") from None
    if tables and "runfold_schema" not in tables:
        raise StoreOpenError(
            f"not a runfold database (it has tables {sorted(tables)[:5]} but no runfold_schema)"
        )
    return tables


def _check_read_only(conn: sqlite3.Connection, busy_ms: int) -> None:
    """Check a file opened read-only is a runfold store at this version (nothing is written)."""
    if not _tables(conn, busy_ms):
        raise StoreOpenError("an empty database: no runfold store in it yet")
    row = conn.execute("SELECT max(version) FROM runfold_schema").fetchone()
    version = row[0] or 0
    if version != SCHEMA_VERSION:
        newer = "a newer runfold" if version > SCHEMA_VERSION else "an older runfold"
        raise StoreOpenError(
            f"the database has schema version {version}, written by {newer}; this one reads "
            f"version {SCHEMA_VERSION}"
            + (" (open it for writing to migrate it)" if version < SCHEMA_VERSION else "")
        )


def _prepare(conn: sqlite3.Connection, busy_ms: int, synchronous: str) -> int | None:
    """Create or migrate the schema; the version migrated from (0: created), or None."""
    _tables(conn, busy_ms)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS runfold_schema (version INTEGER NOT NULL)")
        row = conn.execute("SELECT max(version) FROM runfold_schema").fetchone()
        version = row[0] or 0
        if version > SCHEMA_VERSION:
            raise StoreOpenError(
                f"the database has schema version {version}, written by a newer runfold; "
                f"this one knows up to {SCHEMA_VERSION}"
            )
        migrated_from = version if version < SCHEMA_VERSION else None
        for number in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[number - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO runfold_schema (version) VALUES (?)", (number,))
        # A read-only file opens and reads fine (even BEGIN IMMEDIATE succeeds): one real write
        # makes it fail here, with StoreOpenError, rather than at the first append.
        conn.execute("UPDATE runfold_schema SET version = version")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return migrated_from


def _fetch(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def _head(conn: sqlite3.Connection, run_id: str) -> int:
    row = conn.execute("SELECT max(sequence) FROM events WHERE run_id = ?", (run_id,)).fetchone()
    return int(row[0] or 0)


def _read_rows(
    conn: sqlite3.Connection,
    run_id: str,
    correlation: str | None,
    after: int,
    limit: int | None,
    descending: bool,
) -> list[Any]:
    clauses = ["run_id = ?"]
    params: list[Any] = [run_id]
    if correlation is not None:
        clauses.append("correlation_id = ?")
        params.append(correlation)
    if descending:
        if after > 0:
            clauses.append("sequence < ?")
            params.append(after)
    else:
        clauses.append("sequence > ?")
        params.append(after)
    params.append(-1 if limit is None else max(limit, 0))
    cursor = conn.execute(
        "SELECT sequence, type, schema_version, payload, recorded_at, position "
        f"FROM events WHERE {' AND '.join(clauses)} "
        f"ORDER BY sequence {'DESC' if descending else 'ASC'} LIMIT ?",
        params,
    )
    # Without a limit the rows may be a whole long history: a tuple each, fetched with the
    # cycle collector paused (a read of a few rows pays a fraction of a microsecond for it).
    return in_bulk(BULK if limit is None else limit, cursor.fetchall)


class _IndexRows(NamedTuple):
    """What a run's index rows hold before an append (`status` None: no runs row yet)."""

    status: str | None
    completed_at: int | None
    has_hooks: bool
    has_wakeups: bool


_RUN_STATE = (
    "SELECT (SELECT max(sequence) FROM events WHERE run_id = ?1), "
    "(SELECT position FROM events WHERE run_id = ?1 ORDER BY sequence DESC LIMIT 1), runs.status, "
    "runs.completed_at, EXISTS (SELECT 1 FROM hooks WHERE run_id = ?1), "
    "EXISTS (SELECT 1 FROM wakeups WHERE run_id = ?1), "
    "max(coalesce((SELECT max(position) FROM events), 0), (SELECT position FROM feed_high_water)) "
    "FROM (SELECT 1) LEFT JOIN runs ON runs.run_id = ?1"
)
"""The run's head and its event's feed position; what its index rows hold now: status and end
time (None, None without a runs row), and whether it has hook and wakeup rows; and the last feed
position handed out (retention may have deleted its event)."""


def _append_one(conn: sqlite3.Connection, request: _Append) -> list[Envelope]:
    run_id = request.run_id
    last, head_position, status, completed_at, has_hooks, has_wakeups, next_position = conn.execute(
        _RUN_STATE, (run_id,)
    ).fetchone()
    head = last or 0
    if head != request.expected or (
        request.expected_position is not None and head_position != request.expected_position
    ):
        raise SequenceConflict(run_id, request.expected, head)
    now = time_key(request.recorded_at)
    claims = _live_claims(conn, run_id, request.index, request.recorded_at)
    conn.executemany(
        "INSERT INTO events (run_id, sequence, type, schema_version, correlation_id, payload, "
        "recorded_at, position) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (run_id, head + n, event_type, version, correlation, payload, now, next_position + n)
            for n, (event_type, version, payload, correlation) in enumerate(request.rows, start=1)
        ],
    )
    before = _IndexRows(status, completed_at, bool(has_hooks), bool(has_wakeups))
    _write_index(conn, run_id, request.index, claims, before)
    return [
        make_envelope(run_id, head + n, event, request.recorded_at, next_position + n)
        for n, event in enumerate(request.events, start=1)
    ]


def _refusal(conn: sqlite3.Connection, request: _Append, exc: Exception) -> Exception:
    """What a refused append raises: a conflict as it is; an `IntegrityError` is a conflict
    only if the head moved (the primary key backs the head check), else something else refused
    the insert (a constraint or trigger of the user's), a `StoreError` that says so."""
    if not isinstance(exc, sqlite3.IntegrityError):
        return exc
    head = _head(conn, request.run_id)
    if head != request.expected:
        return SequenceConflict(request.run_id, request.expected, head)
    refusal = StoreError(f"SQLite refused the append to {request.run_id!r}: {exc}")
    refusal.__cause__ = exc
    return refusal


_TOKEN_HOLDER = token_holder_query("?", "hooks")
"""The hook row holding a token at a time: live, or retained past it."""


def _live_claims(
    conn: sqlite3.Connection, run_id: str, index: RunIndex, at: datetime
) -> tuple[HookClaim, ...]:
    """The claims of `index` live at `at`; `TokenConflict` if another run's hook holds one."""
    claims = index.claims_at(at)
    now = time_key(at)
    for claim in claims:
        held = conn.execute(_TOKEN_HOLDER, (claim.token, now)).fetchone()
        if held is not None and held[0] != run_id:
            raise TokenConflict(claim.token, held[0], held[1])
    return claims


def _write_index(
    conn: sqlite3.Connection,
    run_id: str,
    index: RunIndex,
    claims: Sequence[HookClaim],
    before: _IndexRows | None = None,
) -> None:
    """Replace the run's summary, hook and wakeup rows (`claims`: its hooks to keep).

    `before` is what `_RUN_STATE` found (None: unknown, so everything is rewritten).
    """
    summary = index.summary
    completed_at = None if summary.completed_at is None else time_key(summary.completed_at)
    # An upsert, not INSERT OR REPLACE: a replace deletes and reinserts the row, rewriting all
    # five runs indexes. SQLite rewrites an index whenever the SET clause names one of its
    # columns, whatever the value, so status and end time are set only when they change (a
    # run's fixed name, parent and creation time never are): most appends then write no runs
    # index page at all.
    unchanged = (
        before is not None
        and before.status == summary.status
        and before.completed_at == completed_at
    )
    conn.execute(
        "INSERT INTO runs (run_id, workflow_name, status, parent_run_id, created_at, updated_at, "
        "completed_at, last_sequence, attributes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id) DO UPDATE SET "
        + ("" if unchanged else "status = excluded.status, completed_at = excluded.completed_at, ")
        + "updated_at = excluded.updated_at, last_sequence = excluded.last_sequence, "
        "attributes = excluded.attributes",
        (
            run_id,
            summary.workflow_name,
            summary.status,
            summary.parent_run_id,
            time_key(summary.created_at),
            time_key(summary.updated_at),
            completed_at,
            summary.last_sequence,
            json.dumps(dict(summary.attributes), sort_keys=True),
        ),
    )
    if before is None or before.has_hooks:
        conn.execute("DELETE FROM hooks WHERE run_id = ?", (run_id,))
    if claims:
        conn.executemany(
            "INSERT OR REPLACE INTO hooks (token, run_id, hook_id, retained_until) "
            "VALUES (?, ?, ?, ?)",
            [
                (
                    c.token,
                    run_id,
                    c.hook_id,
                    None if c.retained_until is None else time_key(c.retained_until),
                )
                for c in claims
            ],
        )
    if before is None or before.has_wakeups:
        conn.execute("DELETE FROM wakeups WHERE run_id = ?", (run_id,))
    if index.wakeups:
        conn.executemany(
            "INSERT INTO wakeups (run_id, kind, subject_id, due_at) VALUES (?, ?, ?, ?)",
            [(run_id, w.kind, w.subject_id, time_key(w.due_at)) for w in index.wakeups],
        )


def _rewrite_index(
    conn: sqlite3.Connection, run_id: str, index: RunIndex | None, now: datetime
) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        expected = index.summary.last_sequence if index is not None else 0
        head = _head(conn, run_id)
        if head != expected:
            raise SequenceConflict(run_id, expected, head)
        # The append's upsert keeps a run's fixed columns (name, parent, creation time); a repair
        # must replace them too, so the old row goes first.
        for table in ("hooks", "wakeups", "runs"):
            conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        if index is not None:
            _write_index(conn, run_id, index, _live_claims(conn, run_id, index, now))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _append_batch(
    conn: sqlite3.Connection, batch: list[_Append]
) -> list[list[Envelope] | BaseException]:
    """Every queued append in one transaction, each in its own savepoint when there are several."""
    outcomes: list[list[Envelope] | BaseException] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        # A lone append needs no savepoint: if it fails, the transaction holds nothing else.
        alone = len(batch) == 1
        for request in batch:
            if not alone:
                conn.execute("SAVEPOINT one_append")
            try:
                envelopes = _append_one(conn, request)
            except (SequenceConflict, TokenConflict, sqlite3.IntegrityError) as exc:
                conn.execute("ROLLBACK" if alone else "ROLLBACK TO one_append")
                if not alone:
                    conn.execute("RELEASE one_append")
                outcomes.append(_refusal(conn, request, exc))
                continue
            if not alone:
                conn.execute("RELEASE one_append")
            outcomes.append(envelopes)
        if conn.in_transaction:  # a lone append that failed has rolled it back already
            conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return outcomes


def _delete_runs(
    conn: sqlite3.Connection, terminal_before: int, limit: int, run_ids: str | None
) -> int:
    """`run_ids`: a JSON array of the runs to choose from, or None for any."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        doomed = [
            row[0]
            for row in conn.execute(
                "SELECT run_id FROM runs WHERE completed_at IS NOT NULL AND completed_at < ? "
                f"AND status IN {_TERMINAL!r} AND NOT EXISTS (SELECT 1 FROM hooks "
                f"WHERE hooks.run_id = runs.run_id AND {holds_at('?')}) "
                "AND (? IS NULL OR run_id IN (SELECT value FROM json_each(?))) "
                "ORDER BY completed_at, run_id LIMIT ?",
                (terminal_before, terminal_before, run_ids, run_ids, limit),
            )
        ]
        conn.execute(
            "UPDATE feed_high_water SET position = max(position, "
            "coalesce((SELECT max(position) FROM events), 0))"
        )
        for table in ("events", "hooks", "wakeups", "runs"):
            conn.executemany(f"DELETE FROM {table} WHERE run_id = ?", [(r,) for r in doomed])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(doomed)
