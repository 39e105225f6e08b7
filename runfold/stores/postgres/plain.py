"""The PostgreSQL store's plain appends: onto live runs without hook claims or wakeups.

Such an append needs none of `append_events`' upkeep of hooks and wakeups, nor its run
creation. Two ways write it, each where it is the cheapest:

- `append_plain_batch`, a group commit of such appends, or one alone of several events (the
  engine's steps): no subtransaction per append (only a race on the events' key can raise, and
  refuses the batch whole);
- `plain_append`, one such append of one event as one statement with scalar parameters,
  sparing the function call and the composite value.

Each writes nothing where it cannot say why (a runs row to write, hook or wakeup rows to clear,
a feed-order retry), and leaves that append to `append_events`. They are built of the parts in
`append_sql`; `s` is the quoted schema name throughout.
"""

from __future__ import annotations

from runfold.stores.postgres.append_sql import (
    CASTS,
    OWN,
    POSITIONS_PER_TRANSACTION,
    XACT,
    at_head,
    differs,
    function_field,
    insert_events,
    last_event,
    write_run,
)

__all__ = ["append_plain_batch", "plain_append"]

_P = POSITIONS_PER_TRANSACTION


def append_plain_batch(s: str) -> str:
    """`append_plain_batch`, the group commit of plain appends (`functions` creates it)."""
    write = write_run(s, function_field, count="v_count", position="v_base + v_count")
    insert = insert_events(s, function_field, base=f"v_xact * {_P} + v_ordinal")
    at_expected = at_head(function_field, head="v_head", position="v_head_position", xact="v_xact")
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
        v_xact bigint := {XACT};
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
                THEN {differs(function_field, OWN)} END
            INTO v_head, v_head_position, v_changed
            FROM ({last_event(s, function_field)}) h
            LEFT JOIN {s}.runs ON runs.run_id = r.run_id;
            IF v_count > 0 AND {at_expected} AND v_changed IS NOT NULL THEN
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


def _statement_field(name: str) -> str:
    return f"%({name})s{CASTS.get(name, '') if name.startswith('expected') else ''}"


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
    at_expected = at_head(field, head="head.sequence", position="head.position", xact=XACT)
    event = (
        "head, (SELECT %(type)s::text, %(version)s::integer, %(correlation_id)s::text, "
        "%(payload)s::bytea, 1) AS e(type, version, correlation_id, payload, n)"
    )
    insert = insert_events(s, field, base=f"{XACT} * {_P}", events=event)
    unchanged = differs(field, OWN, casts=True).replace("IS DISTINCT", "IS NOT DISTINCT")
    # The run's head (as the statement's snapshot saw it) is that of the one search.
    return f"""
WITH head AS ({last_event(s, field)}),
written AS ({insert} WHERE {at_expected} AND EXISTS (SELECT FROM {s}.runs
    WHERE run_id = %(run_id)s AND completed_at IS NULL AND NOT has_hooks AND NOT has_wakeups
        AND {unchanged})
    RETURNING position)
SELECT coalesce((SELECT position - 1 FROM written), -1 - coalesce((SELECT sequence FROM head), 0))
"""
