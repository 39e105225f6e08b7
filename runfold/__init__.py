"""runfold: an event-sourcing kernel for durable workflow runs.

The top level holds the names an application starts with: a durable function (`Flow`,
`workflow`, `step`, `sleep`, `wait_for_event`), the `Engine` a runtime plugs into, the
`CommandHandler`, the stores (`open_store` and the three backends), `Snapshot` and
`RunfoldError`. Everything else has a module of its own: the events in `runfold.events`, the
commands in `runfold.commands`, every error class in `runfold.errors`, the complete kernel in
`runfold.kernel`.

The names are imported on first use (PEP 562): `import runfold.cli`, which every `runfold`
command does first, then costs nothing it does not need (`runfold --help` imports no kernel and
no store), and `PostgresStore` needs psycopg, the optional `postgres` extra, only when used.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:
    from runfold.engine import Engine as Engine
    from runfold.flow import Flow as Flow
    from runfold.flow import sleep as sleep
    from runfold.flow import step as step
    from runfold.flow import wait_for_event as wait_for_event
    from runfold.flow import workflow as workflow
    from runfold.handler import CommandHandler as CommandHandler
    from runfold.kernel import Snapshot as Snapshot
    from runfold.kernel.errors import RunfoldError as RunfoldError
    from runfold.stores import EventStore as EventStore
    from runfold.stores import MemoryStore as MemoryStore
    from runfold.stores import open_store as open_store
    from runfold.stores.postgres import PostgresStore as PostgresStore
    from runfold.stores.sqlite import SQLiteStore as SQLiteStore

__version__ = "0.1.0"
"""The installed runfold's version."""

_HOMES = {
    "Flow": "runfold.flow",
    "workflow": "runfold.flow",
    "step": "runfold.flow",
    "sleep": "runfold.flow",
    "wait_for_event": "runfold.flow",
    "Engine": "runfold.engine",
    "CommandHandler": "runfold.handler",
    "open_store": "runfold.stores",
    "EventStore": "runfold.stores",
    "MemoryStore": "runfold.stores",
    "SQLiteStore": "runfold.stores.sqlite",
    "PostgresStore": "runfold.stores.postgres",
    "Snapshot": "runfold.kernel",
    "RunfoldError": "runfold.kernel.errors",
}
"""Each public name, and the module it comes from."""

__all__ = [*_HOMES, "__version__"]


def __getattr__(name: str) -> _Any:
    """A public name, imported from its module on first use and kept."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
