"""The store a command works on: which one, opened how, and runfold's errors as exit codes.

A command's store is its own `--store`, else the one given before the command's name, else
`$RUNFOLD_STORE`, else `sqlite:///runfold.db`; the commands that look at runs (`runs`, `show`,
`history`, `ui`) take `$RUNFOLD_READ_STORE` before `$RUNFOLD_STORE` (a replica, say). Commands
that only look open it read-only, so they never create, migrate or lock it; every runfold error
a command's work raises ends as one line and a documented exit code; and the store is always
closed. A PostgreSQL store is shown without its password.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import click

from runfold.cli.exit_codes import (
    EXIT_DATA,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_STORE,
    EXIT_USAGE,
    CliError,
)
from runfold.cli.output import Terminal
from runfold.cli.state import DEFAULT_STORE, State
from runfold.kernel import (
    CorruptEvent,
    CorruptIndex,
    EventDecodeError,
    HistoryError,
    InvalidArgument,
    RunfoldError,
    RunNotFound,
    RunNotSupported,
    StoreError,
)
from runfold.stores import EventStore, conninfo, open_store

__all__ = ["DEFAULT_STORE", "State", "label", "store_url", "work_on_store"]


def label(url: str) -> str:
    """The store URL to show: a PostgreSQL one without its password (however it was given)."""
    if _is_postgres(url):
        return conninfo.describe(url)
    return url


def _is_postgres(url: str) -> bool:
    scheme, sep, _ = url.partition("://")
    return scheme in ("postgresql", "postgres") if sep else "=" in url


T = TypeVar("T")


def store_url(ctx: click.Context, command_store: str | None, *, looks: bool = False) -> str:
    """The URL of the store a command works on.

    Its own `--store`, else the group's, else `$RUNFOLD_STORE`, else `DEFAULT_STORE`. A command
    that `looks` (at runs, reading only) takes `$RUNFOLD_READ_STORE`, when set, before
    `$RUNFOLD_STORE`.
    """
    state = ctx.find_object(State)
    given = state.store if state is not None else None
    if command_store:
        return command_store
    if looks and os.environ.get("RUNFOLD_READ_STORE"):
        root = ctx.find_root()
        if root.get_parameter_source("store") is not click.core.ParameterSource.COMMANDLINE:
            return os.environ["RUNFOLD_READ_STORE"]
    return given or os.environ.get("RUNFOLD_STORE") or DEFAULT_STORE


def work_on_store(
    ctx: click.Context,
    command_store: str | None,
    work: Callable[[EventStore, Terminal], Awaitable[T]],
    *,
    read_only: bool,
    looks: bool = False,
) -> T:
    """Open the store, do `work`, close it, and turn runfold's errors into lines.

    `looks`: the command looks at runs (`store_url`).
    """
    state = ctx.find_object(State)
    assert state is not None
    url = store_url(ctx, command_store, looks=looks)
    return asyncio.run(_with_store(url, work, state.terminal, read_only=read_only))


async def _with_store(
    url: str,
    work: Callable[[EventStore, Terminal], Awaitable[T]],
    terminal: Terminal,
    *,
    read_only: bool,
) -> T:
    store = await _open(url, read_only=read_only)
    try:
        return await work(store, terminal)
    except RunNotFound as exc:
        raise CliError(str(exc), EXIT_NOT_FOUND) from None
    except InvalidArgument as exc:  # e.g. an id given as bytes that are not UTF-8
        raise CliError(str(exc), EXIT_USAGE) from None
    except CorruptIndex as exc:
        raise CliError(
            f"{exc} (`runfold verify --rebuild-index` rewrites them)", EXIT_DATA
        ) from None
    except (CorruptEvent, HistoryError, EventDecodeError, RunNotSupported) as exc:
        raise CliError(str(exc), EXIT_DATA) from None
    except StoreError as exc:
        raise CliError(f"store {label(url)}: {exc}", EXIT_STORE) from None
    except RunfoldError as exc:
        raise CliError(f"{exc} [{exc.code}]", EXIT_FAILED) from None
    finally:
        await store.close()


async def _open(url: str, *, read_only: bool) -> EventStore:
    """Open the store at `url`; read-only, a SQLite file must exist and nothing is migrated."""
    if url.startswith("sqlite:///") and read_only:
        path = url[len("sqlite:///") :]
        if path and path != ":memory:" and not Path(path).exists():
            raise CliError(
                f"no store at {path} (`runfold demo` or `runfold migrate` creates one; "
                "or pass --store)",
                EXIT_STORE,
            )
    try:
        return await open_store(url, read_only=read_only)
    except ValueError as exc:
        raise CliError(f"bad store URL: {exc}", EXIT_USAGE) from None
    except ImportError as exc:
        if _is_postgres(url):
            raise CliError(
                f"cannot open {label(url)}: PostgreSQL stores need psycopg and libpq: pip install "
                "'runfold[postgres]' (or 'runfold[postgres-binary]' without a system libpq) "
                f"[{exc}]",
                EXIT_STORE,
            ) from None
        missing = f"cannot open {label(url)}: a driver is missing ({exc})"
        raise CliError(missing, EXIT_STORE) from None
    except (StoreError, OSError) as exc:
        raise CliError(f"cannot open {label(url)}: {exc}", EXIT_STORE) from None
