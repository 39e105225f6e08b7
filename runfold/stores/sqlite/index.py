"""A run's index rows on SQLite: its summary, hook claims and wakeups, written and repaired.

Functions that run on the connection thread, inside the caller's transaction (`rewrite_run_index`
makes its own).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from runfold.kernel import HookClaim, RunIndex, SequenceConflict, TokenConflict
from runfold.stores._sql import token_holder_query
from runfold.stores.sqlite.reads import read_head
from runfold.stores.time_keys import time_key

__all__ = ["TOKEN_HOLDER", "IndexRows", "live_claims", "rewrite_run_index", "write_index"]


class IndexRows(NamedTuple):
    """What a run's index rows hold before an append (`status` None: no runs row yet)."""

    status: str | None
    completed_at: int | None
    owner_id: str | None
    attributes: str | None
    has_hooks: bool
    has_wakeups: bool


TOKEN_HOLDER = token_holder_query("?", "hooks")
"""The hook row holding a token at a time: live, or retained past it."""


def live_claims(
    cursor: sqlite3.Cursor, run_id: str, index: RunIndex, at: datetime
) -> tuple[HookClaim, ...]:
    """The claims of `index` live at `at`; `TokenConflict` if another run's hook holds one."""
    if not index.hooks:
        return ()
    claims = index.claims_at(at)
    now = time_key(at)
    for claim in claims:
        held = cursor.execute(TOKEN_HOLDER, (claim.token, now)).fetchone()
        if held is not None and held[0] != run_id:
            raise TokenConflict(claim.token, held[0], held[1])
    return claims


_UPSERT_RUN = (
    "INSERT INTO runs (run_id, workflow_name, status, parent_run_id, created_at, updated_at, "
    "completed_at, last_sequence, attributes, owner_id, queue_name, priority, dedup_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (run_id) DO UPDATE SET status = excluded.status, "
    "completed_at = excluded.completed_at, updated_at = excluded.updated_at, "
    "last_sequence = excluded.last_sequence, attributes = excluded.attributes, "
    "owner_id = excluded.owner_id, queue_name = excluded.queue_name, "
    "priority = excluded.priority, dedup_id = excluded.dedup_id"
)
_UPDATE_ATTRIBUTES = (
    "UPDATE runs SET updated_at = ?, last_sequence = ?, attributes = ? WHERE run_id = ?"
)
_UPDATE_RUN_STATUS = (
    "UPDATE runs SET status = ?, completed_at = ?, owner_id = ?, updated_at = ?, "
    "last_sequence = ?, attributes = ? WHERE run_id = ?"
)


def write_index(
    cursor: sqlite3.Cursor,
    run_id: str,
    index: RunIndex,
    claims: Sequence[HookClaim],
    before: IndexRows | None = None,
) -> IndexRows:
    """Replace the run's summary, hook and wakeup rows (`claims`: its hooks to keep).

    `before` is what `_RUN_STATE` found (None: unknown, so everything is rewritten). Returns
    what the rows hold then.
    """
    summary = index.summary
    completed_at = None if summary.completed_at is None else time_key(summary.completed_at)
    attributes = (
        json.dumps(dict(summary.attributes), sort_keys=True) if summary.attributes else "{}"
    )
    rewritten = True  # the summary row holds what `summary` says (else as `before` says)
    if before is not None and before.status is not None:
        # The row is there (its status is never NULL): an UPDATE of what an append changes,
        # rather than an upsert, which tries the INSERT (and its triggers) first. The head and
        # the time of last change are read from the events (`reads.SUMMARY`), so the row is
        # written only when what else it holds changes: most appends write no runs page at all.
        # SQLite rewrites an index whenever the SET clause names one of its columns, whatever
        # the value, so status, end time and owner are set only when one changes (a run's
        # fixed name, parent and creation time never are).
        unchanged = (
            before.status == summary.status
            and before.completed_at == completed_at
            and before.owner_id == summary.owner_id
        )
        if not unchanged:
            cursor.execute(
                _UPDATE_RUN_STATUS,
                (
                    summary.status,
                    completed_at,
                    summary.owner_id,
                    time_key(summary.updated_at),
                    summary.last_sequence,
                    attributes,
                    run_id,
                ),
            )
        elif before.attributes != attributes:
            cursor.execute(
                _UPDATE_ATTRIBUTES,
                (time_key(summary.updated_at), summary.last_sequence, attributes, run_id),
            )
        else:
            rewritten = False
    else:
        # An upsert, not INSERT OR REPLACE: a replace deletes and reinserts the row, rewriting
        # all six runs indexes.
        cursor.execute(
            _UPSERT_RUN,
            (
                run_id,
                summary.workflow_name,
                summary.status,
                summary.parent_run_id,
                time_key(summary.created_at),
                time_key(summary.updated_at),
                completed_at,
                summary.last_sequence,
                attributes,
                summary.owner_id,
                summary.queue_name,
                summary.priority,
                summary.dedup_id,
            ),
        )
    if before is None or before.has_hooks:
        cursor.execute("DELETE FROM hooks WHERE run_id = ?", (run_id,))
    if claims:
        cursor.executemany(
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
        cursor.execute("DELETE FROM wakeups WHERE run_id = ?", (run_id,))
    if index.wakeups:
        cursor.executemany(
            "INSERT INTO wakeups (run_id, kind, subject_id, due_at) VALUES (?, ?, ?, ?)",
            [(run_id, w.kind, w.subject_id, time_key(w.due_at)) for w in index.wakeups],
        )
    if (
        not rewritten
        and before is not None
        and not (claims or index.wakeups or before.has_hooks or before.has_wakeups)
    ):
        return before  # as it was: no need of another one
    return IndexRows(
        summary.status,
        completed_at,
        summary.owner_id,
        attributes,
        bool(claims),
        bool(index.wakeups),
    )


def rewrite_run_index(
    conn: sqlite3.Connection, run_id: str, index: RunIndex | None, now: datetime
) -> None:
    """Replace the run's index rows with `index` (None: remove them), fenced on its head."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        expected = index.summary.last_sequence if index is not None else 0
        head = read_head(conn, run_id)
        if head != expected:
            raise SequenceConflict(run_id, expected, head)
        # The append's upsert keeps a run's fixed columns (name, parent, creation time); a repair
        # must replace them too, so the old row goes first.
        for table in ("hooks", "wakeups", "runs"):
            conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        if index is not None:
            cursor = conn.cursor()
            write_index(cursor, run_id, index, live_claims(cursor, run_id, index, now))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
