"""runfold: an event-sourcing kernel for durable workflow runs.

The rules live in the pure kernel (`runfold.kernel`); stores (`runfold.stores`) only append
atomically; `CommandHandler` ties them together. Everything public is re-exported here: every
public name of `runfold.kernel`, plus the handler and the stores.

The names are imported on first use (PEP 562): `import runfold.cli`, which every `runfold`
command does first, then costs nothing it does not need (`runfold --help` imports no kernel and
no store), and `PostgresStore` needs psycopg, the optional `postgres` extra, only when used.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runfold.handler import CommandHandler as CommandHandler
    from runfold.handler import Outcome as Outcome
    from runfold.handler import new_run_id as new_run_id
    from runfold.handler import utc_now as utc_now
    from runfold.kernel import *  # noqa: F403  (the kernel's public names are runfold's)
    from runfold.store_retry import DEFAULT_STORE_RETRY as DEFAULT_STORE_RETRY
    from runfold.store_retry import StoreFault as StoreFault
    from runfold.store_retry import StoreRetry as StoreRetry
    from runfold.stores import EventStore as EventStore
    from runfold.stores import MemoryStore as MemoryStore
    from runfold.stores import open_store as open_store
    from runfold.stores.postgres import PostgresStore as PostgresStore

__version__ = "0.1.0"
"""The installed runfold's version."""

_BEYOND_THE_KERNEL = {
    "DEFAULT_STORE_RETRY": "runfold.store_retry",
    "CommandHandler": "runfold.handler",
    "EventStore": "runfold.stores",
    "MemoryStore": "runfold.stores",
    "Outcome": "runfold.handler",
    "PostgresStore": "runfold.stores.postgres",
    "StoreFault": "runfold.store_retry",
    "StoreRetry": "runfold.store_retry",
    "new_run_id": "runfold.handler",
    "open_store": "runfold.stores",
    "utc_now": "runfold.handler",
}
"""The public names that are not the kernel's, and the module each comes from."""


def _public_names() -> list[str]:
    kernel = importlib.import_module("runfold.kernel")
    names = [name for name in kernel.__all__ if name != "errors"]
    return [*names, *_BEYOND_THE_KERNEL, "__version__"]


def __getattr__(name: str) -> Any:
    """A public name (or `__all__`), imported from its module on first use and kept."""
    if name == "__all__":
        value: Any = _public_names()
    elif name in _BEYOND_THE_KERNEL:
        value = getattr(importlib.import_module(_BEYOND_THE_KERNEL[name]), name)
    else:
        kernel = importlib.import_module("runfold.kernel")
        if name == "errors" or name not in kernel.__all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(kernel, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_public_names()})
