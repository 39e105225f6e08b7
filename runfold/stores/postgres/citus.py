"""The PostgreSQL store on a run-sharded Citus cluster: its layout, its feed bound, its retention.

`PostgresStore.open(..., distributed=True)` on a Citus coordinator lays the schema out itself:
the per-run tables distributed by `run_id` in one colocation group (a run's rows, and so all of
an append's statements, on one worker), the hook tokens distributed by `token` in a group of
their own (a token's row on one shard, so its primary key keeps it held by one hook), and the
fleet's small tables (`leases`, the queues' starts and deduplication ids) left on the coordinator.
Migrations are sent one statement at a time (Citus propagates each DDL statement by itself), and
after them `distribute` distributes every table of the layout that is not yet distributed, so a
table a later migration adds is distributed by the same step.

Four things change on a cluster, each written here once (a fifth, `claim_due`, is `citus_due`):

- **The append.** A plain append is one `INSERT ... SELECT` that Citus routes whole to the run's
  worker (`routed_append`; in a group commit, one per append: `plain_batch_function`): one
  round trip from the coordinator, committed on the worker in one phase.
- **The feed's bound.** Positions stay the coordinator's transaction id × 1,000,000 + ordinal,
  one integer store-wide. `read_feed` takes its bound (the oldest transaction still running) on
  the coordinator, where those ids are issued, and then waits for the transactions below it that
  still hold their id's lock: Citus commits a transaction that wrote two workers (a hook claim on
  another worker's token shard, say) in two phases, and tells the workers `COMMIT PREPARED` only
  after the coordinator's commit, while it still holds its locks. Until then its rows are not
  visible on the workers, though its id is no longer running.
- **Positions outlive a crash of the coordinator.** An append's rows live on a worker, so its
  transaction on the coordinator wrote no WAL there, and PostgreSQL does not flush the commit
  record of such a transaction: killed within the next moment (before the WAL writer's next
  round), the coordinator recovered without it and handed its ids out again, two appends
  sharing positions and the feed going back below positions already read. Each append writes
  a small WAL record on the coordinator first (`durable_position`, `durable_xact_function`), so
  that its commit there is flushed before the store answers, as on one server. Left open: a
  crash while an append commits (its worker already committed, the coordinator's flush not
  yet done).
- **Retention.** A statement may not lock rows of several shards (`FOR UPDATE`), nor mix a
  distributed read with writes to a table of another distribution: `delete_runs` chooses its
  candidates without locks, then deletes each run in a transaction of its own, locking its runs
  row by `run_id` and rechecking it, as the single-server statement does for all at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from runfold.stores._sql import holds_at
from runfold.stores.postgres.connections import Connection

__all__ = [
    "DISTRIBUTED_TABLES",
    "delete_runs",
    "distribute",
    "drop_unborn_run",
    "durable_position",
    "durable_xact_function",
    "is_distributed",
    "one_row_inserts",
    "plain_batch_function",
    "read_feed_function",
    "routed_append",
    "row_by_row",
    "statements",
]

DISTRIBUTED_TABLES: tuple[tuple[str, str, str], ...] = (
    ("runs", "run_id", "default"),
    ("events", "run_id", "runs"),
    ("hooks", "run_id", "runs"),
    ("wakeups", "run_id", "runs"),
    ("due_holds", "run_id", "runs"),
    ("tokens", "token", "none"),
)
"""The distributed tables: (table, distribution column, colocated with).

In the order they are distributed: `runs` starts the run group; `tokens` is alone in its group
(`none`)."""


def statements(sql: str) -> list[str]:
    """The statements of a migration, one by one: its `--` comments dropped, split at `;`.

    Migrations hold no function bodies or string literals with a `;` (functions are created
    apart, one statement each).
    """
    text = re.sub(r"--[^\n]*", "", sql)
    return [part.strip() for part in text.split(";") if part.strip()]


async def is_distributed(conn: Connection, schema: str) -> bool:
    """Whether `schema`'s `events` table is distributed by Citus on the server of `conn`."""
    cursor = await conn.execute("SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
    row = await cursor.fetchone()
    if row is None or not row[0]:
        return False
    cursor = await conn.execute(
        "SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = to_regclass(%s))",
        (f"{_quote(schema)}.events",),
    )
    row = await cursor.fetchone()
    return bool(row and row[0])


async def distribute(conn: Connection, schema: str) -> list[str]:
    """Distribute the tables of the layout that are not yet distributed; the ones it did.

    Raises `psycopg` errors as they come (no Citus on the server among them).
    """
    s = _quote(schema)
    cursor = await conn.execute(
        "SELECT logicalrelid::regclass::text FROM pg_dist_partition "
        "WHERE logicalrelid::regclass::text = ANY(%s)",
        ([f"{s}.{table}" for table, _, _ in DISTRIBUTED_TABLES],),
    )
    done = {row[0] for row in await cursor.fetchall()}
    made: list[str] = []
    for table, column, group in DISTRIBUTED_TABLES:
        name = f"{s}.{table}"
        if name in done:
            continue
        colocate = group if group in ("default", "none") else f"{s}.{group}"
        await conn.execute(
            "SELECT create_distributed_table(%s, %s, colocate_with => %s)",
            (name, column, colocate),
        )
        made.append(table)
    return made


_POSITION_RECORD = "PERFORM pg_logical_emit_message(false, 'runfold', 'position');"
"""A WAL record of this transaction on the coordinator: its commit is then flushed there.

Not transactional: in `append_batch`'s subtransactions a transactional one would take a
subtransaction id per append."""


def durable_position(function: str) -> str:
    """`function` (plpgsql, its positions this transaction's id) writing `_POSITION_RECORD` first.

    See the module: without a WAL record of its own on the coordinator, an append's commit
    there is not flushed, and a crash of the coordinator hands its id out again."""
    return function.replace("\n    BEGIN\n", f"\n    BEGIN\n        {_POSITION_RECORD}\n", 1)


def durable_xact_function(s: str) -> str:
    """`durable_xact()`: this transaction's id, after `_POSITION_RECORD` (see `durable_position`).

    Declared STABLE, though it writes that record, so that Citus evaluates it on the coordinator
    and sends the value on: a volatile function in a routed `INSERT ... SELECT` makes Citus
    run the `SELECT` on the worker (the id then the worker's), send its rows back with `COPY`
    and commit in two phases."""
    return f"""
    CREATE OR REPLACE FUNCTION {s}.durable_xact() RETURNS bigint LANGUAGE plpgsql STABLE AS $fn$
    BEGIN
        {_POSITION_RECORD}
        RETURN pg_current_xact_id()::text::bigint;
    END
    $fn$;
"""


def _routed_insert(
    s: str, field: Callable[[str], str], event: str, position: str, xact: str, positions: int
) -> str:
    """The `INSERT ... SELECT` of an append's first event that Citus routes to its run's worker.

    It inserts the event (`event`: its type, version, correlation id and payload) at
    `position`, after the run's last one, found by the primary key at the expected head (and at
    the expected position, when given), written by a transaction older than `xact` (the feed
    order; `positions` is `POSITIONS_PER_TRANSACTION`), onto a live run whose row the append
    leaves as it is: not ended, no hook or wakeup rows, the same status, owner and attributes.
    The key `(run_id, sequence)` refuses a second event at that sequence (`unique_violation`).
    It returns the position, or no row where it wrote nothing. `field` gives the append's other
    fields. Every value but the columns read is a constant or a parameter, the run id among
    them, and no function in it is volatile, so that Citus routes it (an `INSERT` of a
    data-modifying `WITH` it runs in steps, and commits in two phases)."""
    run_id = field("run_id")
    return f"""INSERT INTO {s}.events AS w (run_id, sequence, type, schema_version,
            correlation_id, payload, recorded_at, position)
        SELECT prev.run_id, prev.sequence + 1, {event}, {field("recorded_at")}, {position}
        FROM {s}.events prev JOIN {s}.runs run ON run.run_id = prev.run_id
        WHERE prev.run_id = {run_id} AND run.run_id = {run_id}
            AND prev.sequence = {field("expected")}
            AND prev.position = coalesce({field("expected_position")}, prev.position)
            AND prev.position < ({xact} + 1) * {positions}
            AND run.completed_at IS NULL AND NOT run.has_hooks AND NOT run.has_wakeups
            AND (run.status, run.completed_at, run.attributes, run.owner_id)
                IS NOT DISTINCT FROM ({field("status")}, {field("completed_at")},
                    {field("attributes")}, {field("owner_id")})
        RETURNING w.position"""


_BIGINTS = ("expected_position", "recorded_at", "completed_at")


def _parameter(name: str) -> str:
    """The `plain_append` parameter `name`, typed: a NULL comes untyped."""
    kind = "integer" if name == "expected" else "bigint" if name in _BIGINTS else "text"
    return f"%({name})s::{kind}"


def routed_append(s: str, positions: int) -> str:
    """One plain append of one event on a cluster, as one statement routed to its worker.

    Citus sends it whole to the run's worker, which commits it in one phase (autocommit). It
    returns the base position, or no row. It is `_routed_insert`'s statement, with
    `plain_append`'s parameters; its position the coordinator's transaction id (`durable_xact`,
    evaluated there). No row: the append wrote nothing, and `append_events` says why (or
    writes it, with the run's row)."""
    event = "%(type)s::text, %(version)s::integer, %(correlation_id)s::text, %(payload)s::bytea"
    position = f"{s}.durable_xact() * {positions} + 1"
    xact = "pg_current_xact_id()::text::bigint"
    insert = _routed_insert(s, _parameter, event, position, xact, positions)
    return f"{insert} - 1"


def plain_batch_function(s: str, positions: int) -> str:
    """`append_plain_batch` for a cluster: each append's first event by `_routed_insert`.

    One routed statement per append of one event, where the single server's function reads
    the head and the runs row first; what it returns is the same (the base position, or -1 -
    the run's head where it wrote nothing). An append it cannot write (a runs row to write, hook
    or wakeup rows to clear) it leaves to `append_events` that way, as it does a conflict."""
    event = "r.types[1], r.versions[1], r.correlation_ids[1], r.payloads[1]"
    insert = _routed_insert(s, lambda name: f"r.{name}", event, "v_base + 1", "v_xact", positions)
    return f"""
    CREATE OR REPLACE FUNCTION {s}.append_plain_batch(p_requests {s}.append_request[])
    RETURNS SETOF bigint LANGUAGE plpgsql AS $fn$
    DECLARE
        v_xact bigint := {s}.durable_xact();
        v_ordinal integer := 0;  -- ordinals taken by the appends written so far
        v_base bigint;
        v_written bigint;
        v_head integer;
        v_n integer;
        r {s}.append_request;
    BEGIN
        FOREACH r IN ARRAY p_requests LOOP
            v_base := v_xact * {positions} + v_ordinal;
            v_written := NULL;
            IF cardinality(r.types) > 0 THEN
                {insert} INTO v_written;
            END IF;
            IF v_written IS NOT NULL THEN
                {row_by_row(s, "v_base", first=2)};
                RETURN NEXT v_base;
                v_ordinal := v_ordinal + cardinality(r.types);
            ELSE
                SELECT max(sequence) INTO v_head FROM {s}.events WHERE run_id = r.run_id;
                RETURN NEXT -1 - coalesce(v_head, 0);
            END IF;
        END LOOP;
    END
    $fn$;
"""


def row_by_row(s: str, base: str, *, first: int = 1) -> str:
    """The events of `append_request` `r` inserted one row per statement, from the `first`.

    Their positions are `base` + n. One `INSERT ... SELECT` would do on one server, but Citus
    writes it with `COPY` and commits any transaction that used it in two phases, even on one
    worker; a row of `VALUES` with the run id given is routed to the run's shard."""
    return f"""FOR v_n IN {first}..cardinality(r.types) LOOP
            INSERT INTO {s}.events (run_id, sequence, type, schema_version, correlation_id,
                payload, recorded_at, position)
            VALUES (r.run_id, r.expected + v_n, r.types[v_n], r.versions[v_n],
                r.correlation_ids[v_n], r.payloads[v_n], r.recorded_at, {base} + v_n);
        END LOOP"""


def one_row_inserts(function: str, inserts: dict[str, str]) -> str:
    """`function` (plpgsql) with each statement of `inserts` replaced by its loop.

    The loops are `row_by_row`'s; their counter is declared."""
    for statement, loop in inserts.items():
        function = function.replace(statement, loop)
    return function.replace("DECLARE\n", "DECLARE\n        v_n integer;\n", 1)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def read_feed_function(s: str, positions: int) -> str:
    """`read_feed` for a cluster: the bound taken on the coordinator, two-phase commits awaited.

    See the module; `positions` is `POSITIONS_PER_TRANSACTION`."""
    # A 32-bit xid of pg_locks as a 64-bit one, in the epoch of v_next (the next id to assign).
    full = (
        "((v_next & ~4294967295::bigint) | l.transactionid::text::bigint)"
        " - CASE WHEN l.transactionid::text::bigint > (v_next & 4294967295::bigint)"
        " THEN 4294967296 ELSE 0 END"
    )
    return f"""
    -- The global feed after p_after on a Citus cluster: only transactions older than the
    -- oldest one still running on the coordinator (whose ids the positions are), and among
    -- those only once none still holds its id's lock (a two-phase commit telling the workers
    -- to commit). It first waits (up to p_wait_ms) for the transactions running when it was
    -- called. The bound is computed here, then passed to the workers as a constant.
    CREATE OR REPLACE FUNCTION {s}.read_feed(p_after bigint, p_limit integer, p_wait_ms integer)
    RETURNS SETOF {s}.events LANGUAGE plpgsql AS $fn$
    DECLARE
        v_called xid8 := pg_snapshot_xmax(pg_current_snapshot());
        v_until timestamptz := clock_timestamp() + p_wait_ms * interval '1 millisecond';
        v_bound bigint;
        v_next bigint;
    BEGIN
        WHILE pg_snapshot_xmin(pg_current_snapshot()) < v_called
                AND clock_timestamp() < v_until LOOP
            PERFORM pg_sleep(0.001);
        END LOOP;
        v_bound := pg_snapshot_xmin(pg_current_snapshot())::text::bigint;
        v_next := pg_snapshot_xmax(pg_current_snapshot())::text::bigint;
        -- Ended below the bound but still finishing (their locks not yet released): wait for
        -- them, up to 2 s more (a worker that cannot be reached keeps a commit unfinished).
        v_until := clock_timestamp() + interval '2 seconds';
        WHILE EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'transactionid'
                    AND l.mode = 'ExclusiveLock' AND {full} < v_bound)
                AND clock_timestamp() < v_until LOOP
            PERFORM pg_sleep(0.001);
        END LOOP;
        RETURN QUERY EXECUTE format(
            'SELECT * FROM {s}.events e WHERE e.position > %s AND e.position < %s '
            'ORDER BY e.position LIMIT %s', p_after, v_bound * {positions}, p_limit);
    END
    $fn$;
"""


_CANDIDATES = """SELECT run_id FROM {s}.runs r
    WHERE completed_at IS NOT NULL AND completed_at < %(before)s
        AND status = ANY(%(terminal)s::text[])
        AND NOT EXISTS (SELECT FROM {s}.hooks h WHERE h.run_id = r.run_id
            AND {holds})
        AND (%(chosen)s::text[] IS NULL OR run_id = ANY(%(chosen)s::text[]))
    ORDER BY completed_at, run_id LIMIT %(limit)s""".replace(
    "{holds}", holds_at("%(before)s", "h.")
)
"""Runs `delete_runs` may delete, oldest first, unlocked (each rechecked under its lock)."""

_LOCK_DOOMED = f"""SELECT r.run_id FROM {{s}}.runs r
    WHERE r.run_id = %(run_id)s AND r.completed_at IS NOT NULL AND r.completed_at < %(before)s
        AND r.status = ANY(%(terminal)s::text[])
        AND NOT EXISTS (SELECT FROM {{s}}.hooks h WHERE h.run_id = %(run_id)s
            AND {holds_at("%(before)s", "h.")})
    FOR UPDATE"""
"""The candidate's runs row, locked, if it is still to be deleted."""

_LOCK_UNBORN = (
    "SELECT run_id FROM {s}.runs WHERE run_id = %(run_id)s AND NOT EXISTS "
    "(SELECT FROM {s}.events WHERE run_id = %(run_id)s) FOR UPDATE"
)


async def _drop_run(conn: Connection, s: str, run_id: str) -> None:
    """Delete the rows of `run_id` (its runs row locked by the caller), each statement by key."""
    params = {"run_id": run_id}
    cursor = await conn.execute(
        f"DELETE FROM {s}.hooks WHERE run_id = %(run_id)s RETURNING token", params
    )
    tokens = [row[0] for row in await cursor.fetchall()]
    if tokens:
        await conn.execute(
            f"DELETE FROM {s}.tokens WHERE token = ANY(%(tokens)s) AND run_id = %(run_id)s",
            {"tokens": tokens, "run_id": run_id},
        )
    for table in ("events", "wakeups", "due_holds", "runs"):
        await conn.execute(f"DELETE FROM {s}.{table} WHERE run_id = %(run_id)s", params)


async def delete_runs(conn: Connection, s: str, params: dict[str, Any]) -> int:
    """`delete_runs` on a cluster (`DELETE_RUNS`'s parameters); how many runs it deleted."""
    cursor = await conn.execute(_CANDIDATES.format(s=s), params)
    candidates: Sequence[str] = [row[0] for row in await cursor.fetchall()]
    deleted = 0
    for run_id in candidates:
        async with conn.transaction():
            cursor = await conn.execute(_LOCK_DOOMED.format(s=s), {**params, "run_id": run_id})
            if await cursor.fetchone() is None:
                continue
            await _drop_run(conn, s, run_id)
            deleted += 1
    return deleted


async def drop_unborn_run(conn: Connection, s: str, run_id: str) -> int:
    """`DROP_UNBORN_RUN` on a cluster: drop the index rows of a run without events; its head."""
    async with conn.transaction():
        cursor = await conn.execute(_LOCK_UNBORN.format(s=s), {"run_id": run_id})
        if await cursor.fetchone() is not None:
            await _drop_run(conn, s, run_id)
            return 0
        cursor = await conn.execute(
            f"SELECT coalesce(max(sequence), 0) FROM {s}.events WHERE run_id = %(run_id)s",
            {"run_id": run_id},
        )
        row = await cursor.fetchone()
        return int(row[0]) if row is not None else 0


async def hold_dedup(conn: Connection, s: str, params: dict[str, Any]) -> bool:
    """`hold_dedup` on a cluster (`HOLD_DEDUP`'s parameters): the id's row (on the coordinator)
    locked first, its holder's run (on a worker) read by `run_id` after, in one transaction."""
    async with conn.transaction():
        cursor = await conn.execute(
            f"INSERT INTO {s}.queue_dedups (queue_name, dedup_id, run_id, held_at) "
            "VALUES (%(queue)s, %(dedup)s, %(run)s, %(now)s) "
            "ON CONFLICT (queue_name, dedup_id) DO NOTHING RETURNING true",
            params,
        )
        if await cursor.fetchone() is not None:
            return True
        cursor = await conn.execute(
            f"SELECT run_id, held_at FROM {s}.queue_dedups "
            "WHERE queue_name = %(queue)s AND dedup_id = %(dedup)s FOR UPDATE",
            params,
        )
        row = await cursor.fetchone()
        assert row is not None  # the insert found it, and no statement deletes such rows
        holder, held_at = row
        if holder != params["run"]:
            cursor = await conn.execute(
                f"SELECT completed_at IS NOT NULL FROM {s}.runs WHERE run_id = %s", (holder,)
            )
            run = await cursor.fetchone()
            if (run is not None and not run[0]) or (run is None and held_at > params["grace"]):
                return False  # a live run holds it, or one not yet created within the grace
        await conn.execute(
            f"UPDATE {s}.queue_dedups SET run_id = %(run)s, held_at = %(now)s "
            "WHERE queue_name = %(queue)s AND dedup_id = %(dedup)s",
            params,
        )
        return True
