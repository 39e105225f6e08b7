"""runfold: an event-sourcing kernel for durable workflow runs.

The rules live in the pure kernel (`runfold.kernel`); stores (`runfold.stores`) only append
atomically; `CommandHandler` ties them together. Everything public is re-exported here: every
public name of `runfold.kernel`, plus the handler and the stores.
"""

from typing import TYPE_CHECKING, Any

from runfold import kernel as _kernel
from runfold.handler import CommandHandler, Outcome, new_run_id, utc_now
from runfold.kernel import *  # noqa: F403  (the kernel's public names are runfold's)
from runfold.store_retry import DEFAULT_STORE_RETRY, StoreFault, StoreRetry
from runfold.stores import EventStore, MemoryStore, open_store

if TYPE_CHECKING:
    from runfold.stores.postgres import PostgresStore

__version__ = "0.1.0"
"""The installed runfold's version."""

__all__ = [name for name in _kernel.__all__ if name != "errors"]
__all__ += [
    "DEFAULT_STORE_RETRY",
    "CommandHandler",
    "EventStore",
    "MemoryStore",
    "Outcome",
    "PostgresStore",
    "StoreFault",
    "StoreRetry",
    "__version__",
    "new_run_id",
    "open_store",
    "utc_now",
]


def __getattr__(name: str) -> Any:
    """`PostgresStore`, imported on first use: psycopg is the optional `postgres` extra."""
    if name == "PostgresStore":
        from runfold.stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
