"""The connection thread: opening an aiosqlite connection, and running functions on its thread.

aiosqlite runs each of its calls as a function queued to the connection's thread; the store hands
it whole functions of its own (`on_thread`), so that a transaction costs one thread hop instead
of one per statement.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import aiosqlite

from runfold.kernel import StoreOpenError, StoreUnavailable

__all__ = ["connect", "on_thread", "ready", "result_code"]

T = TypeVar("T")


async def connect(location: str, target: str) -> aiosqlite.Connection:
    """A connection to `target` (a path, or a `file:` URI), in autocommit mode."""
    connecting = aiosqlite.connect(target, isolation_level=None, uri=target.startswith("file:"))
    # aiosqlite's thread is not a daemon: a store never closed (a script that raises, Ctrl-C, a
    # store kept in a global) would make the interpreter wait for it at exit for ever. As a
    # daemon it ends with the process; what it was writing is then rolled back like after a
    # crash, and nothing unwritten was acknowledged.
    connecting._thread.daemon = True
    try:
        return await connecting
    except sqlite3.Error as exc:
        # On a failed connect aiosqlite stops its worker thread with a future nobody awaits;
        # let the thread end while this loop runs, or it posts to a closed loop and raises.
        for _ in range(5000):
            if not connecting._thread.is_alive():
                break
            await asyncio.sleep(0.001)
        raise StoreOpenError(f"cannot open SQLite store {location!r}: {exc}") from None


async def ready(
    db: aiosqlite.Connection, location: str, prepare: Callable[..., T], *args: Any
) -> T:
    """`prepare(connection, *args)`, its driver errors as runfold's; `db` closed if it fails."""
    try:
        return await on_thread(db, prepare, *args)
    except StoreOpenError:
        await db.close()
        raise
    except sqlite3.Error as exc:
        await db.close()
        if result_code(exc) == sqlite3.SQLITE_BUSY:
            # Another connection held the write lock past busy_timeout: transient.
            raise StoreUnavailable(f"SQLite store {location!r} is busy: {exc}") from None
        raise StoreOpenError(f"cannot use SQLite store {location!r}: {exc}") from exc


def result_code(exc: sqlite3.Error) -> int:
    """The primary result code of a driver error (0 if it has none)."""
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


async def on_thread(db: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(sqlite3_connection, *args)` on aiosqlite's connection thread, in one hop.

    aiosqlite executes each of its own calls as a function queued to that thread (`_execute`);
    handing it our function is how a whole transaction costs one hop instead of one per
    statement. `_execute` and `_conn` are aiosqlite internals, stable since 0.17; the test suite
    runs against the installed version.
    """
    call = _Call(fn, args)
    result: T = await db._execute(call, db._conn)  # type: ignore[no-untyped-call]
    return result


class _Call:
    """`fn(connection, *args)`, shown by its function's name alone.

    aiosqlite logs every call it runs, with its arguments, at DEBUG; ours carry hook tokens
    (`find_hook`, appends that claim one), which must never reach a log.
    """

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args

    def __call__(self, conn: sqlite3.Connection) -> Any:
        return self.fn(conn, *self.args)

    def __repr__(self) -> str:
        return f"<runfold SQLite call {getattr(self.fn, '__name__', 'function')}>"
