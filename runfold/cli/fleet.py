"""The commands of a fleet: `worker` serves an application's workflows, `workers` lists them.

`runfold worker --app MODULE` imports MODULE (its `@workflow` functions register as it loads),
then serves them with `Flow.serve` on the store until SIGTERM or Ctrl-C, and exits 0 once it
stopped gracefully. `runfold workers` shows each worker's lease and the live runs it owns.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType

import click

from runfold.cli.exit_codes import EXIT_OK, EXIT_USAGE, CliError
from runfold.cli.options import json_option, store_option
from runfold.cli.output import Terminal
from runfold.cli.store_access import work_on_store
from runfold.cli.values import timestamp
from runfold.engine import DEFAULT_LEASE, Queue
from runfold.flow import Flow, registered_workflows
from runfold.kernel import InvalidArgument, RunStatus, WorkerLease
from runfold.stores import EventStore, WorkerLeases


def import_app(module: str) -> None:
    """Import the application's module, with the current folder on the path."""
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        importlib.import_module(module)
    except Exception as exc:  # whatever the application's import raises is its own
        raise CliError(
            f"cannot import --app {module!r}: {type(exc).__name__}: {exc}", EXIT_USAGE
        ) from None


class _EarlyStop:
    """SIGTERM and Ctrl-C while the worker starts (MODULE importing, the store opening).

    Until the worker serves, the event loop's own handlers (`Flow.serve`) are not installed, and
    Python's defaults would kill the process (-15) or raise `KeyboardInterrupt`: a supervisor
    that stops a worker a moment after starting it would see a failure. Caught here instead, a
    stop that arrives early is handed to the worker once it serves, and it exits 0 as after any
    graceful stop, having claimed nothing.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested = False
        for signum in self.SIGNALS:
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def _queues(module: str, names: tuple[str, ...]) -> list[Queue]:
    """The queues to serve: those named (as MODULE declares them, or without limits), or every
    `Queue` MODULE declares at its top level."""
    declared = {
        value.name: value
        for value in vars(sys.modules[module]).values()
        if isinstance(value, Queue)
    }
    if not names:
        return list(declared.values())
    try:
        return [declared.get(name) or Queue(name=name) for name in dict.fromkeys(names)]
    except InvalidArgument as exc:
        raise CliError(f"--queue: {exc}", EXIT_USAGE) from None


@click.command()
@click.option(
    "--app",
    "module",
    required=True,
    metavar="MODULE",
    help="the module whose @workflow functions to serve",
)
@click.option(
    "--id", "worker_id", metavar="ID", help="the worker id's prefix (default: the host name)"
)
@click.option(
    "--queue",
    "queue_names",
    multiple=True,
    metavar="NAME",
    help="a queue to serve (repeatable; default: every Queue the module declares)",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="runs driven at once",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_LEASE.total_seconds(),
    show_default=True,
    help="seconds a lease holds without renewal; another worker takes a dead one's runs after it",
)
@click.option(
    "--poll",
    type=click.FloatRange(min=0.01),
    default=1.0,
    show_default=True,
    help="longest sleep between looks for work, in seconds",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="seconds running drives get to finish on SIGTERM",
)
@click.option(
    "--version",
    metavar="V",
    help="this worker's code version: the runs it starts record V, and it claims only runs of V",
)
@store_option
@click.pass_context
def worker(
    ctx: click.Context,
    module: str,
    worker_id: str | None,
    queue_names: tuple[str, ...],
    concurrency: int,
    lease: float,
    poll: float,
    grace: float,
    version: str | None,
    command_store: str | None,
) -> int:
    """Serve the workflows of MODULE as one worker of a fleet, until SIGTERM or Ctrl-C.

    Any number of workers, on any hosts, may serve one store: each run is driven by one worker
    at a time, and the runs of a worker that died are taken over once its lease lapsed. Runs on
    a queue are served within the limits of the `Queue` of that name MODULE declares (a queue
    it does not declare has none).
    """
    early = _EarlyStop()
    import_app(module)
    queues = _queues(module, queue_names)
    served = registered_workflows()
    if not served:
        raise CliError(f"--app {module!r} defines no @workflow", EXIT_USAGE)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def work(store: EventStore, terminal: Terminal) -> int:
        flow = Flow(store, served, version=version)
        only = "" if version is None else f", runs of version {version} only"
        terminal.line(f"serving {', '.join(sorted(flow.workflows))}{only} (Ctrl-C stops)")
        serving = asyncio.create_task(
            flow.serve(
                worker_id=worker_id,
                lease=timedelta(seconds=lease),
                concurrency=concurrency,
                poll_interval=poll,
                grace=grace,
                queues=queues,
                versions=None if version is None else {version},
            )
        )
        await asyncio.sleep(0)  # `serve` installs its signal handlers before its first wait
        if early.requested:
            flow.stop()
        await serving
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=False)


@click.command()
@json_option
@store_option
@click.pass_context
def workers(ctx: click.Context, as_json: bool, command_store: str | None) -> int:
    """List the fleet's workers: their leases, and how many live runs each owns."""

    async def work(store: EventStore, terminal: Terminal) -> int:
        if not isinstance(store, WorkerLeases):
            raise CliError("this store keeps no worker leases", EXIT_USAGE)
        leases = await store.list_leases()
        owned: dict[str, int] = {}
        live: tuple[RunStatus, ...] = ("pending", "running", "cancelling")
        for status in live:
            cursor = None
            while True:
                page = await store.list_runs(status=status, cursor=cursor, limit=500)
                for summary in page.items:
                    if summary.owner_id is not None:
                        owned[summary.owner_id] = owned.get(summary.owner_id, 0) + 1
                if not page.has_more:
                    break
                cursor = page.cursor
        now = datetime.now(UTC)
        rows = [
            {
                "worker_id": lease.worker_id,
                "started_at": timestamp(lease.started_at),
                "lease": lease_state(lease, now),
                "lease_until": None if spent(lease) else timestamp(lease.lease_until),
                "runs": owned.get(lease.worker_id, 0),
            }
            for lease in leases
        ]
        if as_json:
            terminal.json(rows)
        elif not rows:
            terminal.line("no workers")
        for row in [] if as_json else rows:
            held = {
                "holds": f"lease until {row['lease_until']}",
                "lapsed": f"lease lapsed at {row['lease_until']}",
                "spent": "lease spent (its runs taken over)",
            }[str(row["lease"])]
            terminal.line(
                f"{row['worker_id']}  runs {row['runs']}  {held}  since {row['started_at']}"
            )
        return EXIT_OK

    return work_on_store(ctx, command_store, work, read_only=True)


def spent(lease: WorkerLease) -> bool:
    """Whether a worker's lease was spent by a takeover, so that it is never renewed again.

    A store that spends leases ends them before they began (SQLite: at the epoch) when another
    worker takes one of their runs over.
    """
    return lease.lease_until <= lease.started_at


def lease_state(lease: WorkerLease, now: datetime) -> str:
    """A lease as `runfold workers` shows it at `now`: `holds`, `lapsed` or `spent`."""
    if spent(lease):
        return "spent"
    return "holds" if lease.lease_until > now else "lapsed"
