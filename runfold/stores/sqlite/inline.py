"""Inline commits: appends written on the calling thread, through a second connection.

Handing a transaction to the driver's thread and awaiting it back costs about as much as the
commit itself, so appends that find no other in flight (alone, or several with nothing else
ready to run on the event loop meanwhile) are written on the event loop's own thread instead.
That connection never waits for the file's write lock (`busy_timeout = 0`): waiting there would
hold the event loop, so appends that find the lock taken (by another process, or by a repair on
the driver's thread) go to the driver's thread and wait there.
"""

from __future__ import annotations

import sqlite3

from runfold.kernel import Envelope, StoreUnavailable
from runfold.stores.sqlite.known import KnownRuns
from runfold.stores.sqlite.thread import result_code
from runfold.stores.sqlite.writer import Append, append_batch

__all__ = ["append_inline", "inline_connection"]

_LOCK_TAKEN = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def inline_connection(location: str, synchronous: str) -> sqlite3.Connection | None:
    """The connection of inline commits to the file at `location`, or None.

    It has the store's settings but never waits for a lock. There is none for an in-memory
    database (a second connection would open another one) or a `file:` URI.
    """
    if location == ":memory:" or location.startswith("file:"):
        return None
    conn = sqlite3.connect(location, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 0")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def append_inline(
    conn: sqlite3.Connection,
    batch: list[Append],
    location: str,
    known: KnownRuns | None = None,
) -> list[list[Envelope] | BaseException] | None:
    """`batch` written through `conn` on this thread, or None if the write lock is taken.

    None means nothing was written, and the appends must go to the driver's thread.
    """
    try:
        return append_batch(conn, batch, known)
    except sqlite3.OperationalError as exc:
        if result_code(exc) in _LOCK_TAKEN:
            return None  # nothing was written: BEGIN IMMEDIATE failed, or was rolled back
        raise StoreUnavailable(f"SQLite store {location!r}: {exc}") from None
