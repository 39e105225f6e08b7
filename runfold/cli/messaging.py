"""`runfold send RUN_ID MESSAGE [--topic T]`: a message for a `runfold.flow` workflow's `recv`.

The message is recorded as `Flow.send` records it (`runfold.flow.messages`): a delivery of the
run's mailbox hook for the topic, which is created first when the workflow has not asked yet,
so a message sent early is kept. It is encoded with `JsonCodec`, the flow's default. Unlike
`Flow.send`, the command line does not drive the run (it has not the workflow's code): the run
takes the message when its host drives it next (a running worker, or `runfold resume`).
"""

from __future__ import annotations

import contextlib
import json
import sys

import click

from runfold.cli.completion import complete_run_id
from runfold.cli.exit_codes import EXIT_OK, EXIT_USAGE, CliError
from runfold.cli.options import json_option, store_option
from runfold.cli.output import Terminal, to_json
from runfold.cli.store_access import work_on_store
from runfold.flow import JsonCodec
from runfold.flow.messages import mailbox_hook
from runfold.handler import CommandHandler
from runfold.kernel import CreateHook, EntityConflict, HookNotFound, HookReceived
from runfold.stores import EventStore


@click.command()
@click.argument("run_id", metavar="RUN_ID", shell_complete=complete_run_id)
@click.argument("message", metavar="MESSAGE")
@click.option("--topic", metavar="T", help="the topic the workflow's recv waits on (default none)")
@click.option(
    "--value",
    "as_value",
    is_flag=True,
    help="MESSAGE is JSON: recv gets the value it writes (a number, a list …), not the text",
)
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="names this message: the same key with the same message again records it once",
)
@json_option
@store_option
@click.pass_context
def send(
    ctx: click.Context,
    run_id: str,
    message: str,
    topic: str | None,
    as_value: bool,
    idempotency_key: str | None,
    as_json: bool,
    command_store: str | None,
) -> int:
    """Send MESSAGE (text, or - to read bytes from stdin) to the live run RUN_ID.

    For a runfold.flow workflow's recv(topic): the message is recorded in the run at once and
    kept until a recv takes it; the run goes on when its host drives it next (a running
    worker, or runfold resume).
    """
    value: object
    if message == "-":
        value = sys.stdin.buffer.read()
    elif as_value:
        try:
            value = json.loads(message)
        except ValueError as exc:
            raise CliError(f"--value: MESSAGE is not JSON ({exc})", EXIT_USAGE) from None
    else:
        value = message
    encoded = JsonCodec().encode(value)
    hook_id, token, metadata = mailbox_hook(run_id, topic)

    async def work(store: EventStore, terminal: Terminal) -> int:
        handler = CommandHandler(store)
        for _ in range(2):
            try:
                outcome = await handler.deliver(token, encoded, delivery_id=idempotency_key)
            except HookNotFound:  # no mailbox yet: make it (the run must be live), then deliver
                create = CreateHook(hook_id=hook_id, token=token, metadata=metadata)
                with contextlib.suppress(EntityConflict):  # made meanwhile
                    await handler.execute(run_id, create)
                continue
            snapshot = outcome.snapshot
            if as_json:
                terminal.json(to_json(snapshot))
                return EXIT_OK
            received = any(isinstance(e.event, HookReceived) for e in outcome.appended)
            again = "" if received else " (already sent: nothing changed)"
            where = f" on topic {topic}" if topic is not None else ""
            terminal.line(
                f"sent to run {snapshot.run_id}{where}{again}  ", terminal.status(snapshot.status)
            )
            return EXIT_OK
        raise CliError(f"run {run_id}: its mailbox could not be made", EXIT_USAGE)

    return work_on_store(ctx, command_store, work, read_only=False)
