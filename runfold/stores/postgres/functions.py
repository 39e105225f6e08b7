"""The PostgreSQL store's server-side functions: `append_events`, `append_batch`, `read_feed`.

`append_events` is the append every append can go through: it also creates runs and keeps their
hook claims and wakeups, and says why it refused (`SEQUENCE_CONFLICT`, `TOKEN_CONFLICT`,
serialization_failure). `append_batch` is a group commit of any appends, each through
`append_events` in a subtransaction of its own. The parts they are written of are in
`append_sql`; the cheaper appends onto live runs without hook claims or wakeups in `plain`.
`functions` lists every function the store's schema holds. `s` is the quoted schema name
throughout.
"""

from __future__ import annotations

from runfold.stores.postgres.append_sql import (
    FIXED,
    OWN,
    POSITIONS_PER_TRANSACTION,
    SEQUENCE_CONFLICT,
    TOKEN_CONFLICT,
    XACT,
    differs,
    function_field,
    insert_events,
    last_event,
    write_run,
)
from runfold.stores.postgres.citus import (
    durable_position,
    durable_xact_function,
    one_row_inserts,
    plain_batch_function,
    read_feed_function,
    row_by_row,
)
from runfold.stores.postgres.due_work import claim_due_function
from runfold.stores.postgres.plain import append_plain_batch

__all__ = ["functions"]

_P = POSITIONS_PER_TRANSACTION


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
    write = write_run(
        s,
        function_field,
        count="v_count",
        position="coalesce(v_position, v_head_position)",
        every_column=True,
        also=", ".join(f"{column} = {value}" for column, value in flags),
    )
    changed = differs(function_field, (*FIXED, *OWN), extra=flags)
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
        v_xact bigint := {XACT};
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
        {last_event(s, function_field)} INTO v_head, v_head_position;
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
            {insert_events(s, function_field, base="v_base")};
        ELSE
            INSERT INTO {s}.events (run_id, sequence, type, schema_version, payload,
                recorded_at, position)
            VALUES (r.run_id, r.expected + 1, '', 0, '', 0, 0);
            DELETE FROM {s}.events WHERE run_id = r.run_id AND sequence = r.expected + 1;
        END IF;

        -- The runs row, written only when a field it holds changes. Read after the events'
        -- key is taken, it is the row of the append this one follows.
        SELECT has_hooks, has_wakeups, completed_at IS NOT NULL, {changed}
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
            append_plain_batch(s),
            claim_due_function(s),
        ]
    inserts = {insert_events(s, function_field, base="v_base"): row_by_row(s, "v_base")}
    return [
        durable_xact_function(s),
        durable_position(one_row_inserts(_append_events(s, row_by_row=True), inserts)),
        _append_batch(s),
        read_feed_function(s, _P),
        plain_batch_function(s, _P),
        claim_due_function(s),
    ]
