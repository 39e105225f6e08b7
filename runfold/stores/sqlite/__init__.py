"""`SQLiteStore`: the embedded default, on aiosqlite.

One file (or `:memory:`), WAL, `busy_timeout`, `foreign_keys=ON`, `synchronous=FULL` by default.

- **Schema**: created and migrated by the store (a `runfold_schema` table, forward-only numbered
  migrations). A file written by a newer runfold is refused at open.
- **Append**: one `BEGIN IMMEDIATE … COMMIT` that checks the head, inserts the batch, assigns
  global-feed positions and replaces the run's index rows; the `(run_id, sequence)` primary key is
  the backstop. The head is the events' own: the run's row in `runs` is written only when its
  status, end time, owner or attributes change, and a summary's `last_sequence` and
  `updated_at` are read from the run's last event. An append alone runs on the calling thread
  through a second connection (`inline`), unless the write lock is taken. Otherwise aiosqlite
  makes a thread hop per call, so the whole transaction runs as one function on its connection
  thread (one hop per transaction), and appends that arrive while a transaction is running are
  combined into the next one (group commit), each with its own all-or-nothing outcome and its
  own conflict (written without a SAVEPOINT each, unless a refused one must be undone alone).
- **Feed**: SQLite has one writer at a time, so positions taken inside the write transaction
  commit in order: a tailing reader can never see a lower position appear later.
- **Times** are stored as integer microseconds since the Unix epoch.

One idea per module: `store` (the class and its group commit), `schema` (tables, migrations,
the checks at open), `thread` (the connection thread), `inline` (appends on the calling
thread), `writer` (the append transaction),
`index` (a run's index rows), `reads` and `retention`.
"""

from __future__ import annotations

from runfold.stores.sqlite.schema import SCHEMA_VERSION
from runfold.stores.sqlite.store import SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]
