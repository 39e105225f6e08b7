"""Retention and repair on PostgreSQL: deleting runs with all their rows, in one statement.

Each statement deletes the runs its first query selects, with their events, hook, token and
wakeup rows, in one transaction. That query locks the runs rows first: an append to a doomed run
(which holds the row of an ended run, `functions`) waits, then finds its run gone (a sequence
conflict at head 0). `{s}` is the quoted schema name;
the parameters are named.
"""

from __future__ import annotations

from runfold.stores._sql import holds_at

__all__ = ["DELETE_RUNS", "DROP_UNBORN_RUN"]


def _drop(doomed: str, result: str) -> str:
    """One statement deleting the runs `doomed` selects, then running `result` (`dropped`
    holds the deleted run ids).

    Each table's rows are found by key, `run_id = ANY(ARRAY(...))`: an `IN (SELECT ...)` let
    the planner hash the doomed ids and scan every table whole, so a batch cost grew with the
    store rather than with the batch.
    """
    ids = "ARRAY(SELECT run_id FROM doomed)"
    return f"""
            WITH doomed AS ({doomed}),
            events AS (DELETE FROM {{s}}.events WHERE run_id = ANY({ids})),
            wakeups AS (DELETE FROM {{s}}.wakeups WHERE run_id = ANY({ids})),
            hooks AS (
                DELETE FROM {{s}}.hooks WHERE run_id = ANY({ids})
                RETURNING run_id, token
            ),
            tokens AS (
                DELETE FROM {{s}}.tokens t USING hooks
                WHERE t.token = hooks.token AND t.run_id = hooks.run_id
            ),
            dropped AS (
                DELETE FROM {{s}}.runs WHERE run_id = ANY({ids})
                RETURNING run_id
            )
            {result}
        """


DELETE_RUNS = _drop(
    f"""SELECT run_id FROM {{s}}.runs r
                WHERE completed_at IS NOT NULL AND completed_at < %(before)s
                    AND status = ANY(%(terminal)s::text[])
                    AND NOT EXISTS (SELECT FROM {{s}}.hooks h WHERE h.run_id = r.run_id
                        AND {holds_at("%(before)s", "h.")})
                    AND (%(chosen)s::text[] IS NULL OR run_id = ANY(%(chosen)s::text[]))
                ORDER BY completed_at, run_id LIMIT %(limit)s
                FOR UPDATE""",
    "SELECT count(*) FROM dropped",
)
"""The statement of `delete_runs`, which returns how many runs it deleted.

It deletes up to `limit` runs that ended `before`, among `chosen` (NULL: any), whose hooks
retain no token past `before`, oldest first.
"""

DROP_UNBORN_RUN = _drop(
    "SELECT run_id FROM {s}.runs WHERE run_id = %(run_id)s AND NOT EXISTS "
    "(SELECT FROM {s}.events WHERE run_id = %(run_id)s) FOR UPDATE",
    "SELECT coalesce(max(sequence), 0) FROM {s}.events WHERE run_id = %(run_id)s",
)
"""The statement of `rewrite_index` with no index, which returns the run's head.

It drops the index rows of `run_id` if the run has no events (head 0: dropped, or no such run).
"""
