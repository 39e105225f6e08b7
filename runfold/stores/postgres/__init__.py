"""`PostgresStore`: the store deployments scale out on, on psycopg 3 and `psycopg_pool`.

- **Schema**: tables in their own PostgreSQL schema (default `runfold`), created and upgraded by
  `migrate()` (a `schema_version` table, forward-only numbered migrations) under an advisory
  lock, so several processes may start at once. A schema already at this runfold's version is
  only read, so the running application needs no DDL rights. Every table leads with `run_id`
  except `tokens`, the global unique index of hook tokens (see
  `docs/scaling.md`).
- **Append**: one call of the server-side function `append_events` (or, onto a live run without
  hooks or wakeups, one that does its part: `append_plain_batch`, or for a single event one
  statement, `plain_append`): one transaction, one round trip. It checks the run's head (its last
  event, `heads`) and inserts the batch: the events' `(run_id, sequence)` primary key is the run's
  lock (concurrent appends at one head queue on it and all but one fail on it). It writes the run's
  row in `runs` only when a field the row holds changes, and keeps the run's hook and wakeup rows.
  Refusals come back as SQLSTATEs of runfold's own (`SEQUENCE_CONFLICT`, `TOKEN_CONFLICT`). The
  request travels as one value of the composite type `append_request`, in PostgreSQL's binary format
  (`wire`).
- **Group commit**: an append takes a free write slot (`MAX_WRITES` of them); while every slot
  is taken, further appends wait and go together in one transaction, one append per run and
  one write per run in flight, sorted by run id so that batches lock runs in one order. Plain
  appends go through `append_plain_batch`, the others through `append_batch`, each in a
  subtransaction of its own, so each keeps its own all-or-nothing outcome. A write that finds
  a run's head settles the appends queued for that run which expect another head.
- **Feed**: an event's position is its transaction's id × `POSITIONS_PER_TRANSACTION` + its
  ordinal in that transaction, and `read_all` serves only transactions older than the oldest one
  still running (`pg_snapshot_xmin`). Any transaction that can still commit has a higher id,
  hence higher positions, so nothing can appear below a position already served, and writers
  share no lock.
- **Notifications**: after appends commit the store sends `NOTIFY` from a separate, write-free
  transaction, at most one per `NOTIFY_INTERVAL`; `subscribe` listens, and polls as a fallback.
- **Times** are integer microseconds since the Unix epoch, exact and compared as numbers.
- **Text**: keys use the "C" collation so PostgreSQL orders them as Python does; tokens are
  `bytea` and attributes JSON `text`, because `text` and `jsonb` cannot hold U+0000.

One idea per module: `store` (the class), `connections` (the pool and driver errors), `schema`
(tables, migrations), `append_sql` (the parts appends are written of), `functions` (the
server-side functions), `plain` (the appends onto runs without hooks or wakeups), `heads` (a
run's head, read from its last event), `request` and `wire` (one append and its
binary encoding), `writer` (the append and its group commit), `overlap` (when a group commit
starts beside another), `feed` (the global feed and its notifications) and `retention`.
"""

from __future__ import annotations

from runfold.stores.postgres.append_sql import POSITIONS_PER_TRANSACTION
from runfold.stores.postgres.feed import NOTIFY_INTERVAL
from runfold.stores.postgres.schema import SCHEMA_VERSION
from runfold.stores.postgres.store import PostgresStore

__all__ = [
    "NOTIFY_INTERVAL",
    "POSITIONS_PER_TRANSACTION",
    "SCHEMA_VERSION",
    "PostgresStore",
]
