"""`PostgresStore`: the store deployments scale out on, on psycopg 3 and `psycopg_pool`.

- **Schema**: tables in their own PostgreSQL schema (default `runfold`), created and upgraded by
  `migrate()` (a `schema_version` table, forward-only numbered migrations) under an advisory
  lock, so several processes may start at once. A schema already at this runfold's version is
  only read, so the running application needs no DDL rights. Every table leads with `run_id`
  except `tokens`, the global unique index of hook tokens (see
  `docs/scaling.md`).
- **Append**: one call of the server-side function `append_events` (or, for a single event onto a
  run without hooks or wakeups, one statement that does its part: `_PLAIN_APPEND`): one transaction,
  one round trip. It moves the run's head in `runs` (that row is the run's lock: concurrent appends
  to one run queue on it and all but one find the head moved), inserts the batch, and keeps the
  run's hook and wakeup rows; the `(run_id, sequence)` primary key is the backstop. Refusals come
  back as SQLSTATEs of runfold's own: `RF001` (sequence conflict), `RF002` (token conflict). The
  request travels as one value of the composite type `append_request`, encoded here in PostgreSQL's
  binary format (cheaper than 21 parameters adapted one by one).
- **Group commit**: an append takes a free write slot (`MAX_WRITES` of them); while every slot
  is taken, further appends wait and go together in one transaction, one append per run and
  one write per run in flight, sorted by run id so that batches lock runs in one order. Plain
  appends go through `append_plain_batch`, the others through `append_batch`, each in a
  subtransaction of its own, so each keeps its own all-or-nothing outcome. A write that finds
  a run's head settles the appends queued for that run which expect another head (`_prune`).
- **Feed**: an event's position is its transaction's id × 1,000,000 + its ordinal in that
  transaction, and `read_all` serves only transactions older than the oldest one still running
  (`pg_snapshot_xmin`). Any transaction that can still commit has a higher id, hence higher
  positions, so nothing can appear below a position already served, and writers share no lock.
- **Notifications**: after appends commit the store sends `NOTIFY` from a separate, write-free
  transaction, at most one per `NOTIFY_INTERVAL`; `subscribe` listens, and polls as a fallback.
- **Times** are integer microseconds since the Unix epoch, exact and compared as numbers.
- **Text**: keys use the "C" collation so PostgreSQL orders them as Python does; tokens are
  `bytea` and attributes JSON `text`, because `text` and `jsonb` cannot hold U+0000.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Collection, Coroutine, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Self

import psycopg
from psycopg import AsyncConnection, AsyncCursor
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper
from psycopg.postgres import types as pg_types
from psycopg.pq import Format
from psycopg_pool import AsyncConnectionPool, PoolClosed

from runfold.kernel import (
    TERMINAL_RUN_STATUSES,
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
from runfold.stores import _conninfo
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

__all__ = [
    "NOTIFY_INTERVAL",
    "POSITIONS_PER_TRANSACTION",
    "SCHEMA_VERSION",
    "PostgresStore",
]

Connection = AsyncConnection[tuple[Any, ...]]
Cursor = AsyncCursor[tuple[Any, ...]]
Pool = AsyncConnectionPool[Connection]

POSITIONS_PER_TRANSACTION = 1_000_000
"""Feed positions are `transaction id × POSITIONS_PER_TRANSACTION + ordinal`."""
NOTIFY_INTERVAL = 0.025
"""Seconds between two `NOTIFY`s of one store: appends in between share the next one."""
MAX_WRITES = 2
"""The append transactions a store keeps in flight (fewer if its pool is smaller).

Appends beyond wait for a group commit. Measured against one slot per connection of a pool of
8, in back-to-back runs on a 2-core machine: eight writers on distinct runs made 5–49% more
appends per second with two slots (median 32%, over 5 pairs), 64 writers 63–66% more (2
pairs): larger batches cost less client time and fewer commits per append."""
_BATCH_LIMIT = 64
"""Appends per group commit: each is a subtransaction, and a transaction keeps up to 64
subtransaction ids in shared memory before other sessions' snapshots slow down."""
_RETRIES = 3
"""Attempts for an append refused with serialization_failure (it wrote nothing)."""

# Forward-only: migration N takes a schema at version N-1 to version N (tables, types, indexes).
# Never change what one that shipped leaves behind; add the next. Functions are not migrated:
# `_FUNCTIONS` replaces them with this runfold's definitions whenever a migration runs. `{s}` is
# the quoted schema name.
_MIGRATIONS: tuple[str, ...] = (
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
    -- on each page keeps the update of every append HOT.
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
    # Migration 2 added the function append_plain_batch: functions live in `_FUNCTIONS` now.
    "SELECT 1",
    """
    ALTER TYPE {s}.append_request ADD ATTRIBUTE expected_position bigint;
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)
"""The schema version this runfold writes and reads."""

_FUNCTIONS = """
    -- Writes one append; returns the position before its first event (its events follow at
    -- ordinals p_offset + 1, … of this transaction). Raises RF001 (detail: the true head) when
    -- the head is not r.expected; RF002 (detail: JSON naming the claim's ordinal and its
    -- holder, never the token) when another run holds a claimed token; serialization_failure
    -- when the run's previous append committed with a younger transaction id than this one
    -- (possible only when appending at a head read before that commit): its events would come
    -- first in the feed, and a new transaction, being younger, passes.
    CREATE OR REPLACE FUNCTION {s}.append_events(r {s}.append_request, p_offset integer DEFAULT 0)
    RETURNS bigint LANGUAGE plpgsql AS $fn$
    DECLARE
        v_xact bigint := pg_current_xact_id()::text::bigint * 1000000;
        v_base bigint := v_xact + p_offset;
        v_count integer := cardinality(r.types);
        -- No events (a repair of the index rows alone): the run's last position stays.
        v_position bigint := CASE WHEN v_count > 0 THEN v_base + v_count END;
        v_had_hooks boolean := false;
        v_had_wakeups boolean := false;
        v_head integer;
        v_head_position bigint;
        v_holder record;
    BEGIN
        -- `old` is the row as this statement found it: a commit since then would have moved
        -- the head, and the head check would have failed.
        UPDATE {s}.runs u SET workflow_name = r.workflow_name, status = r.status,
            parent_run_id = r.parent_run_id, created_at = r.created_at,
            updated_at = r.updated_at, completed_at = r.completed_at,
            last_sequence = r.last_sequence, attributes = r.attributes,
            head = r.expected + v_count, head_position = coalesce(v_position, u.head_position),
            has_hooks = cardinality(r.tokens) > 0, has_wakeups = cardinality(r.wakeup_kinds) > 0
        FROM {s}.runs old
        WHERE u.run_id = r.run_id AND old.run_id = r.run_id AND u.head = r.expected
            AND u.head_position = coalesce(r.expected_position, u.head_position)
            AND u.head_position < v_xact + 1000000
        RETURNING old.has_hooks, old.has_wakeups INTO v_had_hooks, v_had_wakeups;
        IF NOT FOUND AND r.expected = 0 THEN
            INSERT INTO {s}.runs (run_id, workflow_name, status, parent_run_id, created_at,
                updated_at, completed_at, last_sequence, attributes, head, head_position,
                has_hooks, has_wakeups)
            VALUES (r.run_id, r.workflow_name, r.status, r.parent_run_id, r.created_at,
                r.updated_at, r.completed_at, r.last_sequence, r.attributes, v_count,
                coalesce(v_position, 0), cardinality(r.tokens) > 0,
                cardinality(r.wakeup_kinds) > 0)
            ON CONFLICT (run_id) DO NOTHING;
        END IF;
        IF NOT FOUND THEN
            SELECT head, head_position INTO v_head, v_head_position
            FROM {s}.runs WHERE run_id = r.run_id;
            -- The head is the one expected but its event is another: the run was deleted and
            -- created again since the caller read it, a conflict (detail: the head).
            IF v_head = r.expected
                    AND v_head_position = coalesce(r.expected_position, v_head_position) THEN
                RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                    MESSAGE = 'runfold: the run moved on in a younger transaction; retry';
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'RF001', MESSAGE = 'runfold: sequence conflict',
                DETAIL = coalesce(v_head, 0)::text;
        END IF;

        INSERT INTO {s}.events (run_id, sequence, type, schema_version, correlation_id,
            payload, recorded_at, position)
        SELECT r.run_id, r.expected + e.n, e.type, e.version, e.correlation_id, e.payload,
            r.recorded_at, v_base + e.n
        FROM unnest(r.types, r.versions, r.correlation_ids, r.payloads)
            WITH ORDINALITY AS e(type, version, correlation_id, payload, n);

        -- Hook claims. The run's rows in `hooks` are replaced; in `tokens` only the claims
        -- that changed are touched, so a run keeping its hooks writes nothing there.
        IF v_had_hooks OR cardinality(r.tokens) > 0 THEN
            WITH old AS (
                DELETE FROM {s}.hooks WHERE run_id = r.run_id
                RETURNING token, hook_id, retained_until
            )
            DELETE FROM {s}.tokens t USING old
            WHERE t.token = old.token AND t.run_id = r.run_id AND NOT EXISTS (
                SELECT FROM unnest(r.tokens, r.hook_ids, r.retained_until) AS c(token, id, until)
                WHERE (c.token, c.id, c.until)
                    IS NOT DISTINCT FROM (old.token, old.hook_id, old.retained_until));
        END IF;
        IF cardinality(r.tokens) > 0 THEN
            -- A holder whose retention has passed is not live: it gives way.
            WITH gone AS (
                DELETE FROM {s}.tokens WHERE token = ANY(r.tokens) AND run_id <> r.run_id
                    AND retained_until <= r.recorded_at
                RETURNING run_id, token
            )
            DELETE FROM {s}.hooks h USING gone
            WHERE h.run_id = gone.run_id AND h.token = gone.token;
            -- DO NOTHING waits for a concurrent claim of the token to commit; the check below
            -- then sees its row.
            INSERT INTO {s}.tokens (token, run_id, hook_id, retained_until)
            SELECT c.token, r.run_id, c.id, c.until
            FROM unnest(r.tokens, r.hook_ids, r.retained_until) AS c(token, id, until)
            ON CONFLICT (token) DO NOTHING;
            SELECT t.run_id, t.hook_id, array_position(r.tokens, t.token) AS claim
            INTO v_holder FROM {s}.tokens t
            WHERE t.token = ANY(r.tokens) AND t.run_id <> r.run_id LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'RF002', MESSAGE = 'runfold: token conflict',
                    DETAIL = json_build_object('claim', v_holder.claim,
                        'run_id', v_holder.run_id, 'hook_id', v_holder.hook_id)::text;
            END IF;
            INSERT INTO {s}.hooks (run_id, token, hook_id, retained_until)
            SELECT r.run_id, c.token, c.id, c.until
            FROM unnest(r.tokens, r.hook_ids, r.retained_until) AS c(token, id, until);
        END IF;

        IF v_had_wakeups THEN
            DELETE FROM {s}.wakeups WHERE run_id = r.run_id;
        END IF;
        IF cardinality(r.wakeup_kinds) > 0 THEN
            INSERT INTO {s}.wakeups (run_id, kind, subject_id, due_at)
            SELECT r.run_id, w.kind, w.subject_id, w.due_at
            FROM unnest(r.wakeup_kinds, r.wakeup_subjects, r.wakeup_due)
                AS w(kind, subject_id, due_at);
        END IF;
        RETURN v_base;
    END
    $fn$;

    -- Several appends in one transaction, each in a subtransaction of its own: one row per
    -- append, in order, with its base position or the SQLSTATE and detail that refused it.
    CREATE OR REPLACE FUNCTION {s}.append_batch(p_requests {s}.append_request[])
    RETURNS TABLE (state text, base bigint, detail text) LANGUAGE plpgsql AS $fn$
    DECLARE
        r {s}.append_request;
        v_offset integer := 0;  -- ordinals taken by the appends written so far
    BEGIN
        FOREACH r IN ARRAY p_requests LOOP
            state := NULL;
            detail := NULL;
            BEGIN
                base := {s}.append_events(r, v_offset);
                v_offset := v_offset + cardinality(r.types);
            EXCEPTION WHEN SQLSTATE 'RF001' OR SQLSTATE 'RF002' OR unique_violation
                    OR serialization_failure THEN
                GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, detail = PG_EXCEPTION_DETAIL;
                base := NULL;
            END;
            RETURN NEXT;
        END LOOP;
    END
    $fn$;

    -- The global feed after p_after: only transactions older than the oldest one still
    -- running, since any that can still commit has a higher id, hence higher positions. It
    -- first waits (up to p_wait_ms) for the transactions running when it was called, so that
    -- what committed before the call is included unless an older transaction stays open.
    CREATE OR REPLACE FUNCTION {s}.read_feed(p_after bigint, p_limit integer, p_wait_ms integer)
    RETURNS SETOF {s}.events LANGUAGE plpgsql AS $fn$
    DECLARE
        v_called xid8 := pg_snapshot_xmax(pg_current_snapshot());
        v_until timestamptz := clock_timestamp() + p_wait_ms * interval '1 millisecond';
    BEGIN
        WHILE pg_snapshot_xmin(pg_current_snapshot()) < v_called
                AND clock_timestamp() < v_until LOOP
            PERFORM pg_sleep(0.001);
        END LOOP;
        RETURN QUERY SELECT * FROM {s}.events e WHERE e.position > p_after
            AND e.position < pg_snapshot_xmin(pg_current_snapshot())::text::bigint * 1000000
            ORDER BY e.position LIMIT p_limit;
    END
    $fn$;

    -- A group commit of appends onto runs that keep no hook claims and no wakeups, each to
    -- another run: what `append_events` does for them, without the upkeep of hooks and
    -- wakeups, or a subtransaction per append (none raises here). One row per
    -- append, in order: its base position or, where it wrote nothing, -1 - the run's head
    -- (0 for no run), as the single statement of one such append returns it.
    CREATE OR REPLACE FUNCTION {s}.append_plain_batch(p_requests {s}.append_request[])
    RETURNS SETOF bigint LANGUAGE plpgsql AS $fn$
    DECLARE
        v_xact bigint := pg_current_xact_id()::text::bigint * 1000000;
        v_ordinal integer := 0;  -- ordinals taken by the appends written so far
        v_count integer;
        v_head integer;
        r {s}.append_request;
    BEGIN
        FOREACH r IN ARRAY p_requests LOOP
            v_count := cardinality(r.types);
            UPDATE {s}.runs SET status = r.status, updated_at = r.updated_at,
                completed_at = r.completed_at, last_sequence = r.last_sequence,
                attributes = r.attributes, head = r.expected + v_count,
                head_position = v_xact + v_ordinal + v_count
            WHERE run_id = r.run_id AND head = r.expected AND NOT has_hooks
                AND NOT has_wakeups AND head_position < v_xact + 1000000
                AND head_position = coalesce(r.expected_position, head_position);
            IF FOUND THEN
                INSERT INTO {s}.events (run_id, sequence, type, schema_version,
                    correlation_id, payload, recorded_at, position)
                SELECT r.run_id, r.expected + e.n, e.type, e.version, e.correlation_id,
                    e.payload, r.recorded_at, v_xact + v_ordinal + e.n
                FROM unnest(r.types, r.versions, r.correlation_ids, r.payloads)
                    WITH ORDINALITY AS e(type, version, correlation_id, payload, n);
                RETURN NEXT v_xact + v_ordinal;
                v_ordinal := v_ordinal + v_count;
            ELSE
                SELECT head INTO v_head FROM {s}.runs WHERE run_id = r.run_id;
                RETURN NEXT -1 - coalesce(v_head, 0);
            END IF;
        END LOOP;
    END
    $fn$;
"""
"""The server-side functions, as this runfold calls them: (re)created in the transaction of
every migration, so that each is written once, here, and a schema at any version ends with the
current definitions."""

_DEFAULT_LIMITS = Limits()
_EVENT_COLUMNS = "sequence, type, schema_version, payload, recorded_at, position"
"""An event row's columns (`envelopes_from_rows`); the feed's rows lead with the run id."""


# --- the wire: values in PostgreSQL's binary format ---------------------------------------------


class _Wire(bytes):
    """A value already in PostgreSQL's binary format; subclasses name its type (`oid`)."""

    oid: ClassVar[int]


class _WireDumper(Dumper):
    """Passes a `_Wire` value through as it is, typed as its class says."""

    format = Format.BINARY

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        assert issubclass(cls, _Wire)
        self.oid = cls.oid

    def dump(self, obj: Any) -> Buffer:
        return memoryview(obj)


_TEXT, _BYTEA, _INT4, _INT8 = (pg_types[name].oid for name in ("text", "bytea", "int4", "int8"))
_ARRAY = {
    pg_types[name].oid: pg_types[name].array_oid for name in ("text", "bytea", "int4", "int8")
}
_I4 = struct.Struct(">i")
_I8 = struct.Struct(">q")
_I8_MAX = 2**63 - 1
_HEADER = struct.Struct(">iiIii")  # dimensions, has NULLs, element type, length, lower bound
_EMPTY = struct.Struct(">iiI")  # no dimensions, no NULLs, element type
_FIELD = struct.Struct(">Ii")  # type, length (-1: NULL)
_NULL = _I4.pack(-1)
_I4_MAX = 2**31 - 1


def _array(element_oid: int, elements: Sequence[bytes | None]) -> bytes:
    """A one-dimensional array of `elements`, each in its type's binary form (None: NULL)."""
    if not elements:
        return _EMPTY.pack(0, 0, element_oid)
    parts = [_HEADER.pack(1, None in elements, element_oid, len(elements), 1)]
    for element in elements:
        if element is None:
            parts.append(_NULL)
        else:
            parts += (_I4.pack(len(element)), element)
    return b"".join(parts)


def _array_field(element_oid: int, elements: Sequence[bytes | None]) -> tuple[int, bytes]:
    """An array as a field of a composite: (its array type, its binary form)."""
    return _ARRAY[element_oid], _array(element_oid, elements)


def _record(fields: Sequence[tuple[int, bytes | None]]) -> bytes:
    """A composite value of `fields`: (type, binary form or None for NULL) in column order."""
    parts = [_I4.pack(len(fields))]
    for oid, data in fields:
        if data is None:
            parts.append(_FIELD.pack(oid, -1))
        else:
            parts += (_FIELD.pack(oid, len(data)), data)
    return b"".join(parts)


def _utf8(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _i8(value: datetime | None) -> bytes | None:
    return None if value is None else _I8.pack(time_key(value))


def _claims_fields(claims: Sequence[HookClaim]) -> tuple[tuple[int, bytes], ...]:
    """`append_request`'s tokens, hook_ids and retained_until."""
    return (
        _array_field(_BYTEA, [c.token.encode() for c in claims]),
        _array_field(_TEXT, [c.hook_id.encode() for c in claims]),
        _array_field(_INT8, [_i8(c.retained_until) for c in claims]),
    )


def _wakeups_fields(wakeups: Sequence[Wakeup]) -> tuple[tuple[int, bytes], ...]:
    """`append_request`'s wakeup_kinds, wakeup_subjects and wakeup_due."""
    return (
        _array_field(_TEXT, [w.kind.encode() for w in wakeups]),
        _array_field(_TEXT, [w.subject_id.encode() for w in wakeups]),
        _array_field(_INT8, [_i8(w.due_at) for w in wakeups]),
    )


_NO_CLAIMS = _claims_fields(())
_NO_WAKEUPS = _wakeups_fields(())


# --- one append ---------------------------------------------------------------------------------


class _Append:
    """One append as an `append_request`, encoded before any SQL runs (a bad event fails
    without a round trip), and the future its caller awaits when it goes in a group commit."""

    __slots__ = (
        "attributes",
        "claims",
        "count",
        "encoded",
        "events",
        "expected",
        "expected_position",
        "future",
        "index",
        "recorded_at",
        "run_id",
        "ticket",
    )

    def __init__(
        self,
        run_id: str,
        expected: int,
        events: Sequence[Event],
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None = None,
    ) -> None:
        self.run_id = run_id
        self.expected = expected
        # Positions are positive bigints: one out of that range is no event's, and -1 conflicts
        # as that value would.
        if expected <= 0 or expected_position is None:
            self.expected_position: int | None = None
        else:
            self.expected_position = expected_position if 0 < expected_position < _I8_MAX else -1
        self.events = events
        self.count = len(events)
        self.index = index
        self.recorded_at = recorded_at
        self.future: asyncio.Future[int] | None = None
        self.ticket = -1  # its place among the appends queued, once queued
        self.claims = index.claims_at(recorded_at)
        self.encoded = [encode_event(event) for event in events]
        attributes = index.summary.attributes
        self.attributes = json.dumps(dict(attributes), sort_keys=True) if attributes else "{}"

    @property
    def plain(self) -> bool:
        """Events onto an existing run that keeps no hook claims and no wakeups, which
        `append_plain_batch` may write in a group commit."""
        return (
            0 < self.expected <= _I4_MAX - self.count  # the new head is an integer column too
            and not self.claims
            and not self.index.wakeups
        )

    @property
    def single(self) -> bool:
        """A plain append of one event, which `_PLAIN_APPEND` may write alone
        (`plain_parameters`)."""
        return self.count == 1 and self.plain

    def plain_parameters(self) -> dict[str, Any]:
        """The parameters of `_PLAIN_APPEND`."""
        summary = self.index.summary
        ((event_type, version, payload),) = self.encoded
        completed_at = summary.completed_at
        return {
            "status": summary.status,
            "updated_at": time_key(summary.updated_at),
            "completed_at": None if completed_at is None else time_key(completed_at),
            "last_sequence": summary.last_sequence,
            "attributes": self.attributes,
            "expected": self.expected,
            "expected_position": self.expected_position,
            "run_id": self.run_id,
            "type": event_type,
            "version": version,
            "correlation_id": correlation_id(self.events[0]),
            "payload": payload,
            "recorded_at": time_key(self.recorded_at),
        }

    def wire(self) -> bytes:
        """The binary `append_request`."""
        encoded, summary, index = self.encoded, self.index.summary, self.index
        expected = self.expected
        return _record(
            (
                (_TEXT, self.run_id.encode()),
                # A head is never negative, nor past what its column holds once the events are
                # added: out of that range, -1 conflicts as the value would.
                (_INT4, _I4.pack(expected if 0 <= expected <= _I4_MAX - self.count else -1)),
                _array_field(_TEXT, [event_type.encode() for event_type, _, _ in encoded]),
                _array_field(_INT4, [_I4.pack(version) for _, version, _ in encoded]),
                _array_field(_TEXT, [_utf8(correlation_id(event)) for event in self.events]),
                _array_field(_BYTEA, [payload for _, _, payload in encoded]),
                (_INT8, _i8(self.recorded_at)),
                (_TEXT, summary.workflow_name.encode()),
                (_TEXT, summary.status.encode()),
                (_TEXT, _utf8(summary.parent_run_id)),
                (_INT8, _i8(summary.created_at)),
                (_INT8, _i8(summary.updated_at)),
                (_INT8, _i8(summary.completed_at)),
                (_INT4, _I4.pack(summary.last_sequence)),
                (_TEXT, self.attributes.encode()),
                *(_claims_fields(self.claims) if self.claims else _NO_CLAIMS),
                *(_wakeups_fields(index.wakeups) if index.wakeups else _NO_WAKEUPS),
                (_INT8, None if (p := self.expected_position) is None else _I8.pack(p)),
            )
        )

    def settle(self, outcome: int | BaseException) -> None:
        """Hand the outcome to the caller waiting on this append's future."""
        assert self.future is not None
        if not self.future.done():
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)


_PLAIN_APPEND = """
WITH moved AS (
    UPDATE {s}.runs SET status = %(status)s, updated_at = %(updated_at)s,
        completed_at = %(completed_at)s, last_sequence = %(last_sequence)s,
        attributes = %(attributes)s, head = %(expected)s + 1,
        head_position = pg_current_xact_id()::text::bigint * 1000000 + 1
    WHERE run_id = %(run_id)s AND head = %(expected)s AND NOT has_hooks AND NOT has_wakeups
        AND head_position < (pg_current_xact_id()::text::bigint + 1) * 1000000
        AND head_position = coalesce(%(expected_position)s::bigint, head_position)
    RETURNING run_id, head_position
), written AS (
    INSERT INTO {s}.events (run_id, sequence, type, schema_version, correlation_id, payload,
        recorded_at, position)
    SELECT run_id, %(expected)s::integer + 1, %(type)s, %(version)s, %(correlation_id)s,
        %(payload)s, %(recorded_at)s, head_position
    FROM moved
)
-- The run's head (as the statement's snapshot saw it) is looked up only when nothing was written.
SELECT coalesce((SELECT head_position - 1 FROM moved),
    -1 - coalesce((SELECT head FROM {s}.runs WHERE run_id = %(run_id)s), 0))
"""
"""A plain append of one event (`_Append.single`) in one statement with scalar parameters.

It writes what `append_events` would (the same head and feed-order checks, on a run that had no
hooks and no wakeups either) without the plpgsql call, the arrays and the upkeep of hooks and
wakeups: measured from Python with synchronous_commit off, an append took 115–120 µs this way
and 140–150 µs through the function. It returns the base position (never negative) or, where it
writes nothing, `-1 - head` for the head its snapshot saw: another head is a `SequenceConflict`;
the expected one leaves `append_events` to say why (a commit since the snapshot, hook or wakeup
rows to clear, a feed-order retry).

`append_plain_batch` (migration 2) is the same write for a group commit. A lone append stays a
statement: through the function it took 5–10% longer (measured with synchronous_commit on and
off).
"""


def _plain_outcome(expected: int, outcome: int) -> tuple[str | None, int | None, str | None]:
    """An `append_plain_batch` row as `append_batch` would give it: (state, base, detail).

    Where the function could not say why it wrote nothing, the state is serialization_failure:
    the append is then written alone, as any append refused that way.
    """
    if outcome >= 0:
        return None, outcome, None
    head = -1 - outcome
    return ("RF001", None, str(head)) if head != expected else ("40001", None, None)


def _quote(identifier: str) -> str:
    """`identifier` as a quoted PostgreSQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'


def _channel(schema: str) -> str:
    """The `NOTIFY` channel of a schema's store (identifiers stop at 63 bytes)."""
    return f"runfold_{schema}".encode()[:63].decode(errors="ignore")


class PostgresStore(WakeupReads):
    """An `EventStore` in a PostgreSQL schema, opened with `await PostgresStore.open(dsn)`."""

    def __init__(self, pool: Pool, schema: str, *, owns_pool: bool, feed_wait: float) -> None:
        """Use `PostgresStore.open`; this wraps a pool it has already opened."""
        self._pool = pool
        self._feed_wait = feed_wait
        self._schema = schema
        self._owns_pool = owns_pool
        self._closed = False
        self.migrated_from: int | None = None
        """The schema version this store found and migrated from (0: it created the schema), or
        None while it has migrated nothing (the schema was current)."""
        # Each pooled connection that has sent appends, with the cursor its appends reuse (a new
        # cursor per statement cost about a sixth of an append's client time).
        self._cursors: dict[Connection, Cursor] = {}
        # Group commit: `_writing` transactions are in flight; appends arriving meanwhile wait
        # in `_queue` and go together in the next one.
        self._writing = 0
        self._max_writes = min(MAX_WRITES, pool.max_size)
        self._queue: list[_Append] = []
        self._tickets = 0  # appends queued so far: see `_prune`
        self._in_flight: set[str] = set()  # the runs being written: see `_drain`
        self._drain_scheduled = False
        # Set while appends arrive together: each then waits a loop round for the others to
        # queue, so that they share a transaction instead of one going ahead alone.
        self._contended = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._unannounced = False  # appends committed since the last NOTIFY
        self._announcing = False
        self._checking = False
        self._closing = asyncio.Event()
        self._held: list[Connection] = []  # see `_putconn`
        self._tasks: set[asyncio.Task[None]] = set()  # see `_background`
        self._listeners: set[Connection] = set()
        self._channel = _channel(schema)
        s = self._s = _quote(schema)
        self._append_sql = f"SELECT {s}.append_events(%b)"
        self._plain_sql = _PLAIN_APPEND.format(s=s)
        self._batch_sql = f"SELECT state, base, detail FROM {s}.append_batch(%b)"
        self._plain_batch_sql = f"SELECT * FROM {s}.append_plain_batch(%b)"
        # The types of `append_request` values and arrays, once the schema is known.
        self._request: type[_Wire] = _Wire
        self._requests: type[_Wire] = _Wire

    @classmethod
    async def open(
        cls,
        dsn: str | None = None,
        *,
        pool: Pool | None = None,
        schema: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        timeout: float = 10.0,
        feed_wait: float = 0.1,
        migrate: bool = True,
    ) -> PostgresStore:
        """Open the store in `schema` of the database `dsn` names, or on an existing `pool`.

        An existing pool's connections must be in autocommit mode; the store leaves it open on
        close.
        Without `schema`, a `schema` query parameter of a URL `dsn` names it
        (`postgresql://host/db?schema=tenant_a`), else it is `runfold`.

        `pool_min`/`pool_max` size the pool the store creates; `timeout` is how long a call
        (and `open` itself) waits for a connection before `StoreUnavailable`. `read_all` serves
        only events of transactions older than every one still running, anywhere on the server;
        it waits up to `feed_wait` seconds for those running when it is called, so that it
        returns what committed before the call unless an older transaction stays open. With
        `migrate` (the default) the schema is created or upgraded first (see `migrate`); without
        it, a schema that is missing or older is refused, so an application without DDL rights
        can run on a schema migrated beforehand.

        Raises `StoreOpenError` for a schema written by a newer runfold, a schema that is not
        runfold's, or (without `migrate`) one that needs migrating; `StoreUnavailable` when no
        connection can be made within `timeout`; `ValueError` for bad arguments, a connection
        string libpq cannot parse among them. No message names the password, however it was
        given (URL, `?password=`, a `password=` keyword, `PGPASSWORD`).
        """
        if (dsn is None) == (pool is None):
            raise ValueError("PostgresStore.open needs a dsn or a pool (one of them)")
        if dsn is not None:
            dsn, named = _conninfo.split_schema(dsn)
            schema = schema or named
            _conninfo.check(dsn)  # a malformed string fails here, its password withheld
        schema = schema or "runfold"
        if pool is not None:
            store = cls(pool, schema, owns_pool=False, feed_wait=feed_wait)
            try:
                async with store._connection() as conn:
                    await store._prepare_schema(conn, migrate)
            except BaseException:
                await store.close()
                raise
            return store
        # A connection of its own for the schema work, made before the pool: a server that is
        # down or refuses the login fails here at once, with its reason, where the pool would
        # retry until `timeout` (and log a warning of its own for each try).
        try:
            probe = await AsyncConnection.connect(
                dsn or "", autocommit=True, connect_timeout=max(2, round(timeout))
            )
        except psycopg.Error as exc:
            refusal: str | None = _conninfo.scrub(str(exc), dsn or "")
        else:
            refusal = None
        if refusal is not None:  # raised out here: the driver's error is not kept as context
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {refusal}")
        async with probe:
            pool = AsyncConnectionPool(
                dsn or "",
                min_size=pool_min,
                max_size=pool_max,
                kwargs={"autocommit": True},
                timeout=timeout,
                open=False,
                name=f"runfold-{schema}",
            )
            store = cls(pool, schema, owns_pool=True, feed_wait=feed_wait)
            try:
                await pool.open(wait=False)  # its connections are made in the background meanwhile
                await store._prepare_schema(probe, migrate)
            except BaseException:
                await store.close()
                raise
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
        self._closing.set()  # the last NOTIFY goes now
        for listener in list(self._listeners):
            await listener.close()  # subscribers wake, and find the store closed
        while self._held:
            await self._pool.putconn(self._held.pop())
        while self._tasks:
            await asyncio.gather(*self._tasks)
        if self._owns_pool:
            await self._pool.close()

    # --- connections and errors ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"the PostgreSQL store (schema {self._schema!r}) is closed")

    async def _getconn(self) -> Connection:
        """A pooled autocommit connection that can send `append_request`s; give it back with
        `_putconn`. Driver errors pass through. (No closed check: while closing, appends
        already accepted still go.)"""
        if self._held:
            conn = self._held.pop()
        else:
            conn = await self._pool.getconn()
        if conn not in self._cursors:
            if not conn.autocommit:
                await self._pool.putconn(conn)
                raise ValueError("the pool's connections must be in autocommit mode")
            for cls in (self._request, self._requests):
                conn.adapters.register_dumper(cls, _WireDumper)
            # The pool replaced any connection it closed: forget those.
            self._cursors = {c: k for c, k in self._cursors.items() if not c.closed}
            self._cursors[conn] = conn.cursor()  # after the dumpers: a cursor copies them
        return conn

    async def _putconn(self, conn: Connection) -> None:
        """Give back a connection from `_getconn`. The store keeps it until the event loop's
        next round for a call that comes straight after (a writer's next append, say): a trip
        through the pool costs about a tenth of a single append's own client time."""
        if not self._closed and not conn.broken:
            self._held.append(conn)
            asyncio.get_running_loop().call_soon(self._release_held, conn)
        else:
            await self._pool.putconn(conn)

    def _release_held(self, conn: Connection) -> None:
        if conn in self._held:  # nobody took it in the meantime
            self._held.remove(conn)
            self._background(self._pool.putconn(conn))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as a task the store keeps a reference to (and `close` waits for)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        """`_getconn` as a context that turns driver errors into runfold errors (for the
        schema work; the hot paths give connections back by hand and map errors their way)."""
        try:
            conn = await self._getconn()
            try:
                yield conn
            finally:
                await self._putconn(conn)
        except psycopg.Error as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: psycopg.Error) -> Exception:
        """The runfold error for a driver error."""
        if self._closed or isinstance(exc, PoolClosed):
            return StoreClosed(f"the PostgreSQL store (schema {self._schema!r}) is closed")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            self._recover()
            return StoreUnavailable(f"PostgreSQL: {exc}")
        if isinstance(exc, psycopg.DataError):  # e.g. U+0000 in a text value
            return ValueError(f"PostgreSQL cannot take this value: {exc}")
        return StoreError(f"PostgreSQL: {exc}")

    def _recover(self) -> None:
        """After an operational error, test the idle connections in the background, so a
        server restart costs the callers one error each at most, not one per dead connection."""
        if not self._checking:
            self._checking = True
            self._background(self._check_pool())

    async def _check_pool(self) -> None:
        try:
            with contextlib.suppress(psycopg.Error):  # the pool retries by itself meanwhile
                await self._pool.check()
        finally:
            self._checking = False

    async def _fetch(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        self._check_open()
        try:
            conn = await self._getconn()
            try:
                cursor = await conn.execute(query, params, binary=True)
                return await cursor.fetchall()
            finally:
                await self._putconn(conn)
        except psycopg.DataError as exc:
            if exc.sqlstate is None:
                # psycopg refused U+0000 in a text key before sending it: no stored key can
                # hold one, so nothing matches (as an unknown run reads empty elsewhere).
                return []
            raise self._translate(exc) from exc
        except psycopg.Error as exc:
            raise self._translate(exc) from exc

    # --- schema -------------------------------------------------------------------------------

    async def migrate(self) -> None:
        """Create or upgrade the store's schema to this runfold's `SCHEMA_VERSION`.

        Idempotent, and safe when many processes run it at once: they queue on an advisory
        lock and find the work done. A schema already current is only read (no lock, no DDL).
        Raises `StoreOpenError` for a schema written by a newer runfold or one that is not
        runfold's; `StoreUnavailable` if the database cannot be reached.
        """
        self._check_open()
        async with self._connection() as conn:
            await self._prepare_schema(conn, migrate=True)

    async def _prepare_schema(self, conn: Connection, migrate: bool) -> None:
        """Check the schema's version on `conn`, migrating it first if `migrate`; learn the
        type of `append_request`."""
        try:
            version = await self._version(conn)
            self._refuse_newer(version)
            if version != SCHEMA_VERSION:
                if not migrate:
                    found = (
                        "holds no runfold store"
                        if version == 0
                        else f"is at version {version}, this runfold needs {SCHEMA_VERSION}"
                    )
                    raise StoreOpenError(
                        f"schema {self._schema!r} {found}: migrate it first "
                        "(`runfold migrate`, or `await store.migrate()`)"
                    )
                # A session lock, so that the migration runs in a transaction begun after it:
                # one begun before would keep catalog caches from before the previous
                # holder's commit, and not see the schema it made.
                lock = (f"runfold migrate {self._schema}",)
                await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", lock)
                try:
                    async with conn.transaction():
                        await self._migrate_locked(conn)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", lock)
            cursor = await conn.execute(
                "SELECT oid, typarray FROM pg_type WHERE oid = to_regtype(%s)",
                (f"{self._s}.append_request",),
            )
            row = await cursor.fetchone()
            assert row is not None
            if getattr(self._request, "oid", None) != row[0]:  # new, or the schema was remade
                self._request = type("_Request", (_Wire,), {"oid": row[0]})
                self._requests = type("_Requests", (_Wire,), {"oid": row[1]})
                self._cursors = {}  # connections learn the new types
        except psycopg.Error as exc:
            raise self._translate(exc) from exc

    async def _migrate_locked(self, conn: Connection) -> None:
        """Apply the missing migrations; the caller holds the migration lock."""
        s = self._s
        version = await self._version(conn)  # another process may have migrated meanwhile
        self._refuse_newer(version)
        if version == 0:
            await self._refuse_foreign(conn)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            await conn.execute(
                f"CREATE TABLE {s}.schema_version (version integer PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
        if version < SCHEMA_VERSION:
            self.migrated_from = version
        for number in range(version + 1, SCHEMA_VERSION + 1):
            await conn.execute(_MIGRATIONS[number - 1].format(s=s))
            await conn.execute(f"INSERT INTO {s}.schema_version (version) VALUES (%s)", (number,))
        await conn.execute(_FUNCTIONS.format(s=s))

    async def _version(self, conn: Connection) -> int:
        """The schema's version; 0 when it has no `schema_version` table."""
        cursor = await conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{self._s}.schema_version",)
        )
        row = await cursor.fetchone()
        if row is None or not row[0]:
            return 0
        cursor = await conn.execute(
            f"SELECT coalesce(max(version), 0) FROM {self._s}.schema_version"
        )
        row = await cursor.fetchone()
        return int(row[0]) if row is not None else 0

    async def _refuse_foreign(self, conn: Connection) -> None:
        """`StoreOpenError` if the schema holds tables but is not a runfold schema."""
        cursor = await conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s",
            (self._schema,),
        )
        row = await cursor.fetchone()
        if row is not None and row[0]:
            raise StoreOpenError(
                f"schema {self._schema!r} holds tables but no runfold schema_version: "
                "it is not a runfold schema"
            )

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreOpenError(
                f"schema {self._schema!r} has version {version}, written by a newer runfold; "
                f"this one knows up to {SCHEMA_VERSION}"
            )

    # --- append -------------------------------------------------------------------------------

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

        `EventStore.append_if_sequence`, with its errors. One round trip while a pool
        connection is free; appends made while every one is writing are written together, each
        with its own outcome.
        """
        check_append(run_id, events, index)
        if len(events) >= POSITIONS_PER_TRANSACTION:
            raise ValueError(f"at most {POSITIONS_PER_TRANSACTION - 1:,} events per append")
        request = _Append(run_id, expected_sequence, events, index, recorded_at, expected_position)
        self._check_open()
        if (
            self._writing < self._max_writes
            and not self._queue
            and not self._contended
            and run_id not in self._in_flight
        ):  # a free write slot, and no sign of company: write it now
            self._start_write([request])
            try:
                base = await self._append_one(request)
            finally:
                self._written([request])
        else:  # join a group commit
            request.future = asyncio.get_running_loop().create_future()
            request.ticket = self._tickets
            self._tickets += 1
            self._queue.append(request)
            self._schedule_drain()
            base = await request.future  # cancelled, the caller leaves; the batch goes on
        self._announce()
        return [
            make_envelope(run_id, expected_sequence + n, event, recorded_at, base + n)
            for n, event in enumerate(events, start=1)
        ]

    def _schedule_drain(self) -> None:
        """Run `_drain` soon: after the callers woken together with this one have queued."""
        if not self._drain_scheduled:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        """Start group commits of the queued appends in the free write slots, shared out evenly
        (the server writes them side by side).

        A run has one write in flight at most, and a batch one append per run: appends queued
        for one run mostly expect the same head, so all but one are bound to conflict, and
        `_prune` settles those without a round trip once that one is written. Sorted by run id
        (stable: one run's appends keep their order), so that batches lock runs in one order
        and cannot deadlock."""
        self._drain_scheduled = False
        self._contended = len(self._queue) > 1
        self._queue.sort(key=lambda r: r.run_id)
        while self._writing < self._max_writes:
            ready = len({r.run_id for r in self._queue} - self._in_flight)
            if not ready:
                return
            share = min(-(-ready // (self._max_writes - self._writing)), _BATCH_LIMIT)
            batch: list[_Append] = []
            rest: list[_Append] = []
            events = 0
            for request in self._queue:
                if (
                    len(batch) < share
                    and request.run_id not in self._in_flight
                    and (not batch or batch[-1].run_id != request.run_id)
                    and (not batch or events + request.count < POSITIONS_PER_TRANSACTION)
                ):
                    batch.append(request)
                    events += request.count
                else:
                    rest.append(request)
            self._queue = rest
            self._start_write(batch)
            self._background(self._write_batch(batch))

    def _start_write(self, batch: list[_Append]) -> None:
        self._writing += 1
        self._idle.clear()
        self._in_flight.update(request.run_id for request in batch)

    async def _write_batch(self, batch: list[_Append]) -> None:
        try:
            await self._append_many(batch)
        except Exception as exc:  # nobody may wait forever
            for request in batch:
                request.settle(exc)
        except BaseException as exc:
            for request in batch:
                request.settle(StoreUnavailable(f"append abandoned: {exc!r}"))
            raise
        finally:
            self._written(batch)

    def _written(self, batch: list[_Append]) -> None:
        """A write ended: start the next group commit, or note that the store is idle."""
        self._writing -= 1
        self._in_flight.difference_update(request.run_id for request in batch)
        if self._queue:
            self._schedule_drain()
        elif self._writing == 0:
            self._idle.set()

    async def _append_one(self, request: _Append) -> int:
        """Write one append in a transaction of its own; its base position."""
        sent_before = self._tickets
        try:
            base = await self._write_one(request)
        except SequenceConflict as conflict:
            self._prune({request.run_id: conflict.actual}, sent_before)
            raise
        self._prune({request.run_id: request.expected + request.count}, sent_before)
        return base

    async def _write_one(self, request: _Append) -> int:
        for attempt in range(1, _RETRIES + 1):
            try:
                conn = await self._getconn()
                try:
                    cursor = self._cursors[conn]
                    if request.single:
                        await cursor.execute(self._plain_sql, request.plain_parameters())
                        row = await cursor.fetchone()
                        assert row is not None
                        state, _, detail = _plain_outcome(request.expected, row[0])
                        if state is None:
                            return int(row[0])
                        refusal = await self._refusal(request, state, detail)
                        if refusal is not None:
                            raise refusal
                    # Not single, or the statement could not say why it wrote nothing.
                    await cursor.execute(self._append_sql, (self._request(request.wire()),))
                    row = await cursor.fetchone()
                finally:
                    await self._putconn(conn)
                assert row is not None
                return int(row[0])
            except psycopg.Error as exc:
                if exc.sqlstate == "40001" and attempt < _RETRIES:
                    continue  # refused before writing anything: a younger transaction passes
                refusal = await self._refusal(request, exc.sqlstate, exc.diag.message_detail)
                if refusal is not None:
                    raise refusal from None
                raise self._translate(exc) from exc
        raise AssertionError("unreachable")

    async def _append_many(self, batch: list[_Append]) -> None:
        """Write `batch` in one transaction and settle each append's future."""
        if len(batch) == 1:
            await self._settle_alone(batch[0])
            return
        sent_before = self._tickets
        requests = self._requests(_array(self._request.oid, [r.wire() for r in batch]))
        plain = all(r.plain for r in batch)  # a batch's runs are distinct (`_drain`)
        rows: Sequence[tuple[Any, ...]]  # (state, base, detail) per append, as `append_batch`
        conn: Connection | None = None
        try:
            conn = await self._getconn()
            try:
                cursor = self._cursors[conn]
                if plain:
                    await cursor.execute(self._plain_batch_sql, (requests,))
                    rows = [
                        _plain_outcome(r.expected, o)
                        for r, (o,) in zip(batch, await cursor.fetchall(), strict=True)
                    ]
                else:
                    await cursor.execute(self._batch_sql, (requests,))
                    rows = await cursor.fetchall()
            finally:
                await self._putconn(conn)
        except psycopg.Error as exc:
            if conn is None or conn.broken or exc.sqlstate is None:
                # No connection, or it failed (lost, its backend killed): whether the batch
                # committed is unknown, so nothing is retried.
                for request in batch:
                    request.settle(self._translate(exc))
                return
            # The server refused the whole transaction (a deadlock, say): nothing was written,
            # so each append alone gets its own outcome.
            for request in batch:
                await self._settle_alone(request)
            return
        heads: dict[str, int] = {}
        alone: list[_Append] = []
        for request, (state, base, detail) in zip(batch, rows, strict=True):
            if state is None:
                request.settle(int(base))
                heads[request.run_id] = request.expected + request.count
            elif state == "40001":
                alone.append(request)
            else:
                refusal = await self._refusal(request, state, detail)
                assert refusal is not None  # append_batch only catches the refusals
                request.settle(refusal)
                if isinstance(refusal, SequenceConflict):
                    heads[request.run_id] = refusal.actual
        self._prune(heads, sent_before)
        for request in alone:
            await self._settle_alone(request)

    def _prune(self, heads: dict[str, int], sent_before: int) -> None:
        """Settle the queued appends that a write just found doomed: those to a run in `heads`
        (a head the run had while the write ran: the one it left, or the one it conflicted
        with) that expect another head, and were queued before the write was sent (`ticket <
        sent_before`), hence were waiting at that moment. Each conflicts there, with that head,
        and no round trip is spent to learn it."""
        if not heads or not self._queue:
            return
        waiting = []
        for request in self._queue:
            head = heads.get(request.run_id)
            if head is None or head == request.expected or request.ticket >= sent_before:
                waiting.append(request)
            else:
                request.settle(SequenceConflict(request.run_id, request.expected, head))
        self._queue = waiting

    async def _settle_alone(self, request: _Append) -> None:
        try:
            request.settle(await self._append_one(request))
        except Exception as exc:
            request.settle(exc)

    async def _refusal(
        self, request: _Append, sqlstate: str | None, detail: str | None
    ) -> Exception | None:
        """The runfold error for an append refused with `sqlstate`, or None if not a refusal."""
        if sqlstate == "RF001":
            return SequenceConflict(request.run_id, request.expected, int(detail or 0))
        if sqlstate == "RF002":
            holder = json.loads(detail or "{}")
            token = request.claims[holder["claim"] - 1].token
            return TokenConflict(token, holder["run_id"], holder["hook_id"])
        if sqlstate == "23505":  # the primary key backstop
            return SequenceConflict(
                request.run_id, request.expected, await self.head(request.run_id)
            )
        return None

    def _announce(self) -> None:
        """Wake subscribers: `NOTIFY` soon after appends commit, in the background.

        Not inside `append_events`: a notifying transaction holds a database-wide lock from
        before its commit until its commit is flushed, so concurrent writers would flush one by
        one (measured: 8 writers fell to a quarter of the raw insert rate). Here it is a
        transaction without writes, at most one per `NOTIFY_INTERVAL` per store.
        """
        self._unannounced = True
        if not self._announcing:
            self._announcing = True
            self._background(self._announce_pending())

    async def _announce_pending(self) -> None:
        try:
            while self._unannounced:
                self._unannounced = False
                with contextlib.suppress(psycopg.Error):  # best effort: subscribers also poll
                    async with self._pool.connection() as conn:
                        await conn.execute("SELECT pg_notify(%s, '')", (self._channel,))
                with contextlib.suppress(TimeoutError):  # closing cuts the pause short
                    await asyncio.wait_for(self._closing.wait(), NOTIFY_INTERVAL)
        finally:
            self._announcing = False

    # --- reads --------------------------------------------------------------------------------

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """The run's envelopes after `after`, at most `limit` (`EventStore.read`)."""
        return await self._read(run_id, None, after, limit, descending)

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
        return await self._read(run_id, correlation_id, after, limit, descending)

    async def replay(self, run_id: str, *, limits: Limits = _DEFAULT_LIMITS) -> ReplayedRun | None:
        """The run's snapshot folded as its rows are read (`Replayer.replay`)."""
        rows = await self._read_rows(run_id, None, 0, None, False)
        return replay_rows(rows, run_id, limits)

    async def _read(
        self,
        run_id: str,
        correlation: str | None,
        after: int,
        limit: int | None,
        descending: bool,
    ) -> list[Envelope]:
        rows = await self._read_rows(run_id, correlation, after, limit, descending)
        return envelopes_from_rows(rows, run_id)

    async def _read_rows(
        self,
        run_id: str,
        correlation: str | None,
        after: int,
        limit: int | None,
        descending: bool,
    ) -> list[tuple[Any, ...]]:
        clauses = ["run_id = %s"]
        params: list[Any] = [run_id]
        if correlation is not None:
            clauses.append("correlation_id = %s")
            params.append(correlation)
        if descending:
            if after > 0:
                clauses.append("sequence < %s")
                params.append(after)
        else:
            clauses.append("sequence > %s")
            params.append(after)
        params.append(None if limit is None else max(limit, 0))
        return await self._fetch(
            f"SELECT {_EVENT_COLUMNS} FROM {self._s}.events WHERE {' AND '.join(clauses)} "
            f"ORDER BY sequence {'DESC' if descending else 'ASC'} LIMIT %s",
            params,
        )

    async def head(self, run_id: str) -> int:
        """The run's last sequence; 0 for an unknown run."""
        rows = await self._fetch(f"SELECT head FROM {self._s}.runs WHERE run_id = %s", (run_id,))
        return int(rows[0][0]) if rows else 0

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The global feed after `after_position`, in position order (`EventStore.read_all`)."""
        rows = await self._fetch(
            f"SELECT run_id, {_EVENT_COLUMNS} FROM {self._s}.read_feed(%s, %s, %s)",
            (after_position, max(limit, 0), round(self._feed_wait * 1000)),
        )
        return envelopes_from_rows(rows)

    async def subscribe(
        self, after_position: int = 0, *, poll_interval: float = 1.0, batch: int = 1000
    ) -> AsyncGenerator[Envelope, None]:
        """Every envelope of the feed after `after_position`, in feed order, as it commits.

        An endless async iterator: end it with `aclose()`, e.g. via `contextlib.aclosing`.

        Between batches it waits on `LISTEN`, on a pooled connection it keeps while it runs,
        and reads again at least every `poll_interval` seconds: the feed also moves when an
        older transaction ends, and notifications are not durable. Raises what `read_all`
        raises: `StoreUnavailable`, `StoreClosed`, `CorruptEvent`.
        """
        position = after_position
        listener: Connection | None = None
        try:
            while True:
                if listener is None:
                    listener = await self._listen()
                envelopes = await self.read_all(after_position=position, limit=batch)
                for envelope in envelopes:
                    yield envelope
                    assert envelope.position is not None
                    position = envelope.position
                if len(envelopes) < batch and not await self._wait(listener, poll_interval):
                    assert listener is not None
                    await self._release(listener)  # it failed: the next round listens anew
                    listener = None
        finally:
            if listener is not None:
                await self._release(listener)

    async def _listen(self) -> Connection | None:
        """A pooled connection listening on the store's channel, kept by one subscriber; None
        when none can be had (the subscriber polls meanwhile)."""
        self._check_open()
        try:
            conn = await self._pool.getconn()
        except psycopg.Error:
            return None
        self._listeners.add(conn)
        try:
            await conn.execute(f"LISTEN {_quote(self._channel)}")
        except psycopg.Error:
            await self._release(conn)
            return None
        return conn

    async def _release(self, listener: Connection) -> None:
        self._listeners.discard(listener)
        with contextlib.suppress(psycopg.Error):  # a broken connection: the pool drops it
            await listener.execute("UNLISTEN *")
        await self._pool.putconn(listener)

    async def _wait(self, listener: Connection | None, seconds: float) -> bool:
        """Until a notification arrives on `listener` or `seconds` pass (without a listener:
        sleep). False if the listener failed."""
        if listener is None:
            await asyncio.sleep(seconds)
            return True
        try:
            async for _ in listener.notifies(timeout=seconds, stop_after=1):
                pass
        except psycopg.Error:
            return False
        return True

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
            "%s",
            f"{self._s}.runs",
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
        )
        return summary_page(await self._fetch(query, params), limit)

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids."""
        if not run_ids:
            self._check_open()
            return []
        rows = await self._fetch(
            f"SELECT {SUMMARY_COLUMNS} FROM {self._s}.runs WHERE run_id = ANY(%s::text[])",
            (list(dict.fromkeys(run_ids)),),
        )
        found = {row[0]: summary_from_row(row) for row in rows}
        return [found.get(run_id) for run_id in run_ids]

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """The live holder of a hook token at `now`, or None."""
        rows = await self._fetch(
            token_holder_query("%s", f"{self._s}.tokens"), (token.encode(), time_key(now))
        )
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
            "%s", f"{self._s}.hooks", run_id=run_id, cursor=cursor, limit=limit, now=now
        )
        return hook_page(await self._fetch(query, params), limit)

    async def _wakeups(
        self, workflow_names: Collection[str] | None, due: int | None, limit: int
    ) -> list[Wakeup]:
        params: tuple[Any, ...] = (limit,) if due is None else (due, limit)
        served = None if workflow_names is None else "= ANY(%s)"
        query = wakeups_query(f"{self._s}.", "%s", served=served, due=due is not None)
        if workflow_names is not None:
            params = (sorted(workflow_names), *params)
        return [wakeup_from_row(row) for row in await self._fetch(query, params)]

    # --- repair and retention -----------------------------------------------------------------

    async def rewrite_index(self, run_id: str, index: RunIndex | None, *, now: datetime) -> None:
        """Replace the run's index rows with `index` (None: remove them), appending nothing.

        The repair behind `runfold verify --rebuild-index`: an optional capability, not part of
        `EventStore`.

        Fenced like an append, in one transaction: `index` must describe the run's head
        (`index.summary.last_sequence`; 0, no events, for None), else `SequenceConflict`; a token
        another run's live hook holds at `now` raises `TokenConflict`. Nothing is written when
        either is raised.
        """
        if index is None:
            [(head,)] = await self._fetch(
                self._drop_sql(
                    f"SELECT run_id FROM {self._s}.runs WHERE run_id = %(run_id)s AND head = 0 "
                    "FOR UPDATE",
                    f"SELECT coalesce(max(head), 0) FROM {self._s}.runs WHERE run_id = %(run_id)s",
                ),
                {"run_id": run_id},
            )
            if head:
                raise SequenceConflict(run_id, 0, head)
            return
        check_index(run_id, index)
        # An append of no events is exactly this: the head check, then the index rows.
        self._check_open()
        await self._append_one(_Append(run_id, index.summary.last_sequence, (), index, now))

    async def delete_runs(
        self, *, terminal_before: datetime, limit: int, run_ids: Collection[str] | None = None
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before` (the protocol's rules)."""
        s = self._s
        [(count,)] = await self._fetch(
            self._drop_sql(
                f"""SELECT run_id FROM {s}.runs r
                WHERE completed_at IS NOT NULL AND completed_at < %(before)s
                    AND status = ANY(%(terminal)s::text[])
                    AND NOT EXISTS (SELECT FROM {s}.hooks h WHERE h.run_id = r.run_id
                        AND {holds_at("%(before)s", "h.")})
                    AND (%(chosen)s::text[] IS NULL OR run_id = ANY(%(chosen)s::text[]))
                ORDER BY completed_at, run_id LIMIT %(limit)s
                FOR UPDATE""",
                "SELECT count(*) FROM dropped",
            ),
            {
                "before": time_key(terminal_before),
                "terminal": sorted(TERMINAL_RUN_STATUSES),
                "limit": max(limit, 0),
                "chosen": None if run_ids is None else sorted(run_ids),
            },
        )
        return int(count)

    def _drop_sql(self, doomed: str, result: str) -> str:
        """One statement (so one transaction) deleting the runs `doomed` selects, with their
        events, hook, token and wakeup rows, then running `result` (`dropped` holds the deleted
        run ids). `doomed` locks the runs rows first: an append to a doomed run waits, then
        finds its run gone (a sequence conflict at head 0)."""
        s = self._s
        return f"""
            WITH doomed AS ({doomed}),
            events AS (DELETE FROM {s}.events WHERE run_id IN (SELECT run_id FROM doomed)),
            wakeups AS (DELETE FROM {s}.wakeups WHERE run_id IN (SELECT run_id FROM doomed)),
            hooks AS (
                DELETE FROM {s}.hooks WHERE run_id IN (SELECT run_id FROM doomed)
                RETURNING run_id, token
            ),
            tokens AS (
                DELETE FROM {s}.tokens t USING hooks
                WHERE t.token = hooks.token AND t.run_id = hooks.run_id
            ),
            dropped AS (
                DELETE FROM {s}.runs WHERE run_id IN (SELECT run_id FROM doomed)
                RETURNING run_id
            )
            {result}
        """
