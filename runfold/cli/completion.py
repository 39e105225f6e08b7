"""Shell completion of run ids and workflow names, from the store the command line names.

click asks these when a shell completes a word (`eval "$(_RUNFOLD_COMPLETE=bash_source
runfold)"`, see the CLI reference): they open the store read-only (`--store` if already typed,
else `$RUNFOLD_STORE`, else the default), read the newest `CANDIDATES_READ` runs and offer the
ids, or the workflow names, that start with what was typed. A store that cannot be opened or
read offers nothing: completion never prints an error into the user's prompt.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from runfold.cli.state import DEFAULT_STORE

__all__ = ["CANDIDATES_READ", "complete_run_id", "complete_workflow"]

CANDIDATES_READ = 1_000
"""How many of the newest runs completion reads for candidates."""


def _store_url(ctx: click.Context) -> str:
    context: click.Context | None = ctx
    while context is not None:
        for name in ("command_store", "store"):
            given = context.params.get(name)
            if isinstance(given, str) and given:
                return given
        context = context.parent
    return os.environ.get("RUNFOLD_STORE") or DEFAULT_STORE


async def _summaries(url: str) -> list[tuple[str, str]]:
    """(run id, workflow name) of the newest runs, newest first."""
    from runfold.stores import open_store

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return []  # read-only opening would refuse it anyway; never create one
    store = await open_store(url, read_only=True)
    found: list[tuple[str, str]] = []
    try:
        cursor: str | None = None
        while len(found) < CANDIDATES_READ:
            page = await store.list_runs(cursor=cursor, limit=min(500, CANDIDATES_READ))
            found += [(s.run_id, s.workflow_name) for s in page.items]
            if not page.has_more or page.cursor is None:
                break
            cursor = page.cursor
    finally:
        await store.close()
    return found


def _candidates(ctx: click.Context) -> list[tuple[str, str]]:
    try:
        return asyncio.run(_summaries(_store_url(ctx)))
    except Exception:  # a bad URL, a missing driver, a server down: offer nothing
        return []


def complete_run_id(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Run ids of the store that start with `incomplete`, newest first, with their workflow."""
    return [
        CompletionItem(run_id, help=workflow)
        for run_id, workflow in _candidates(ctx)
        if run_id.startswith(incomplete)
    ]


def complete_workflow(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Workflow names of the store's newest runs that start with `incomplete`."""
    names = dict.fromkeys(workflow for _, workflow in _candidates(ctx))
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]
