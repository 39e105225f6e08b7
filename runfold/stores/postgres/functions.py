"""The SQL the PostgreSQL store runs on the server: its functions, and the one-statement append.

An append is one idea written once, here: check that the run's head, its last event
(`_last_event`), is where the caller left it (`_at_head`), insert the events (`_insert_events`),
whose primary key refuses a concurrent append at the same head, and write the run's row only
where a field it holds changes (`_differs`, `_write_run`). Three variants compose those parts,
each for the appends it is the cheapest way to write:

- `append_events`, the plpgsql function every append can go through: it also creates runs and
  keeps their hook claims and wakeups, and says why it refused (`SEQUENCE_CONFLICT`,
  `TOKEN_CONFLICT`, serialization_failure);
- `append_plain_batch`, a group commit of appends onto live runs without hook claims or
  wakeups: no upkeep, and no subtransaction per append (only a race on the key can raise);
- `plain_append(s)`, one such append of one event as one statement with scalar parameters,
  sparing the function call and the composite value.

`append_batch` is a group commit of any appends, each through `append_events` in a
subtransaction of its own. `s` is the quoted schema name throughout.
"""

from __future__ import annotations

from collections.abc import Callable

from runfold.stores.postgres.citus import (
    durable_position,
    durable_xact_function,
    one_row_inserts,
    plain_batch_function,
    read_feed_function,
    row_by_row,
)
from runfold.stores.postgres.due_work import claim_due_function

__all__ = [
    "POSITIONS_PER_TRANSACTION",
    "SEQUENCE_CONFLICT",
    "TOKEN_CONFLICT",
    "functions",
    "plain_append",
]

POSITIONS_PER_TRANSACTION = 1_000_000
"""Feed positions are `transaction id × POSITIONS_PER_TRANSACTION + ordinal`."""

SEQUENCE_CONFLICT = "RF001"
"""The SQLSTATE `append_events` refuses with when the head is not the one expected.

Its detail is the true head.
"""
TOKEN_CONFLICT = "RF002"
"""The SQLSTATE `append_events` refuses with when another run holds a claimed token.

Its detail is JSON naming the claim's ordinal and its holder, never the token.
"""

_P = POSITIONS_PER_TRANSACTION
_XACT = "pg_current_xact_id()::text::bigint"
"""The id of the writing transaction: its events' positions are `id × P + ordinal`."""
_CHANGING = ("status", "updated_at", "completed_at", "last_sequence", "attributes", "owner_id")
"""The summary columns an append may change; the others are fixed when the run is created."""
_OWN = ("status", "completed_at", "attributes", "owner_id")
"""The changing columns the runs row holds for itself: `updated_at` and `last_sequence` are its
last event's (`heads`), so a change of these alone leaves the row as it is."""
_CASTS = {
    "status": "::text",
    "completed_at": "::bigint",
    "attributes": "::text",
    "owner_id": "::text",
    "expected": "::integer",
    "expected_position": "::bigint",
}
"""The types of statement parameters that may come untyped (NULL)."""
_FIXED = (
    "workflow_name",
    "parent_run_id",
    "created_at",
    "queue_name",
    "priority",
    "dedup_id",
)

Fields = Callable[[str], str]
"""Where a variant finds a field of the append: `r.status` in a function, `%(status)s` in a
statement."""


def _function_field(name: str) -> str:
    return f"r.{name}"


def _last_event(s: str, field: Fields) -> str:
    """The `SELECT` of the run's head, its last event: `(sequence, position)`, no row for none."""
    return (
        f"SELECT e.sequence, e.position FROM {s}.events e WHERE e.run_id = {field('run_id')} "
        "ORDER BY e.sequence DESC LIMIT 1"
    )


def _at_head(field: Fields, *, head: str, position: str, xact: str) -> str:
    """Whether the head found (`head`, its event at `position`) is the one the append expects.

    That is: the head is `field("expected")`, its event at `field("expected_position")` (when
    given), and written by a transaction older than `xact` (an unmultiplied id): a run's events
    come in the feed in the order they were appended.
    """
    return (
        f"{head} = {field('expected')} "
        f"AND {position} = coalesce({field('expected_position')}, {position}) "
        f"AND {position} < ({xact} + 1) * {_P}"
    )


def _differs(
    field: Fields,
    columns: tuple[str, ...],
    *,
    extra: tuple[tuple[str, str], ...] = (),
    casts: bool = False,
) -> str:
    """Whether the runs row holds other values than the append's in `columns`.

    `extra` adds (column, value) pairs; `casts` types the statement parameters, which come
    untyped when NULL."""
    names = [*columns, *(column for column, _ in extra)]
    values = [field(c) + (_CASTS.get(c, "") if casts else "") for c in columns]
    values += [value for _, value in extra]
    return f"({', '.join(names)}) IS DISTINCT FROM ({', '.join(values)})"


def _write_run(
    s: str, field: Fields, *, count: str, position: str, every_column: bool = False, also: str = ""
) -> str:
    """The `UPDATE` of the run's row to the append's summary, its head `count` events on.

    `position` is the new head's; `every_column` sets the fixed summary columns too (a repair
    may change them); `also` adds to the `SET` list."""
    columns = (*_FIXED, *_CHANGING) if every_column else _CHANGING
    sets = [f"{column} = {field(column)}" for column in columns]
    sets += [f"head = {field('expected')} + {count}", f"head_position = {position}"]
    if also:
        sets.append(also)
    return f"UPDATE {s}.runs SET {', '.join(sets)} WHERE run_id = {field('run_id')}"


_EVENTS = (
    "unnest(r.types, r.versions, r.correlation_ids, r.payloads) "
    "WITH ORDINALITY AS e(type, version, correlation_id, payload, n)"
)
"""The events of `append_request` `r`, numbered from 1."""


def _insert_events(s: str, field: Fields, *, base: str, events: str = _EVENTS) -> str:
    """The `INSERT` of the events, the `n`-th at sequence expected + n and position base + n.

    `events` yields `e(type, version, correlation_id, payload, n)`.
    """
    return (
        f"INSERT INTO {s}.events (run_id, sequence, type, schema_version, correlation_id, "
        f"payload, recorded_at, position) SELECT {field('run_id')}, {field('expected')} + e.n, "
        f"e.type, e.version, e.correlation_id, e.payload, {field('recorded_at')}, {base} + e.n "
        f"FROM {events}"
    )


def _append_events(s: str, *, row_by_row: bool = False) -> str:
    """`append_events`; `row_by_row` inserts hook and wakeup rows one per statement (on a
    cluster, where Citus writes an `INSERT ... SELECT` with `COPY`, then in two phases)."""
    hooks = (
        f"INSERT INTO {s}.hooks (run_id, token, hook_id, retained_until) "
        "SELECT r.run_id, c.token, c.id, c.until "
        "FROM unnest(r.tokens, r.hook_ids, r.retained_until) AS c(token, id, until);"
    )
    wakeups = (
        f"INSERT INTO {s}.wakeups (run_id, kind, subject_id, due_at) "
        "SELECT r.run_id, w.kind, w.subject_id, w.due_at "
        "FROM unnest(r.wakeup_kinds, r.wakeup_subjects, r.wakeup_due) "
        "AS w(kind, subject_id, due_at);"
    )
    if row_by_row:
        hooks = (
            "FOR v_i IN 1..cardinality(r.tokens) LOOP "
            f"INSERT INTO {s}.hooks (run_id, token, hook_id, retained_until) "
            "VALUES (r.run_id, r.tokens[v_i], r.hook_ids[v_i], r.retained_until[v_i]); END LOOP;"
        )
        wakeups = (
            "FOR v_i IN 1..cardinality(r.wakeup_kinds) LOOP "
            f"INSERT INTO {s}.wakeups (run_id, kind, subject_id, due_at) VALUES (r.run_id, "
            "r.wakeup_kinds[v_i], r.wakeup_subjects[v_i], r.wakeup_due[v_i]); END LOOP;"
        )
    flags = (
        ("has_hooks", "cardinality(r.tokens) > 0"),
        ("has_wakeups", "cardinality(r.wakeup_kinds) > 0"),
    )
    write = _write_run(
        s,
        _function_field,
        count="v_count",
        position="coalesce(v_position, v_head_position)",
        every_column=True,
        also=", ".join(f"{column} = {value}" for column, value in flags),
    )
    differs = _differs(_function_field, (*_FIXED, *_OWN), extra=flags)
    return f"""
    -- Writes one append; returns the position before its first event (its events follow at
    -- ordinals p_offset + 1, … of this transaction). Raises {SEQUENCE_CONFLICT} (detail: the
    -- true head) when the head is not r.expected; unique_violation when an append at the same
    -- head committed meanwhile (the events' primary key); {TOKEN_CONFLICT} (detail: JSON naming
    -- the claim's ordinal and its holder, never the token) when another run holds a claimed
    -- token; serialization_failure when the run's previous append committed with a younger
    -- transaction id than this one (possible only when appending at a head read before that
    -- commit): its events would come first in the feed, and a new transaction, being younger,
    -- passes.
    CREATE OR REPLACE FUNCTION {s}.append_events(r {s}.append_request, p_offset integer DEFAULT 0)
    RETURNS bigint LANGUAGE plpgsql AS $fn$
    DECLARE
        v_xact bigint := {_XACT};
        v_base bigint := v_xact * {_P} + p_offset;
        v_count integer := cardinality(r.types);
        -- No events (a repair of the index rows alone): the run's last position stays.
        v_position bigint := CASE WHEN v_count > 0 THEN v_base + v_count END;
        v_had_hooks boolean := false;
        v_had_wakeups boolean := false;
        v_changed boolean;
        v_ended boolean;
        v_head integer;
        v_head_position bigint;
        v_holder record;
        v_tokens bytea[];
        v_gone text;
        v_i integer;
    BEGIN
        {_last_event(s, _function_field)} INTO v_head, v_head_position;
        v_head := coalesce(v_head, 0);
        v_head_position := coalesce(v_head_position, 0);
        -- The head is the one expected but its event is another: the run was deleted and
        -- created again since the caller read it, a conflict (detail: the head).
        IF v_head <> r.expected
                OR v_head_position <> coalesce(r.expected_position, v_head_position) THEN
            RAISE EXCEPTION USING ERRCODE = '{SEQUENCE_CONFLICT}',
                MESSAGE = 'runfold: sequence conflict', DETAIL = v_head::text;
        END IF;
        IF v_head_position >= (v_xact + 1) * {_P} THEN
            RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                MESSAGE = 'runfold: the run moved on in a younger transaction; retry';
        END IF;

        -- The events' primary key is the run's lock: an append at the same head waits for
        -- this one, then fails on it. A repair, writing no event, takes the key of the next
        -- one for the time of this transaction, so that no append moves the head under it.
        IF v_count > 0 THEN
            {_insert_events(s, _function_field, base="v_base")};
        ELSE
            INSERT INTO {s}.events (run_id, sequence, type, schema_version, payload,
                recorded_at, position)
            VALUES (r.run_id, r.expected + 1, '', 0, '', 0, 0);
            DELETE FROM {s}.events WHERE run_id = r.run_id AND sequence = r.expected + 1;
        END IF;

        -- The runs row, written only when a field it holds changes. Read after the events'
        -- key is taken, it is the row of the append this one follows.
        SELECT has_hooks, has_wakeups, completed_at IS NOT NULL, {differs}
        INTO v_had_hooks, v_had_wakeups, v_ended, v_changed
        FROM {s}.runs WHERE run_id = r.run_id;
        IF NOT FOUND THEN
            IF r.expected > 0 THEN  -- deleted since the head was read
                RAISE EXCEPTION USING ERRCODE = '{SEQUENCE_CONFLICT}',
                    MESSAGE = 'runfold: sequence conflict', DETAIL = '0';
            END IF;
            v_had_hooks := false;
            v_had_wakeups := false;
            INSERT INTO {s}.runs (run_id, workflow_name, status, parent_run_id, created_at,
                updated_at, completed_at, last_sequence, attributes, owner_id, queue_name,
                priority, dedup_id, head, head_position, has_hooks, has_wakeups)
            VALUES (r.run_id, r.workflow_name, r.status, r.parent_run_id, r.created_at,
                r.updated_at, r.completed_at, r.last_sequence, r.attributes, r.owner_id,
                r.queue_name, r.priority, r.dedup_id, v_count,
                coalesce(v_position, 0), {", ".join(value for _, value in flags)})
            ON CONFLICT (run_id) DO NOTHING;
            IF NOT FOUND THEN  -- a run without events, committed since the row was read
                RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                    MESSAGE = 'runfold: the run was created meanwhile; retry';
            END IF;
        -- A run without events is written whenever it gets some, so that dropping it
        -- (`DROP_UNBORN_RUN`, which locks its row) and appending to it exclude each other.
        ELSIF v_changed OR r.expected = 0 THEN
            {write};
            IF NOT FOUND THEN  -- deleted since the row was read
                RAISE EXCEPTION USING ERRCODE = '{SEQUENCE_CONFLICT}',
                    MESSAGE = 'runfold: sequence conflict', DETAIL = '0';
            END IF;
        ELSIF v_ended THEN
            -- An ended run may be deleted (`DELETE_RUNS`, which locks its row first): the
            -- append holds the row, so that the deletion waits for it, or it for the deletion.
            PERFORM FROM {s}.runs WHERE run_id = r.run_id FOR KEY SHARE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = '{SEQUENCE_CONFLICT}',
                    MESSAGE = 'runfold: sequence conflict', DETAIL = '0';
            END IF;
        END IF;

        -- Hook claims. The run's rows in `hooks` are replaced; in `tokens` only the claims
        -- that changed are touched, so a run keeping its hooks writes nothing there.
        -- No statement reads one of `hooks` and `tokens` and writes the other: on a cluster
        -- they are distributed apart (by run, by token), and each statement stays on one.
        IF v_had_hooks OR cardinality(r.tokens) > 0 THEN
            WITH old AS (
                DELETE FROM {s}.hooks WHERE run_id = r.run_id
                RETURNING token, hook_id, retained_until
            )
            SELECT array_agg(old.token) INTO v_tokens FROM old WHERE NOT EXISTS (
                SELECT FROM unnest(r.tokens, r.hook_ids, r.retained_until) AS c(token, id, until)
                WHERE (c.token, c.id, c.until)
                    IS NOT DISTINCT FROM (old.token, old.hook_id, old.retained_until));
            -- One token per statement, here and below: each goes to one shard on a cluster.
            FOR v_i IN 1..coalesce(cardinality(v_tokens), 0) LOOP
                DELETE FROM {s}.tokens WHERE token = v_tokens[v_i] AND run_id = r.run_id;
            END LOOP;
        END IF;
        IF cardinality(r.tokens) > 0 THEN
            -- A holder whose retention has passed is not live: it gives way.
            FOR v_i IN 1..cardinality(r.tokens) LOOP
                DELETE FROM {s}.tokens WHERE token = r.tokens[v_i] AND run_id <> r.run_id
                    AND retained_until <= r.recorded_at
                RETURNING run_id INTO v_gone;
                IF FOUND THEN
                    DELETE FROM {s}.hooks WHERE run_id = v_gone AND token = r.tokens[v_i];
                END IF;
            END LOOP;
            -- DO NOTHING waits for a concurrent claim of the token to commit; the check below
            -- then sees its row.
            FOR v_i IN 1..cardinality(r.tokens) LOOP
                INSERT INTO {s}.tokens (token, run_id, hook_id, retained_until)
                VALUES (r.tokens[v_i], r.run_id, r.hook_ids[v_i], r.retained_until[v_i])
                ON CONFLICT (token) DO NOTHING;
            END LOOP;
            SELECT t.run_id, t.hook_id, array_position(r.tokens, t.token) AS claim
            INTO v_holder FROM {s}.tokens t
            WHERE t.token = ANY(r.tokens) AND t.run_id <> r.run_id LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = '{TOKEN_CONFLICT}',
                    MESSAGE = 'runfold: token conflict',
                    DETAIL = json_build_object('claim', v_holder.claim,
                        'run_id', v_holder.run_id, 'hook_id', v_holder.hook_id)::text;
            END IF;
            {hooks}
        END IF;

        IF v_had_wakeups THEN
            DELETE FROM {s}.wakeups WHERE run_id = r.run_id;
        END IF;
        IF cardinality(r.wakeup_kinds) > 0 THEN
            {wakeups}
        END IF;
        RETURN v_base;
    END
    $fn$;
"""


def _append_batch(s: str) -> str:
    return f"""
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
            EXCEPTION WHEN SQLSTATE '{SEQUENCE_CONFLICT}' OR SQLSTATE '{TOKEN_CONFLICT}'
                    OR unique_violation OR serialization_failure THEN
                GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, detail = PG_EXCEPTION_DETAIL;
                base := NULL;
            END;
            RETURN NEXT;
        END LOOP;
    END
    $fn$;
"""


def _append_plain_batch(s: str) -> str:
    write = _write_run(s, _function_field, count="v_count", position="v_base + v_count")
    insert = _insert_events(s, _function_field, base=f"v_xact * {_P} + v_ordinal")
    at_head = _at_head(_function_field, head="v_head", position="v_head_position", xact="v_xact")
    return f"""
    -- A group commit of appends onto live runs that keep no hook claims and no wakeups, each
    -- to another run: what `append_events` does for them, without the upkeep of hooks and
    -- wakeups, or a subtransaction per append (none raises here but for an append at the same
    -- head committed meanwhile, the events' primary key: the batch is then refused whole). One
    -- row per append, in order: its base position or, where it wrote nothing, -1 - the run's
    -- head (0 for no run), as the single statement of one such append returns it.
    CREATE OR REPLACE FUNCTION {s}.append_plain_batch(p_requests {s}.append_request[])
    RETURNS SETOF bigint LANGUAGE plpgsql AS $fn$
    DECLARE
        v_xact bigint := {_XACT};
        v_ordinal integer := 0;  -- ordinals taken by the appends written so far
        v_base bigint;
        v_count integer;
        v_head integer;
        v_head_position bigint;
        v_changed boolean;
        r {s}.append_request;
    BEGIN
        FOREACH r IN ARRAY p_requests LOOP
            v_count := cardinality(r.types);
            v_base := v_xact * {_P} + v_ordinal;
            -- The head and the run's row in one statement (on a cluster, one trip to a worker):
            -- v_changed is NULL unless the row is there, live, without hooks or wakeups.
            SELECT h.sequence, h.position, CASE WHEN runs.completed_at IS NULL
                    AND NOT runs.has_hooks AND NOT runs.has_wakeups
                THEN {_differs(_function_field, _OWN)} END
            INTO v_head, v_head_position, v_changed
            FROM ({_last_event(s, _function_field)}) h
            LEFT JOIN {s}.runs ON runs.run_id = r.run_id;
            IF v_count > 0 AND {at_head} AND v_changed IS NOT NULL THEN
                {insert};
                IF v_changed THEN
                    {write};
                END IF;
                RETURN NEXT v_base;
                v_ordinal := v_ordinal + v_count;
            ELSE
                RETURN NEXT -1 - coalesce(v_head, 0);
            END IF;
        END LOOP;
    END
    $fn$;
"""


def _read_feed(s: str) -> str:
    return f"""
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
            AND e.position < pg_snapshot_xmin(pg_current_snapshot())::text::bigint * {_P}
            ORDER BY e.position LIMIT p_limit;
    END
    $fn$;
"""


def functions(s: str, *, distributed: bool = False) -> list[str]:
    """The server-side functions of the store in schema `s`, as this runfold calls them.

    One `CREATE OR REPLACE FUNCTION` statement each.

    They are (re)created in the transaction of every migration, so that each is written once,
    here, and a schema at any version ends with the current definitions. `distributed` (a Citus
    cluster) takes the feed's bound on the coordinator (`citus.read_feed_function`), and its
    appends write a WAL record there (`citus.durable_position`).
    """
    if not distributed:
        return [
            _append_events(s),
            _append_batch(s),
            _read_feed(s),
            _append_plain_batch(s),
            claim_due_function(s),
        ]
    inserts = {_insert_events(s, _function_field, base="v_base"): row_by_row(s, "v_base")}
    return [
        durable_xact_function(s),
        durable_position(one_row_inserts(_append_events(s, row_by_row=True), inserts)),
        _append_batch(s),
        read_feed_function(s, _P),
        plain_batch_function(s, _P),
        claim_due_function(s),
    ]


def _statement_field(name: str) -> str:
    return f"%({name})s{_CASTS.get(name, '') if name.startswith('expected') else ''}"


def plain_append(s: str) -> str:
    """One plain append of one event (`AppendRequest.single`) in one statement, schema `s`.

    Its parameters are named (`AppendRequest.plain_parameters`). It writes what `append_events`
    would, with the same head and feed-order checks, on a live run without hook claims or
    wakeups before and after, whose runs row the append leaves as it is. It returns the base
    position (never negative) or, where it writes nothing, `-1 - head` for the head its snapshot
    saw: another head is a `SequenceConflict`; the expected one leaves `append_events` to say
    why (a commit since the snapshot, a runs row to write, hook or wakeup rows to clear, a
    feed-order retry). An append at the same head committed meanwhile fails on the events'
    primary key (unique_violation).
    """
    field = _statement_field
    at_head = _at_head(field, head="head.sequence", position="head.position", xact=_XACT)
    event = (
        "head, (SELECT %(type)s::text, %(version)s::integer, %(correlation_id)s::text, "
        "%(payload)s::bytea, 1) AS e(type, version, correlation_id, payload, n)"
    )
    insert = _insert_events(s, field, base=f"{_XACT} * {_P}", events=event)
    unchanged = _differs(field, _OWN, casts=True).replace("IS DISTINCT", "IS NOT DISTINCT")
    # The run's head (as the statement's snapshot saw it) is that of the one search.
    return f"""
WITH head AS ({_last_event(s, field)}),
written AS ({insert} WHERE {at_head} AND EXISTS (SELECT FROM {s}.runs
    WHERE run_id = %(run_id)s AND completed_at IS NULL AND NOT has_hooks AND NOT has_wakeups
        AND {unchanged})
    RETURNING position)
SELECT coalesce((SELECT position - 1 FROM written), -1 - coalesce((SELECT sequence FROM head), 0))
"""
