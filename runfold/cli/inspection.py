"""The commands that look at runs without changing them: `runs`, `show`, `history` and `ui`.

`runs` lists runs a page at a time, `show` prints a run's snapshot and `history` its events, as
text or JSON; `ui` serves a web inspector of the same. They open the store read-only: they never
create, migrate or lock it, and do not wait for a process that is writing.
"""

from __future__ import annotations

import shlex
from typing import get_args

import click
from click.core import ParameterSource

from runfold.cli.completion import complete_workflow
from runfold.cli.exit_codes import EXIT_NOT_FOUND, EXIT_OK, EXIT_STORE, EXIT_USAGE, CliError
from runfold.cli.options import json_option, on_a_run, store_option
from runfold.cli.output import Terminal, envelope_json, render_snapshot, render_timeline, to_json
from runfold.cli.store_access import label, store_url, work_on_store
from runfold.cli.values import hook_status, timestamp
from runfold.handler import CommandHandler
from runfold.kernel import RunStatus, StoreError
from runfold.stores import EventStore


@click.command()
@click.option("--status", type=click.Choice(get_args(RunStatus)), help="only runs in this status")
@click.option("--workflow", help="only runs of this workflow", shell_complete=complete_workflow)
@click.option("--version", metavar="V", help="only runs started on code version V")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="runs per page"
)
@click.option("--cursor", help="continue after a page (printed when there are more)")
@json_option
@store_option
@click.pass_context
def runs(
    ctx: click.Context,
    status: RunStatus | None,
    workflow: str | None,
    version: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    command_store: str | None,
) -> int:
    """List runs, newest first, a page at a time (read-only)."""

    async def work(store: EventStore, terminal: Terminal) -> int:
        try:
            if version is not None:  # the listing has no version column (`version_page`)
                from runfold.cli.deploys import version_page  # the flow, only when asked

                page = await version_page(
                    store, version, workflow=workflow, status=status, cursor=cursor, limit=limit
                )
            else:
                page = await store.list_runs(
                    workflow_name=workflow, status=status, cursor=cursor, limit=limit
                )
        except ValueError as exc:  # a cursor that is not one of ours
            raise CliError(str(exc), EXIT_USAGE) from None
        if as_json:
            terminal.json(
                {
                    "runs": [to_json(s) for s in page.items],
                    "cursor": page.cursor,
                    "has_more": page.has_more,
                }
            )
            return EXIT_OK
        terminal.table(
            ("RUN", "WORKFLOW", "STATUS", "CREATED", "UPDATED", "EVENTS"),
            [
                (
                    s.run_id,
                    s.workflow_name,
                    s.status,
                    timestamp(s.created_at),
                    timestamp(s.updated_at),
                    str(s.last_sequence),
                )
                for s in page.items
            ],
            status_column=2,
        )
        if page.has_more and page.cursor is not None:
            again = ["runfold", "runs"]
            for option, value in (("--status", status), ("--workflow", workflow)):
                if value is not None:
                    again += [option, value]
            if limit != 20:
                again += ["--limit", str(limit)]
            given = _given_store(ctx, command_store)
            if given is not None:  # not from $RUNFOLD_STORE, which the next command has too
                again += ["--store", label(given)]
            terminal.line("more: " + shlex.join([*again, "--cursor", page.cursor]))
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=True, looks=True)


def _given_store(ctx: click.Context, command_store: str | None) -> str | None:
    """The store given with `--store` (before or after the command), None if from the
    environment or the default."""
    if command_store is not None:
        return command_store
    parent = ctx.parent
    if parent is not None and parent.get_parameter_source("store") is ParameterSource.COMMANDLINE:
        return store_url(ctx, None)
    return None


@click.command()
@on_a_run
def show(ctx: click.Context, run_id: str, as_json: bool, command_store: str | None) -> int:
    """A run's snapshot: steps, waits, hooks, progress, attributes (read-only)."""

    async def work(store: EventStore, terminal: Terminal) -> int:
        snapshot = await CommandHandler(store).snapshot(run_id)
        if as_json:
            shown = to_json(snapshot)
            for hook_id, hook in snapshot.hooks.items():
                shown["hooks"][hook_id]["status"] = hook_status(snapshot, hook)
            terminal.json(shown)
        else:
            render_snapshot(terminal, snapshot)
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=True, looks=True)


@click.command()
@on_a_run
def history(ctx: click.Context, run_id: str, as_json: bool, command_store: str | None) -> int:
    """A run's events, one line each (read-only)."""

    async def work(store: EventStore, terminal: Terminal) -> int:
        events = await store.read(run_id)
        if not events:
            raise CliError(f"run {run_id!r} not found", EXIT_NOT_FOUND)
        if as_json:
            terminal.json([envelope_json(e) for e in events])
        else:
            render_timeline(terminal, events)
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=True, looks=True)


@click.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="where to listen (loopback by default)"
)
@click.option(
    "--port", default=8765, show_default=True, type=click.IntRange(0, 65535), help="the port"
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="offer cancel and deliver (and resume, with --runtime) on run pages, CSRF-checked",
)
@click.option(
    "--runtime",
    "target",
    metavar="MODULE:FACTORY",
    help="the runtime the resume action drives runs with (as runfold resume takes it)",
)
@store_option
@click.pass_context
def ui(
    ctx: click.Context,
    host: str,
    port: int,
    allow_actions: bool,
    target: str | None,
    command_store: str | None,
) -> int:
    """Serve a web inspector of the store's runs until stopped (the `ui` extra).

    Read-only unless --allow-actions: then run pages also offer cancel, deliver and (with
    --runtime) resume, each a POST checked for the page's origin, its session cookie and the
    session's token.
    """
    if target is not None and not allow_actions:
        raise CliError("--runtime is for the resume action: give --allow-actions too", EXIT_USAGE)
    url = store_url(ctx, command_store, looks=True)
    from runfold.cli.runtimes import RuntimeLoadError  # here: it brings the engine

    try:
        from runfold import ui as inspector
    except ImportError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    try:
        inspector.serve(url, host=host, port=port, allow_actions=allow_actions, runtime=target)
    except RuntimeLoadError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    except ValueError as exc:
        raise CliError(f"bad store URL: {exc}", EXIT_USAGE) from None
    except StoreError as exc:
        raise CliError(f"cannot open {label(url)}: {exc}", EXIT_STORE) from None
    except OSError as exc:  # serve's own: the address cannot be listened on (it names it)
        raise CliError(exc.strerror or str(exc), EXIT_USAGE) from None
    return EXIT_OK
