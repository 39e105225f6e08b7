"""The SQL the PostgreSQL store runs on the server: its functions, and the one-statement append.

`{s}` in each is the quoted schema name.
"""

from __future__ import annotations

__all__ = ["FUNCTIONS", "PLAIN_APPEND"]

FUNCTIONS = """
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
"""The server-side functions, as this runfold calls them.

They are (re)created in the transaction of every migration, so that each is written once, here,
and a schema at any version ends with the current definitions."""

PLAIN_APPEND = """
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
"""A plain append of one event (`Append.single`) in one statement with scalar parameters.

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
