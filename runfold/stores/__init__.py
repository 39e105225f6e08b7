"""Stores: the `EventStore` protocol, `StoreBase`, the backends, and `open_store(url)`.

The backends are imported on first use, so that `import runfold` loads no database driver:
`SQLiteStore` needs aiosqlite, `PostgresStore` psycopg (the optional `postgres` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runfold.stores import conninfo
from runfold.stores.base import StoreBase
from runfold.stores.due_work import DueWork
from runfold.stores.leases import WorkerLeases
from runfold.stores.memory import MemoryStore
from runfold.stores.protocol import EventStore, FeedSubscriber, IndexRewriter, SchemaMigrator

if TYPE_CHECKING:
    from runfold.stores.postgres import PostgresStore
    from runfold.stores.sqlite import SQLiteStore

__all__ = [
    "DueWork",
    "EventStore",
    "FeedSubscriber",
    "IndexRewriter",
    "MemoryStore",
    "PostgresStore",
    "SQLiteStore",
    "SchemaMigrator",
    "StoreBase",
    "WorkerLeases",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """`SQLiteStore` and `PostgresStore`, imported on first use."""
    if name == "SQLiteStore":
        from runfold.stores.sqlite import SQLiteStore

        return SQLiteStore
    if name == "PostgresStore":
        from runfold.stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _shown(url: str) -> str:
    """`url` as an error quotes it: a mistyped URL may still hold a password. (Only when
    raising: the scrubber loads libpq's parser, which a SQLite store does not need.)"""
    return repr(conninfo.scrub(url, url))


async def open_store(url: str, *, read_only: bool = False) -> EventStore:
    """Open the store a URL names: `memory://`, `sqlite:///path.db`, `postgresql://…`.

    A libpq keyword string (`host=db.internal dbname=app`) names a PostgreSQL store too.

    With `read_only`, nothing is created or migrated: a SQLite file is opened read-only (it
    must exist), a PostgreSQL schema must already be at this runfold's version. That is how
    commands that only look open a store.

    Raises `ValueError` for a scheme runfold does not know, `ImportError` for PostgreSQL
    without the `postgres` extra, and what the store's `open` raises.
    """
    scheme, sep, _ = url.partition("://")
    if not sep and "=" in url:
        scheme = "postgresql"
    elif not sep:
        raise ValueError(
            f"not a store URL: {_shown(url)} (expected memory://, sqlite:///…, postgresql://…)"
        )
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        from runfold.stores.sqlite import SQLiteStore

        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise ValueError(f"SQLite store URLs look like sqlite:///path.db, not {_shown(url)}")
        return await SQLiteStore.open(path, read_only=read_only)
    if scheme in ("postgresql", "postgres"):
        from runfold.stores.postgres import PostgresStore

        return await PostgresStore.open(url, migrate=not read_only)
    raise ValueError(f"unsupported store scheme {scheme!r} in {_shown(url)}")
