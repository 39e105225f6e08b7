"""Stores: the `EventStore` protocol and its backends, and `open_store(url)`."""

from __future__ import annotations

from runfold.stores.memory import MemoryStore
from runfold.stores.protocol import EventStore
from runfold.stores.sqlite import SQLiteStore

__all__ = ["EventStore", "MemoryStore", "SQLiteStore", "open_store"]


async def open_store(url: str) -> EventStore:
    """Open the store a URL names: `memory://`, `sqlite:///path.db`, `postgresql://…`.

    Raises `ValueError` for a scheme runfold does not know.
    """
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"not a store URL: {url!r} (expected memory://, sqlite:///…)")
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise ValueError(f"SQLite store URLs look like sqlite:///path.db, not {url!r}")
        return await SQLiteStore.open(path)
    raise ValueError(f"unsupported store scheme {scheme!r} in {url!r}")
