"""Stores: the `EventStore` protocol and its backends, and `open_store(url)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runfold.stores.memory import MemoryStore
from runfold.stores.protocol import EventStore
from runfold.stores.sqlite import SQLiteStore

if TYPE_CHECKING:
    from runfold.stores.postgres import PostgresStore

__all__ = ["EventStore", "MemoryStore", "PostgresStore", "SQLiteStore", "open_store"]


def __getattr__(name: str) -> Any:
    """`PostgresStore`, imported on first use: psycopg is the optional `postgres` extra."""
    if name == "PostgresStore":
        from runfold.stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


async def open_store(url: str) -> EventStore:
    """Open the store a URL names: `memory://`, `sqlite:///path.db`, `postgresql://…`.

    Raises `ValueError` for a scheme runfold does not know, `ImportError` for `postgresql://`
    without the `postgres` extra, and what the store's `open` raises.
    """
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(
            f"not a store URL: {url!r} (expected memory://, sqlite:///…, postgresql://…)"
        )
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise ValueError(f"SQLite store URLs look like sqlite:///path.db, not {url!r}")
        return await SQLiteStore.open(path)
    if scheme in ("postgresql", "postgres"):
        from runfold.stores.postgres import PostgresStore

        return await PostgresStore.open(url)
    raise ValueError(f"unsupported store scheme {scheme!r} in {url!r}")
