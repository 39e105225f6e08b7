"""`KnownRuns`: what one connection's own appends left in the file, so the next need not read it.

Before it writes, an append reads its run's head, the head's feed position, what its index rows
hold and the last feed position handed out (`writer._RUN_STATE`): about a third of a group
commit's work per append on the driver's thread. Where the connection itself wrote all of that
last, it knows it already: `KnownRuns` keeps it, for the runs its appends wrote, and hands it
back only while nothing else can have changed the file since.

That is checked when each transaction begins, under the write lock (nobody else writes until it
ends): SQLite's `data_version` of the connection is unchanged (no other connection, in this
process or another, has committed since the last check), and so is the connection's own count
of changed rows since its last append committed (no other call on it wrote meanwhile: a lease,
a claim, a repair, retention). Anything else forgets all of it, and every run is read again.
What a transaction's appends leave is staged, and kept only once its `COMMIT` succeeded: a
rollback, a refused append or a commit that raised leaves nothing behind.
"""

from __future__ import annotations

import sqlite3

from runfold.stores.sqlite.index import IndexRows

__all__ = ["KnownRun", "KnownRuns"]

_KEPT = 4096
"""How many runs one connection keeps; past it, it forgets them all and starts again."""


KnownRun = tuple[int, int, IndexRows]
"""A run as its last append left it: its head, the head's feed position, its index rows."""


class KnownRuns:
    """The runs one connection's committed appends wrote last (see the module's docstring)."""

    __slots__ = ("_changes", "_position", "_runs", "_staged", "_staged_position", "_version")

    def __init__(self) -> None:
        self._runs: dict[str, KnownRun] = {}
        self._position: int | None = None
        """The last feed position handed out, as the last committed append left it."""
        self._version: int | None = None
        self._changes = -1
        self._staged: dict[str, KnownRun] = {}
        self._staged_position: int | None = None

    def begin(self, cursor: sqlite3.Cursor) -> None:
        """Start a transaction's appends: forget everything if anything else may have written.

        Called in the transaction, which holds the write lock: anything but this connection's
        appends that wrote since the last one committed makes every run read again.
        """
        (version,) = cursor.execute("PRAGMA data_version").fetchone()
        if version != self._version or cursor.connection.total_changes != self._changes:
            self._runs.clear()
            self._position = None
            self._version = version
        self._staged.clear()
        self._staged_position = self._position

    def get(self, run_id: str) -> KnownRun | None:
        """The run as this transaction's appends, or the last committed ones, left it."""
        found = self._staged.get(run_id)
        return self._runs.get(run_id) if found is None else found

    @property
    def position(self) -> int | None:
        """The last feed position handed out, if known."""
        return self._staged_position

    def wrote(self, run_id: str, run: KnownRun, position: int) -> None:
        """Stage what an append of this transaction left: `run`, and `position` handed out."""
        self._staged[run_id] = run
        self._staged_position = position

    def committed(self, conn: sqlite3.Connection) -> None:
        """The transaction committed: keep what its appends staged."""
        if len(self._runs) + len(self._staged) > _KEPT:
            self._runs.clear()
        self._runs.update(self._staged)
        self._staged.clear()
        self._position = self._staged_position
        self._changes = conn.total_changes

    def forget(self) -> None:
        """Forget everything (a transaction that failed, or whose commit raised)."""
        self._runs.clear()
        self._staged.clear()
        self._position = self._staged_position = None
        self._version = None
