"""The SQLite store's schema: its tables, forward-only migrations and the checks made at open.

The `runfold_schema` table records the versions applied; a file written by a newer runfold is
refused.
"""

from __future__ import annotations

import sqlite3
import time

from runfold.kernel import StoreOpenError
from runfold.stores.sqlite.thread import result_code

__all__ = [
    "ANALYSIS_LIMIT",
    "MIGRATIONS",
    "OPTIMIZE_INTERVAL",
    "SCHEMA_VERSION",
    "check_read_only",
    "optimize",
    "prepare",
]

_COLUMN_TYPES = {
    "runs": (
        "typeof(NEW.run_id) = 'text' AND typeof(NEW.workflow_name) = 'text' "
        "AND typeof(NEW.status) = 'text' AND typeof(NEW.parent_run_id) IN ('text', 'null') "
        "AND typeof(NEW.created_at) = 'integer' AND typeof(NEW.updated_at) = 'integer' "
        "AND typeof(NEW.completed_at) IN ('integer', 'null') "
        "AND typeof(NEW.last_sequence) = 'integer' AND typeof(NEW.attributes) = 'text' "
        "AND json_valid(NEW.attributes) AND json_type(NEW.attributes) = 'object'"
    ),
    "hooks": (
        "typeof(NEW.token) = 'text' AND typeof(NEW.run_id) = 'text' "
        "AND typeof(NEW.hook_id) = 'text' AND typeof(NEW.retained_until) IN ('integer', 'null')"
    ),
    "wakeups": (
        "typeof(NEW.run_id) = 'text' AND typeof(NEW.kind) = 'text' "
        "AND typeof(NEW.subject_id) = 'text' AND typeof(NEW.due_at) = 'integer'"
    ),
}
"""Migration 3's rule for each index table: the type SQLite must store in every column (never
edit). The events table has none: only the store writes its rows, from `encode_event`, and a
row of the wrong type is `CorruptEvent` when read; a trigger there would cost every append a
check per event."""


_OWNER_TYPE = "typeof(NEW.owner_id) IN ('text', 'null')"
"""Migration 4's addition to the runs rule of `_COLUMN_TYPES` (never edit)."""


def _typed_owner() -> str:
    """Migration 4's triggers on runs: migration 3's rule for the table, and its new owner_id."""
    rule = f"{_COLUMN_TYPES['runs']} AND {_OWNER_TYPE}"
    return "".join(
        f"DROP TRIGGER runs_types_{when}; "
        f"CREATE TRIGGER runs_types_{when} BEFORE {when.upper()} ON runs "
        f"WHEN NOT ({rule}) BEGIN SELECT RAISE(ABORT, "
        "'runfold: a value of the wrong type in runs'); END;"
        for when in ("insert", "update")
    )


_QUEUE_TYPE = (
    "typeof(NEW.queue_name) IN ('text', 'null') AND typeof(NEW.priority) = 'integer' "
    "AND typeof(NEW.dedup_id) IN ('text', 'null')"
)
"""Migration 5's addition to the runs rule (never edit)."""


def _typed_queue() -> str:
    """Migration 5's triggers on runs: migration 4's rule, and the queue's columns."""
    rule = f"{_COLUMN_TYPES['runs']} AND {_OWNER_TYPE} AND {_QUEUE_TYPE}"
    return "".join(
        f"DROP TRIGGER runs_types_{when}; "
        f"CREATE TRIGGER runs_types_{when} BEFORE {when.upper()} ON runs "
        f"WHEN NOT ({rule}) BEGIN SELECT RAISE(ABORT, "
        "'runfold: a value of the wrong type in runs'); END;"
        for when in ("insert", "update")
    )


def _typed_tables() -> str:
    """Migration 3: triggers refusing an index row with a value of the wrong type in any column.

    SQLite's column types are only affinities: a text `due_at` or a REAL `updated_at` would be
    stored as given. Triggers, unlike `STRICT` tables (SQLite 3.37) or added CHECK constraints
    (a copy of every table), need no rebuild of an existing file and no recent SQLite.
    """
    return "".join(
        f"CREATE TRIGGER {table}_types_{when} BEFORE {when.upper()} ON {table} "
        f"WHEN NOT ({rule}) BEGIN SELECT RAISE(ABORT, "
        f"'runfold: a value of the wrong type in {table}'); END;"
        for table, rule in _COLUMN_TYPES.items()
        for when in ("insert", "update")
    )


# Forward-only: migration N takes a database at version N-1 to version N. Never edit one that
# shipped; add the next.
MIGRATIONS: tuple[str, ...] = (
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
    # Index rows of the wrong type cannot be stored (rows stored before are read as
    # `CorruptIndex`; `runfold verify --rebuild-index` rewrites them).
    _typed_tables(),
    # Run ownership: the owner of a live run (`RunSummary.owner_id`), found by its owner when
    # the owner's lease lapsed; and the leases of a fleet's workers (`WorkerLeases`).
    """
    ALTER TABLE runs ADD COLUMN owner_id TEXT;
    CREATE INDEX runs_owner ON runs (owner_id) WHERE owner_id IS NOT NULL;
    CREATE TABLE leases (
        worker_id TEXT PRIMARY KEY CHECK (typeof(worker_id) = 'text'),
        lease_until INTEGER NOT NULL CHECK (typeof(lease_until) = 'integer'),
        started_at INTEGER NOT NULL CHECK (typeof(started_at) = 'integer')
    ) WITHOUT ROWID;
    CREATE INDEX leases_until ON leases (lease_until);
    """
    + _typed_owner(),
    # Queues and due work (`DueWork`): a run's queue, priority and deduplication id (fixed at
    # its creation); the indexes of queued runs and of a queue's live runs; what `claim_due`
    # holds for a worker, a queue's recent starts (its rate limit) and its deduplication ids.
    """
    ALTER TABLE runs ADD COLUMN queue_name TEXT;
    ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN dedup_id TEXT;
    CREATE INDEX runs_queued ON runs (queue_name, priority, created_at, run_id)
        WHERE status = 'pending' AND owner_id IS NULL;
    CREATE INDEX runs_queue_live ON runs (queue_name, owner_id)
        WHERE queue_name IS NOT NULL AND completed_at IS NULL;
    CREATE TABLE due_holds (
        run_id TEXT PRIMARY KEY CHECK (typeof(run_id) = 'text'),
        worker_id TEXT NOT NULL CHECK (typeof(worker_id) = 'text'),
        held_until INTEGER NOT NULL CHECK (typeof(held_until) = 'integer'),
        at_sequence INTEGER NOT NULL CHECK (typeof(at_sequence) = 'integer')
    ) WITHOUT ROWID;
    CREATE INDEX due_holds_until ON due_holds (held_until);
    CREATE TABLE queue_starts (
        queue_name TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        PRIMARY KEY (queue_name, started_at, run_id)
    ) WITHOUT ROWID;
    CREATE TABLE queue_dedups (
        queue_name TEXT NOT NULL,
        dedup_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        held_at INTEGER NOT NULL,
        PRIMARY KEY (queue_name, dedup_id)
    ) WITHOUT ROWID;
    """
    + _typed_queue(),
    # The file's stalls (`stalls.Stalls`): waits for the write lock that took long enough to let
    # leases lapse through no fault of their holders; every process spares those.
    """
    CREATE TABLE stalls (
        ended_at INTEGER NOT NULL CHECK (typeof(ended_at) = 'integer'),
        started_at INTEGER NOT NULL CHECK (typeof(started_at) = 'integer'),
        PRIMARY KEY (ended_at, started_at)
    ) WITHOUT ROWID;
    """,
)
"""The migrations, in order: the schema version is how many of them a database has had."""
SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this runfold writes and reads."""


def _statements(script: str) -> list[str]:
    """The statements of `script`, split at the semicolons that end one (not those inside a
    trigger's body): `execute` takes one statement, and `executescript` would commit."""
    found, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                found.append(pending)
            pending = ""
    if pending.strip(" \n;"):
        raise ValueError(f"an incomplete statement in a migration: {pending.strip()[:60]}")
    return found


def _tables(conn: sqlite3.Connection, busy_ms: int) -> set[str]:
    """The file's table names; `StoreOpenError` if it is not a SQLite file, or not runfold's."""
    conn.execute(f"PRAGMA busy_timeout = {busy_ms:d}")
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        if result_code(exc) != sqlite3.SQLITE_NOTADB:
            raise  # e.g. unreadable, or its folder is read-only: `open` reports it with the path
        raise StoreOpenError(f"not a SQLite database: {exc}") from None
    if tables and "runfold_schema" not in tables:
        raise StoreOpenError(
            f"not a runfold database (it has tables {sorted(tables)[:5]} but no runfold_schema)"
        )
    return tables


def _write_ahead_log(conn: sqlite3.Connection, busy_ms: int) -> None:
    """Put the file in WAL mode, waiting up to `busy_ms` for the lock that takes.

    Written by hand because SQLite's busy handler is not called here when another connection
    holds the file's reserved lock (it could deadlock on ours): the switch fails at once with
    SQLITE_BUSY. Processes that open a new file together meet that, so it is retried.
    """
    deadline = time.monotonic() + busy_ms / 1000
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if result_code(exc) != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(pause)  # on the connection's own thread, not the event loop's
        pause = min(2 * pause, 0.05)


def check_read_only(conn: sqlite3.Connection, busy_ms: int) -> None:
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


def prepare(conn: sqlite3.Connection, busy_ms: int, synchronous: str) -> int | None:
    """Create or migrate the schema; the version migrated from (0: created), or None."""
    _tables(conn, busy_ms)
    _write_ahead_log(conn, busy_ms)
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
            for statement in _statements(MIGRATIONS[number - 1]):
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


ANALYSIS_LIMIT = 1000
"""Rows `optimize` lets ANALYZE look at per index: approximate statistics, at a bounded cost."""
OPTIMIZE_INTERVAL = 3600.0
"""Seconds between two `optimize` runs of a store's retention, besides the one at close."""


def optimize(conn: sqlite3.Connection) -> None:
    """Refresh the planner's statistics where they are missing or stale (`PRAGMA optimize`).

    SQLite analyzes the tables whose indexes this connection's queries used and which have no
    statistics, or have grown much since. Without statistics, its planner may walk the wrong
    index: the queries whose plan matters at scale do not rely on them, but the others are
    better planned with them.
    """
    conn.execute(f"PRAGMA analysis_limit = {ANALYSIS_LIMIT:d}")
    conn.execute("PRAGMA optimize")
