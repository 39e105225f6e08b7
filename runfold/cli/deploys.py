"""The commands of a deploy: `replay-check`, `export`, `import` and `fork`.

`replay-check --app MODULE` replays the store's recorded runs against the workflows MODULE
defines now (`runfold.flow.replay.ReplayChecker`) and exits 1 on any divergence, naming the
run, the call, what was recorded and what the code asks for: run it in CI against a copy of
production's runs before a deploy. `export` writes runs as JSON lines (`runfold.transfer`), for
`runfold.testing.replay` in tests, bug reports, or `import` into another store. `fork` makes a
new run of a run from a step, on MODULE's code (`Flow.fork`); `runfold resume` of a failed or
cancelled run restarts it so (`restart_ended`).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import click

from runfold.cli.exit_codes import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from runfold.cli.fleet import import_app
from runfold.cli.inert import inert_json
from runfold.cli.options import json_option, store_option
from runfold.cli.output import Terminal
from runfold.cli.store_access import work_on_store
from runfold.engine import WorkflowRuntime
from runfold.engine.versions import VersionFilter
from runfold.flow import Flow, FlowRun, registered_workflows
from runfold.flow.definition import Workflow
from runfold.flow.replay import ReplayChecker, ReplayResult
from runfold.handler import CommandHandler
from runfold.kernel import Page, RunStatus, RunSummary
from runfold.stores import EventStore
from runfold.stores.paging import runs_page
from runfold.stores.protocol import replay_run
from runfold.transfer import ExportFormatError, export_runs, import_runs, read_export

_PAGE = 500


def _moment(value: str) -> datetime:
    """An ISO 8601 time given on the command line, UTC when it names no zone."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def _run_ids(
    store: EventStore, workflow: str | None, since: datetime | None, limit: int | None
) -> AsyncIterator[str]:
    """The ids of the store's runs, newest first: of `workflow`, created at or after `since`."""
    cursor, given = None, 0
    while True:
        page = await store.list_runs(workflow_name=workflow, cursor=cursor, limit=_PAGE)
        for summary in page.items:
            if since is not None and summary.created_at < since:
                return
            if limit is not None and given >= limit:
                return
            given += 1
            yield summary.run_id
        if not page.has_more:
            return
        cursor = page.cursor


def _result_json(result: ReplayResult) -> dict[str, object]:
    divergence = result.divergence
    return {
        "run_id": result.run_id,
        "workflow_name": result.workflow_name,
        "workflow_version": result.workflow_version,
        "status": result.status,
        "passed": result.passed,
        "divergence": None
        if divergence is None
        else {"call": divergence.call, "recorded": divergence.recorded, "asked": divergence.asked},
    }


@click.command("replay-check")
@click.option(
    "--app",
    "module",
    required=True,
    metavar="MODULE",
    help="the module whose @workflow functions to check (the code to deploy)",
)
@click.option("--workflow", help="only runs of this workflow")
@click.option("--since", metavar="TIME", help="only runs created at or after TIME (ISO 8601)")
@click.option("--limit", type=click.IntRange(min=1), help="at most this many runs, newest first")
@json_option
@store_option
@click.pass_context
def replay_check(
    ctx: click.Context,
    module: str,
    workflow: str | None,
    since: str | None,
    limit: int | None,
    as_json: bool,
    command_store: str | None,
) -> int:
    """Replay recorded runs against MODULE's workflow code; exit 1 on any divergence.

    Nothing runs and nothing is written: each run's workflow function is fed its recorded
    results, and the first call where the code asks for something else is reported.
    """
    after = None if since is None else _moment(since)
    checker = ReplayChecker(_served(module))

    async def work(store: EventStore, terminal: Terminal) -> int:
        results: list[ReplayResult] = []
        async for run_id in _run_ids(store, workflow, after, limit):
            replayed = await replay_run(store, run_id)
            if replayed is None:  # deleted since it was listed
                continue
            result = checker.check(replayed.snapshot)
            results.append(result)
            if not as_json and not result.passed:
                terminal.line(f"DIVERGED {result.run_id} ({result.workflow_name}):")
                terminal.line(f"  {result.divergence}")
        diverged = sum(not r.passed for r in results)
        if as_json:
            terminal.json({"runs": [_result_json(r) for r in results], "diverged": diverged})
        else:
            terminal.line(
                f"{len(results)} runs replayed: {len(results) - diverged} passed, "
                f"{diverged} diverged"
            )
        return EXIT_FAILED if diverged else EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=True, looks=True)


@click.command("export")
@click.argument("run_ids", nargs=-1, metavar="[RUN_ID]...")
@click.option("--all", "every", is_flag=True, help="every run of the store (or of --workflow)")
@click.option("--workflow", help="with --all: only runs of this workflow")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write to this file (default: standard output)",
)
@store_option
@click.pass_context
def export(
    ctx: click.Context,
    run_ids: tuple[str, ...],
    every: bool,
    workflow: str | None,
    out: Path | None,
    command_store: str | None,
) -> int:
    """Write runs (RUN_ID..., or --all) as JSON lines, one run a line (read-only).

    The lines hold the runs' events as stored, payloads and hook tokens included.
    """
    if bool(run_ids) == every:
        raise click.UsageError("give RUN_IDs or --all (one of them)", ctx)

    async def work(store: EventStore, terminal: Terminal) -> int:
        if every:
            chosen = [run_id async for run_id in _run_ids(store, workflow, None, None)]
        else:
            chosen = list(run_ids)
            missing = [
                run_id
                for run_id, found in zip(chosen, await store.get_runs(chosen), strict=True)
                if found is None
            ]
            if missing:
                raise CliError(f"no such run: {missing[0]}", EXIT_NOT_FOUND)
        target = sys.stdout if out is None else out.open("w", encoding="utf-8")
        try:
            async for line in export_runs(store, chosen):
                target.write((line if out is not None else inert_json(line)) + "\n")
        finally:
            if out is not None:
                target.close()
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=True, looks=True)


@click.command("import")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
@store_option
@click.pass_context
def import_(ctx: click.Context, source: Path, as_json: bool, command_store: str | None) -> int:
    """Add the runs of an export file (SOURCE) to the store, each as a new run.

    Refused, with nothing written, when a run already exists in the store.
    """
    try:
        with source.open(encoding="utf-8") as lines:
            histories = list(read_export(lines))
    except ExportFormatError as exc:
        raise CliError(f"{source}: {exc}", EXIT_USAGE) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {source}: {exc}", EXIT_USAGE) from None

    async def work(store: EventStore, terminal: Terminal) -> int:
        count = await import_runs(store, histories)
        if as_json:
            terminal.json({"imported": count})
        else:
            terminal.line(f"imported {count} runs")
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)


def _served(module: str) -> list[Workflow]:
    import_app(module)
    served = registered_workflows()
    if not served:
        raise CliError(f"--app {module!r} defines no @workflow", EXIT_USAGE)
    return list(served)


@click.command("fork")
@click.argument("run_id", metavar="RUN_ID")
@click.option(
    "--from-step",
    "from_step",
    type=click.IntRange(min=1),
    required=True,
    metavar="N",
    help="the first call to run anew (calls before it reuse their recorded outcomes)",
)
@click.option(
    "--app",
    "module",
    required=True,
    metavar="MODULE",
    help="the module whose @workflow functions run the fork",
)
@click.option("--new-id", "new_run_id", metavar="ID", help="the new run's id (default: made up)")
@json_option
@store_option
@click.pass_context
def fork(
    ctx: click.Context,
    run_id: str,
    from_step: int,
    module: str,
    new_run_id: str | None,
    as_json: bool,
    command_store: str | None,
) -> int:
    """Make a new run of RUN_ID that reuses its outcomes before step N and runs the rest.

    Steps before N are not run again; the new run is linked to RUN_ID (`$forked_from`) and is
    driven on MODULE's code until it ends or waits.
    """
    served = _served(module)

    async def work(store: EventStore, terminal: Terminal) -> int:
        forked = await Flow(store, served).fork(run_id, from_step=from_step, new_run_id=new_run_id)
        _report(terminal, run_id, forked, as_json)
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)


def _report(terminal: Terminal, run_id: str, forked: FlowRun, as_json: bool) -> None:
    if as_json:
        terminal.json({"forked_from": run_id, "run_id": forked.run_id, "status": forked.status})
    else:
        terminal.line(
            f"run {forked.run_id}  ", terminal.status(forked.status), f"  (from {run_id})"
        )


async def restart_ended(
    store: EventStore, runtime: WorkflowRuntime, run_id: str, terminal: Terminal
) -> bool:
    """`runfold resume RUN_ID` of a failed or cancelled run: restart it (`Flow.restart`) when
    the runtime is a `Flow`, and say so; whether it did."""
    if not isinstance(runtime, Flow):
        return False
    snapshot = await runtime.handler.lookup(run_id)
    if snapshot is None or snapshot.status not in ("failed", "cancelled"):
        return False  # unknown (`resume` says so) or not ended so
    _report(terminal, run_id, await runtime.restart(run_id), as_json=False)
    return True


async def version_page(
    store: EventStore,
    version: str,
    *,
    workflow: str | None,
    status: RunStatus | None,
    cursor: str | None,
    limit: int,
) -> Page[RunSummary]:
    """`runfold runs --version V`: a page of the runs started on code version V, newest first.

    The store's listing has no version column: its pages are read, and each run's version is
    read once from its first event, until `limit` runs of V and one more are found (or the runs
    end). The cursor is the bundled stores' (`runs_page`).
    """
    versions = VersionFilter(CommandHandler(store), {version})
    found: list[RunSummary] = []
    while True:
        page = await store.list_runs(
            workflow_name=workflow, status=status, cursor=cursor, limit=max(limit, _PAGE)
        )
        found.extend([s for s in page.items if await versions.version_of(s.run_id) == version])
        if len(found) > limit or not page.has_more:
            return runs_page(found, limit)
        cursor = page.cursor
