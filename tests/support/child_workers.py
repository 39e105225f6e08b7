"""Child worker processes: the store one opens, from the JSON arguments its test passes it.

The tests that kill a worker or let one exit spawn `python -m tests.support.NAME '<json>'`; the
arguments name the backend, `{"backend": "sqlite", "path": ...}` or `{"backend": "postgres",
"dsn": ..., "schema": ...}`, and every worker opens it the same way. This module imports only
runfold (no pytest), so a child starts quickly.
"""

from __future__ import annotations

from typing import Any

from runfold.stores import PostgresStore, SQLiteStore
from runfold.stores.protocol import EventStore


async def open_backend(args: dict[str, Any]) -> EventStore:
    """The store `args` names: the SQLite file `path`, or the PostgreSQL `schema` at `dsn` (a
    pool of two connections)."""
    if args["backend"] == "sqlite":
        return await SQLiteStore.open(args["path"])
    return await PostgresStore.open(args["dsn"], schema=args["schema"], pool_max=2)
