"""The PostgreSQL store's schema: its tables and types, forward-only migrations, and the upgrade.

Tables live in their own PostgreSQL schema (default `runfold`), created and upgraded under an
advisory lock, so several processes may start at once. A schema already at this runfold's
version is only read, so the running application needs no DDL rights.
"""

from __future__ import annotations

from runfold.kernel import StoreOpenError
from runfold.stores.postgres import citus
from runfold.stores.postgres.connections import Connection
from runfold.stores.postgres.functions import functions

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "prepare_schema", "quote", "request_types"]

# Forward-only: migration N takes a schema at version N-1 to version N (tables, types, indexes).
# Never change what one that shipped leaves behind; add the next. Functions are not migrated:
# `functions` replaces them with this runfold's definitions whenever a migration runs. `{s}` is
# the quoted schema name.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.events (
        run_id text COLLATE "C" NOT NULL,
        sequence integer NOT NULL,
        type text NOT NULL,
        schema_version integer NOT NULL,
        correlation_id text COLLATE "C",
        payload bytea NOT NULL,
        recorded_at bigint NOT NULL,
        position bigint NOT NULL,
        PRIMARY KEY (run_id, sequence)
    );
    CREATE INDEX events_position ON {s}.events (position);
    CREATE INDEX events_correlation ON {s}.events (run_id, correlation_id, sequence)
        WHERE correlation_id IS NOT NULL;

    -- The summary, then the run's head (last sequence and feed position) and whether it has
    -- hook or wakeup rows (so that appends to a run without them skip their upkeep). Free space
    -- on each page keeps the row's updates HOT. (Since migration 7 the head is read from the
    -- run's last event, and the row written only when a field it holds changes.)
    CREATE TABLE {s}.runs (
        run_id text COLLATE "C" PRIMARY KEY,
        workflow_name text COLLATE "C" NOT NULL,
        status text COLLATE "C" NOT NULL,
        parent_run_id text COLLATE "C",
        created_at bigint NOT NULL,
        updated_at bigint NOT NULL,
        completed_at bigint,
        last_sequence integer NOT NULL,
        attributes text NOT NULL,
        head integer NOT NULL,
        head_position bigint NOT NULL,
        has_hooks boolean NOT NULL,
        has_wakeups boolean NOT NULL
    ) WITH (fillfactor = 80);
    CREATE INDEX runs_newest ON {s}.runs (created_at, run_id);
    CREATE INDEX runs_workflow ON {s}.runs (workflow_name, created_at, run_id);
    CREATE INDEX runs_status ON {s}.runs (status, created_at, run_id);
    CREATE INDEX runs_parent ON {s}.runs (parent_run_id, created_at, run_id)
        WHERE parent_run_id IS NOT NULL;
    CREATE INDEX runs_ended ON {s}.runs (completed_at) WHERE completed_at IS NOT NULL;

    -- A run's hook claims, kept with the run; `tokens` is the global index that lets a token be
    -- held by one hook only.
    CREATE TABLE {s}.hooks (
        run_id text COLLATE "C" NOT NULL,
        token bytea NOT NULL,
        hook_id text COLLATE "C" NOT NULL,
        retained_until bigint,
        PRIMARY KEY (run_id, token)
    );
    CREATE INDEX hooks_listing ON {s}.hooks (run_id, hook_id);
    CREATE TABLE {s}.tokens (
        token bytea PRIMARY KEY,
        run_id text COLLATE "C" NOT NULL,
        hook_id text COLLATE "C" NOT NULL,
        retained_until bigint
    );

    CREATE TABLE {s}.wakeups (
        run_id text COLLATE "C" NOT NULL,
        kind text COLLATE "C" NOT NULL,
        subject_id text COLLATE "C" NOT NULL,
        due_at bigint NOT NULL,
        PRIMARY KEY (run_id, kind, subject_id)
    );
    CREATE INDEX wakeups_due ON {s}.wakeups (due_at, run_id, kind, subject_id);

    -- One append: the events (in order) and the run's index rows after them.
    CREATE TYPE {s}.append_request AS (
        run_id text, expected integer,
        types text[], versions integer[], correlation_ids text[], payloads bytea[],
        recorded_at bigint,
        workflow_name text, status text, parent_run_id text, created_at bigint,
        updated_at bigint, completed_at bigint, last_sequence integer, attributes text,
        tokens bytea[], hook_ids text[], retained_until bigint[],
        wakeup_kinds text[], wakeup_subjects text[], wakeup_due bigint[]
    );

    """,
    # Migration 2 added the function append_plain_batch: functions live in `functions` now.
    "SELECT 1",
    """
    ALTER TYPE {s}.append_request ADD ATTRIBUTE expected_position bigint;
    """,
    # Run ownership: the owner of a live run (`RunSummary.owner_id`), found by its owner when
    # the owner's lease lapsed; and the leases of a fleet's workers (`WorkerLeases`).
    """
    ALTER TABLE {s}.runs ADD COLUMN owner_id text COLLATE "C";
    CREATE INDEX runs_owner ON {s}.runs (owner_id) WHERE owner_id IS NOT NULL;
    ALTER TYPE {s}.append_request ADD ATTRIBUTE owner_id text;
    CREATE TABLE {s}.leases (
        worker_id text COLLATE "C" PRIMARY KEY,
        lease_until bigint NOT NULL,
        started_at bigint NOT NULL
    );
    CREATE INDEX leases_until ON {s}.leases (lease_until);
    """,
    # Queues and due work (`DueWork`): a run's queue, priority and deduplication id (fixed at
    # its creation); the indexes of queued runs and of a queue's live runs; what `claim_due`
    # holds for a worker, a queue's recent starts (its rate limit) and its deduplication ids.
    """
    ALTER TABLE {s}.runs ADD COLUMN queue_name text COLLATE "C",
        ADD COLUMN priority integer NOT NULL DEFAULT 0,
        ADD COLUMN dedup_id text COLLATE "C";
    CREATE INDEX runs_queued ON {s}.runs (queue_name, priority, created_at, run_id)
        WHERE status = 'pending' AND owner_id IS NULL;
    CREATE INDEX runs_queue_live ON {s}.runs (queue_name, owner_id)
        WHERE queue_name IS NOT NULL AND completed_at IS NULL;
    ALTER TYPE {s}.append_request ADD ATTRIBUTE queue_name text,
        ADD ATTRIBUTE priority integer, ADD ATTRIBUTE dedup_id text;
    CREATE TABLE {s}.due_holds (
        run_id text COLLATE "C" PRIMARY KEY,
        worker_id text COLLATE "C" NOT NULL,
        held_until bigint NOT NULL,
        at_sequence integer NOT NULL
    );
    CREATE INDEX due_holds_until ON {s}.due_holds (held_until);
    CREATE TABLE {s}.queue_starts (
        queue_name text COLLATE "C" NOT NULL,
        started_at bigint NOT NULL,
        run_id text COLLATE "C" NOT NULL,
        PRIMARY KEY (queue_name, started_at, run_id)
    );
    CREATE TABLE {s}.queue_dedups (
        queue_name text COLLATE "C" NOT NULL,
        dedup_id text COLLATE "C" NOT NULL,
        run_id text COLLATE "C" NOT NULL,
        held_at bigint NOT NULL,
        PRIMARY KEY (queue_name, dedup_id)
    );
    """,
    # Migration 6 changed no table: it replaces `claim_due` (`functions`) with one that reads
    # queued runs down `runs_queued`, skips orphans and wakeups when there are none, and keeps
    # its statements' plans.
    "SELECT 1",
    # Migration 7 changed no table: a run's head is its last event (`heads`), and an append
    # writes the runs row only when a field the row holds changes; the row's head, last
    # sequence and time stand only for a run without events. Rows written before agree with
    # their events. Its number keeps an older runfold, which reads the head off the row, from
    # opening the schema.
    "SELECT 1",
)
"""The migrations, in order: the schema version is how many of them a database has had."""
SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this runfold writes and reads."""


def quote(identifier: str) -> str:
    """`identifier` as a quoted PostgreSQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'


async def prepare_schema(
    conn: Connection, schema: str, migrate: bool, *, distributed: bool = False
) -> int | None:
    """Check the version of `schema` on `conn`, migrating it first if `migrate`.

    With `distributed` (a Citus coordinator), the schema's tables are distributed too, if they
    are not yet (`citus.distribute`).

    Returns the version migrated from (0: the schema was created), or None when it was current.
    Raises `StoreOpenError` for a schema written by a newer runfold, one that is not runfold's,
    or (without `migrate`) one that needs migrating; driver errors pass through.
    """
    version = await _version(conn, schema)
    _refuse_newer(schema, version)
    to_distribute = distributed and not (version and await citus.is_distributed(conn, schema))
    if version == SCHEMA_VERSION and not to_distribute:
        return None
    if not migrate:
        found = (
            "holds no runfold store"
            if version == 0
            else f"is at version {version}, this runfold needs {SCHEMA_VERSION}"
            if version < SCHEMA_VERSION
            else "is not distributed"
        )
        raise StoreOpenError(
            f"schema {schema!r} {found}: migrate it first "
            "(`runfold migrate`, or `await store.migrate()`)"
        )
    # A session lock, so that the migration runs in a transaction begun after it: one begun
    # before would keep catalog caches from before the previous holder's commit, and not see
    # the schema it made.
    lock = (f"runfold migrate {schema}",)
    await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", lock)
    try:
        async with conn.transaction():
            return await _migrate_locked(conn, schema, distributed)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", lock)


async def request_types(conn: Connection, schema: str) -> tuple[int, int]:
    """The types of `append_request` in `schema` and of its array."""
    cursor = await conn.execute(
        "SELECT oid, typarray FROM pg_type WHERE oid = to_regtype(%s)",
        (f"{quote(schema)}.append_request",),
    )
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def _migrate_locked(conn: Connection, schema: str, distributed: bool) -> int | None:
    """Apply the missing migrations (the caller holds the migration lock); the version
    migrated from, or None if another process migrated meanwhile.

    A distributed schema (asked for, or found) takes its migrations one statement at a time,
    then has its new tables distributed."""
    s = quote(schema)
    version = await _version(conn, schema)  # another process may have migrated meanwhile
    _refuse_newer(schema, version)
    distributed = distributed or bool(version and await citus.is_distributed(conn, schema))
    if distributed and version == SCHEMA_VERSION and await citus.is_distributed(conn, schema):
        return None
    if version == 0:
        await _refuse_foreign(conn, schema)
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        await conn.execute(
            f"CREATE TABLE {s}.schema_version (version integer PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
    for number in range(version + 1, SCHEMA_VERSION + 1):
        migration = MIGRATIONS[number - 1].format(s=s)
        for statement in citus.statements(migration) if distributed else [migration]:
            await conn.execute(statement)
        await conn.execute(f"INSERT INTO {s}.schema_version (version) VALUES (%s)", (number,))
    if distributed:
        await citus.distribute(conn, schema)
        for function in functions(s, distributed=True):
            await conn.execute(function)
    else:
        await conn.execute("".join(functions(s)))
    return version if version < SCHEMA_VERSION or distributed else None


async def _version(conn: Connection, schema: str) -> int:
    """The schema's version; 0 when it has no `schema_version` table."""
    s = quote(schema)
    cursor = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{s}.schema_version",))
    row = await cursor.fetchone()
    if row is None or not row[0]:
        return 0
    cursor = await conn.execute(f"SELECT coalesce(max(version), 0) FROM {s}.schema_version")
    row = await cursor.fetchone()
    return int(row[0]) if row is not None else 0


async def _refuse_foreign(conn: Connection, schema: str) -> None:
    """`StoreOpenError` if the schema holds tables but is not a runfold schema."""
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s",
        (schema,),
    )
    row = await cursor.fetchone()
    if row is not None and row[0]:
        raise StoreOpenError(
            f"schema {schema!r} holds tables but no runfold schema_version: "
            "it is not a runfold schema"
        )


def _refuse_newer(schema: str, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StoreOpenError(
            f"schema {schema!r} has version {version}, written by a newer runfold; "
            f"this one knows up to {SCHEMA_VERSION}"
        )
