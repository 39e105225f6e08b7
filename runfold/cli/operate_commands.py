"""The commands an operator uses on runs from outside their workflows: `cancel`, `resume`,
`delete`, `deliver`.

`cancel` ends a live run whose process is gone, `resume` drives interrupted or due runs with the
operator's own runtime, `delete` removes ended runs (one, or those that ended before a time),
`deliver` hands a payload to the hook that holds a token, as a webhook caller would.
What they do is `runfold.cli.operate`, on the public API; here are their options and output.
"""

from __future__ import annotations

import sys
from datetime import datetime

import click

from runfold.cli import operate, runtimes
from runfold.cli.completion import complete_run_id
from runfold.cli.exit_codes import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError
from runfold.cli.options import json_option, on_a_run, store_option
from runfold.cli.output import Terminal, to_json
from runfold.cli.store_access import work_on_store
from runfold.cli.values import timestamp
from runfold.handler import CommandHandler
from runfold.kernel import HookReceived
from runfold.stores import EventStore


@click.command()
@click.option("--reason", help="why (recorded in the run's history)")
@on_a_run
def cancel(
    ctx: click.Context, run_id: str, reason: str | None, as_json: bool, command_store: str | None
) -> int:
    """End a live run as cancelled now, without asking its workflow (no cleanup steps).

    Idempotent on a cancelled run; a run that ended otherwise is refused (exit 1).
    """

    async def work(store: EventStore, terminal: Terminal) -> int:
        snapshot = await operate.cancel(store, run_id, reason)
        if as_json:
            terminal.json(to_json(snapshot))
        else:
            terminal.line(f"run {run_id}  ", terminal.status(snapshot.status))
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)


@click.command()
@click.option(
    "--runtime",
    "target",
    required=True,
    metavar="MODULE:FACTORY",
    help="a callable returning your WorkflowRuntime (imported with the current folder on the path)",
)
@click.argument("run_id", metavar="[RUN_ID]", required=False, shell_complete=complete_run_id)
@click.option("--due", is_flag=True, help="resume every run with a due timer or deadline")
@store_option
@click.pass_context
def resume(
    ctx: click.Context,
    target: str,
    run_id: str | None,
    due: bool,
    command_store: str | None,
) -> int:
    """Drive an interrupted run (RUN_ID), or the runs that are due (--due), with your runtime.

    Each run goes on to its next suspension: a timer, a hook, a delayed retry, or its end. A
    failed or cancelled RUN_ID, with a runtime that is a runfold.flow Flow, is restarted as a
    new run that reuses its outcomes up to its first call that did not complete.
    """
    if (run_id is None) == (not due):
        raise click.UsageError("give a RUN_ID or --due (one of them)", ctx)
    try:
        factory = runtimes.resolve_factory(target)
    except runtimes.RuntimeLoadError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None

    async def work(store: EventStore, terminal: Terminal) -> int:
        try:  # made on the command's store: a factory that takes one gets it
            runtime = runtimes.make_runtime(target, factory, store)
        except runtimes.RuntimeLoadError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        from runfold.cli.deploys import restart_ended  # the flow's: with a runtime at hand

        if run_id is not None and await restart_ended(store, runtime, run_id, terminal):
            return EXIT_OK  # a failed or cancelled run of a Flow: restarted as a new run
        resumed = await operate.resume(store, runtime, run_id)
        failed = False
        for one in resumed:
            if one.error is not None:
                failed = True
                terminal.line(f"run {one.run_id}  ", ("failed to resume", "red"), f": {one.error}")
            else:
                assert one.snapshot is not None
                terminal.line(f"run {one.run_id}  ", terminal.status(one.snapshot.status))
        if not resumed:
            terminal.line("nothing is due")
        return EXIT_FAILED if failed else EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)


@click.command()
@click.option(
    "--ended-before",
    "ended_before",
    metavar="TIME",
    help="delete the runs that ended before this ISO 8601 time (e.g. 2026-11-01T00:00:00Z)",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="delete at most this many runs (default: all)",
)
@click.argument("run_id", metavar="[RUN_ID]", required=False, shell_complete=complete_run_id)
@store_option
@click.pass_context
def delete(
    ctx: click.Context,
    ended_before: str | None,
    limit: int | None,
    run_id: str | None,
    command_store: str | None,
) -> int:
    """Delete one ended run (RUN_ID), or the runs that ended before a time (--ended-before).

    With all their rows. A run whose hook still retains its token is kept; a live run is never
    deleted. Run ids and tokens freed may be used again.
    """
    if (run_id is None) == (ended_before is None):
        raise click.UsageError("give a RUN_ID or --ended-before", ctx)
    if run_id is not None:

        async def one(store: EventStore, terminal: Terminal) -> int:
            if await operate.delete_run(store, run_id):
                terminal.line(f"deleted run {run_id}")
                return EXIT_OK
            if await store.head(run_id) == 0:
                raise CliError(f"run {run_id!r} not found", EXIT_NOT_FOUND)
            raise CliError(
                f"run {run_id!r} was not deleted: it is still live, or one of its hooks "
                "retains its token",
                EXIT_FAILED,
            )

        return work_on_store(ctx, command_store, one, read_only=False)
    assert ended_before is not None
    try:
        before = datetime.fromisoformat(ended_before)
    except ValueError:
        raise click.BadParameter(f"not an ISO 8601 time: {ended_before!r}") from None
    if before.tzinfo is None:
        raise click.BadParameter(f"give a time zone (e.g. Z): {ended_before!r}")

    async def work(store: EventStore, terminal: Terminal) -> int:
        deleted = await operate.delete_ended(store, before, limit)
        terminal.line(f"deleted {deleted} run(s) that ended before {timestamp(before)}")
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)


@click.command()
@click.argument("token", metavar="TOKEN")
@click.argument("payload", metavar="PAYLOAD")
@click.option(
    "--delivery-id",
    metavar="ID",
    help="names this delivery: the same id with the same payload again changes nothing",
)
@json_option
@store_option
@click.pass_context
def deliver(
    ctx: click.Context,
    token: str,
    payload: str,
    delivery_id: str | None,
    as_json: bool,
    command_store: str | None,
) -> int:
    """Deliver PAYLOAD (text, or - to read bytes from stdin) to the hook holding TOKEN.

    Records the delivery on the hook's run; the run goes on when its host drives it next (a
    running host, or runfold resume). The token is never printed.
    """
    data = sys.stdin.buffer.read() if payload == "-" else payload.encode()

    async def work(store: EventStore, terminal: Terminal) -> int:
        outcome = await CommandHandler(store).deliver(token, data, delivery_id=delivery_id)
        snapshot = outcome.snapshot
        if as_json:
            terminal.json(to_json(snapshot))
            return EXIT_OK
        received = [e.event for e in outcome.appended if isinstance(e.event, HookReceived)]
        hook = f"hook {received[0].hook_id} of " if received else ""
        again = "" if received else " (already delivered: nothing changed)"
        terminal.line(
            f"delivered to {hook}run {snapshot.run_id}{again}  ", terminal.status(snapshot.status)
        )
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)
