"""The `runfold` command: its commands on click, the store, and exit codes.

Every mistake a user can make (an unknown run id, a bad store URL, a server that does not
answer) ends as one line on stderr and a documented exit code, never a traceback. Commands that
only look (`runs`, `show`, `history`, `verify` without `--rebuild-index`) open the store
read-only: they never create, migrate or lock it.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast, get_args

import click

from runfold.cli import operate
from runfold.cli.demo import run_demo
from runfold.cli.output import (
    Terminal,
    envelope_json,
    hook_status,
    render_snapshot,
    render_timeline,
    timestamp,
    to_json,
)
from runfold.cli.verify import can_rebuild, verify_store
from runfold.handler import CommandHandler, utc_now
from runfold.kernel import (
    CorruptEvent,
    CorruptIndex,
    EventDecodeError,
    HistoryError,
    InvalidArgument,
    RunfoldError,
    RunNotFound,
    RunNotSupported,
    RunStatus,
    StoreError,
)
from runfold.stores import EventStore, _conninfo, open_store
from runfold.stores.protocol import SchemaMigrator

__all__ = [
    "DEFAULT_STORE",
    "EXIT_DATA",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_STORE",
    "EXIT_USAGE",
    "CliError",
    "main",
]

DEFAULT_STORE = "sqlite:///runfold.db"
"""The store used without `--store` or `RUNFOLD_STORE`."""

EXIT_OK = 0
"""Success."""
EXIT_FAILED = 1
"""A check failed, or the engine refused something (the message says what).

That is: `verify` found problems it did not repair, a `conformance` check failed, the demo's
run did not complete, or `cancel` found the run already ended otherwise.
"""
EXIT_USAGE = 2
"""A usage error: bad arguments, a malformed store URL, cursor or `MODULE:FACTORY`.

Also when the conformance kit is not installed.
"""
EXIT_NOT_FOUND = 3
"""The run id is unknown to the store."""
EXIT_STORE = 4
"""The store cannot be used (the message says why).

No such file or schema, not a runfold database, written by a newer runfold, a missing driver,
or a server that does not answer or refuses the login.
"""
EXIT_DATA = 5
"""Stored data is corrupt: an event or an index row does not decode, or a history breaks a law."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C)."""

_EXIT_CODES = """\b
exit codes:
  0    success
  1    a check failed (verify, conformance, the demo run) or the engine refused something
  2    usage error: bad arguments, store URL, cursor or MODULE:FACTORY
  3    unknown run id
  4    the store cannot be opened or reached
  5    stored data is corrupt (an event, a history, an index row)
  130  interrupted
"""


class CliError(Exception):
    """A user-facing failure: `message` is printed as one line, `exit_code` returned."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `runfold` command line with `argv` (default: `sys.argv[1:]`).

    Returns:
        The exit code: one of the `EXIT_*` constants.
    """
    terminal = Terminal(sys.stdout, sys.stderr)
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(arguments, prog_name="runfold", standalone_mode=False, obj=_State(terminal))
        return code if isinstance(code, int) else EXIT_OK
    except CliError as exc:
        terminal.error(_scrub(exc.message, arguments))
        return exc.exit_code
    except click.UsageError as exc:  # may quote an argument: a store URL given out of place
        where = exc.ctx.command_path if exc.ctx is not None else "runfold"
        terminal.error(
            _scrub(f"{exc.format_message().rstrip('.')} (see {where} --help)", arguments)
        )
        return EXIT_USAGE
    except click.ClickException as exc:
        terminal.error(_scrub(exc.format_message(), arguments))
        return exc.exit_code
    except click.exceptions.Exit as done:  # --help, --version
        return done.exit_code
    except (click.Abort, KeyboardInterrupt):
        terminal.error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `runfold history … | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


class _State:
    """What the group hands its commands: the terminal, and the store the group was given."""

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal
        self.store: str | None = None


def _scrub(message: str, arguments: Sequence[str]) -> str:
    """`message` without any password that an argument or `$RUNFOLD_STORE` holds."""
    for given in (*arguments, os.environ.get("RUNFOLD_STORE", "")):
        message = _conninfo.scrub(message, given)
    return message


def label(url: str) -> str:
    """The store URL to show: a PostgreSQL one without its password (however it was given)."""
    if _is_postgres(url):
        return _conninfo.describe(url)
    return url


def _is_postgres(url: str) -> bool:
    scheme, sep, _ = url.partition("://")
    return scheme in ("postgresql", "postgres") if sep else "=" in url


_F = TypeVar("_F", bound=Callable[..., Any])


def _store_option(command: _F) -> _F:
    """`--store` on a command too, so that it may come before or after the command's name."""
    return click.option(
        "--store",
        "command_store",
        metavar="URL",
        help="the store (overrides the one given before the command)",
    )(command)


def _json_option(command: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True, help="print JSON")(command)


def _on_a_run(command: _F) -> _F:
    """A command about one run: `RUN_ID`, `--json`, `--store`, and the click context."""
    with_context = click.pass_context(command)
    return cast(
        _F, click.argument("run_id", metavar="RUN_ID")(_json_option(_store_option(with_context)))
    )


@click.group(
    epilog=_EXIT_CODES,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--store",
    metavar="URL",
    envvar="RUNFOLD_STORE",
    help="store URL: sqlite:///path.db, memory://, postgresql://… or a libpq keyword string "
    f"(default: $RUNFOLD_STORE, else {DEFAULT_STORE})",
)
@click.version_option(package_name="runfold", prog_name="runfold", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, store: str | None) -> None:
    """Inspect, operate, verify and demonstrate runfold stores."""
    ctx.ensure_object(_State).store = store
    if ctx.invoked_subcommand is None:
        raise click.UsageError("missing command", ctx)


_T = TypeVar("_T")


def _url(ctx: click.Context, command_store: str | None) -> str:
    """The store a command works on: its own `--store`, the group's, `$RUNFOLD_STORE`, else
    the default."""
    state = ctx.find_object(_State)
    given = state.store if state is not None else None
    return command_store or given or os.environ.get("RUNFOLD_STORE") or DEFAULT_STORE


def _run(
    ctx: click.Context,
    command_store: str | None,
    work: Callable[[EventStore, Terminal], Awaitable[_T]],
    *,
    read_only: bool,
) -> _T:
    """Open the store, do `work`, close it, and turn runfold's errors into lines."""
    state = ctx.find_object(_State)
    assert state is not None
    url = _url(ctx, command_store)
    return asyncio.run(_with_store(url, work, state.terminal, read_only=read_only))


async def _with_store(
    url: str,
    work: Callable[[EventStore, Terminal], Awaitable[_T]],
    terminal: Terminal,
    *,
    read_only: bool,
) -> _T:
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


# --- commands -----------------------------------------------------------------------------------


@cli.command()
@_store_option
@click.pass_context
def demo(ctx: click.Context, command_store: str | None) -> int:
    """Run an order-fulfilment workflow through the engine and tell it as it goes.

    Parallel steps, a failure retried with backoff, a durable timer, a hook called back from
    outside; then the run's timeline, its snapshot and the store's runs of the workflow. A demo
    run left unfinished (the demo was interrupted) is finished first. Creates the store.
    """

    async def work(store: EventStore, terminal: Terminal) -> int:
        completed = await run_demo(store, terminal, label(_url(ctx, command_store)))
        return EXIT_OK if completed else EXIT_FAILED

    return _run(ctx, command_store, work, read_only=False)


@cli.command()
@click.option("--status", type=click.Choice(get_args(RunStatus)), help="only runs in this status")
@click.option("--workflow", help="only runs of this workflow")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="runs per page"
)
@click.option("--cursor", help="continue after a page (printed when there are more)")
@_json_option
@_store_option
@click.pass_context
def runs(
    ctx: click.Context,
    status: RunStatus | None,
    workflow: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    command_store: str | None,
) -> int:
    """List runs, newest first, a page at a time (read-only)."""

    async def work(store: EventStore, terminal: Terminal) -> int:
        try:
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
            terminal.line("more: " + shlex.join([*again, "--cursor", page.cursor]))
        return EXIT_OK

    return _run(ctx, command_store, work, read_only=True)


@cli.command()
@_on_a_run
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

    return _run(ctx, command_store, work, read_only=True)


@cli.command()
@_on_a_run
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

    return _run(ctx, command_store, work, read_only=True)


@cli.command()
@click.option("--rebuild-index", is_flag=True, help="rewrite the index rows that differ")
@_json_option
@_store_option
@click.pass_context
def verify(
    ctx: click.Context, rebuild_index: bool, as_json: bool, command_store: str | None
) -> int:
    """Replay every run and check its index rows against its history.

    Read-only unless --rebuild-index.
    """

    async def work(store: EventStore, terminal: Terminal) -> int:
        if rebuild_index and not can_rebuild(store):
            raise CliError(
                f"{type(store).__name__} cannot rewrite its index (it has no rewrite_index)",
                EXIT_USAGE,
            )
        report = await verify_store(
            store,
            now=utc_now(),
            rebuild=rebuild_index,
            progress=lambda done, total: terminal.progress(done, total, "verifying"),
        )
        if as_json:
            terminal.json(
                {
                    "runs": report.runs,
                    "ok": report.ok,
                    "problems": [to_json(p) for p in report.problems],
                }
            )
            return EXIT_OK if report.ok else EXIT_FAILED
        for problem in report.problems:
            mark = ("repaired", "green") if problem.repaired else ("problem", "red")
            terminal.line(mark, f"  {problem.run_id}  {problem.kind}: {problem.detail}")
        repaired = sum(p.repaired for p in report.problems)
        left = len(report.problems) - repaired
        verdict = ("ok", "green") if report.ok else ("FAILED", "red")
        terminal.line(
            verdict,
            f": {report.runs} run(s) checked, {left} problem(s)"
            + (f", {repaired} repaired" if repaired else ""),
        )
        return EXIT_OK if report.ok else EXIT_FAILED

    return _run(ctx, command_store, work, read_only=not rebuild_index)


@cli.command()
@_store_option
@click.pass_context
def migrate(ctx: click.Context, command_store: str | None) -> int:
    """Create or upgrade the store's schema, and say what was done."""
    url = _url(ctx, command_store)

    async def work(store: EventStore, terminal: Terminal) -> int:
        if not isinstance(store, SchemaMigrator):
            terminal.line(f"{type(store).__name__} keeps no schema: nothing to migrate")
            return EXIT_OK
        # Stores with a schema migrate when opened for writing, and say from where.
        current = store.schema_version
        before = store.migrated_from
        if before is None:
            terminal.line(f"{label(url)} is already at version {current}")
        else:
            terminal.line(f"migrated {label(url)}: {before} -> {current}")
        return EXIT_OK

    return _run(ctx, command_store, work, read_only=False)


@cli.command()
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="where to listen (loopback by default)"
)
@click.option("--port", default=8765, show_default=True, type=int, help="the port")
@_store_option
@click.pass_context
def ui(ctx: click.Context, host: str, port: int, command_store: str | None) -> int:
    """Serve a read-only web inspector of the store's runs until stopped (the `ui` extra)."""
    url = _url(ctx, command_store)
    try:
        from runfold import ui as inspector
    except ImportError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    try:
        inspector.serve(url, host=host, port=port)
    except ValueError as exc:
        raise CliError(f"bad store URL: {exc}", EXIT_USAGE) from None
    except (StoreError, OSError) as exc:
        raise CliError(f"cannot open {label(url)}: {exc}", EXIT_STORE) from None
    return EXIT_OK


@cli.command()
@click.option("--reason", help="why (recorded in the run's history)")
@_on_a_run
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

    return _run(ctx, command_store, work, read_only=False)


@cli.command()
@click.option(
    "--runtime",
    "target",
    required=True,
    metavar="MODULE:FACTORY",
    help="a callable returning your WorkflowRuntime (imported with the current folder on the path)",
)
@click.argument("run_id", metavar="[RUN_ID]", required=False)
@click.option("--due", is_flag=True, help="resume every run with a due timer or deadline")
@_store_option
@click.pass_context
def resume(
    ctx: click.Context,
    target: str,
    run_id: str | None,
    due: bool,
    command_store: str | None,
) -> int:
    """Drive an interrupted run (RUN_ID), or the runs that are due (--due), with your runtime.

    Each run goes on to its next suspension: a timer, a hook, a delayed retry, or its end.
    """
    if (run_id is None) == (not due):
        raise click.UsageError("give a RUN_ID or --due (one of them)", ctx)
    try:
        runtime = operate.load_runtime(target)
    except operate.RuntimeLoadError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None

    async def work(store: EventStore, terminal: Terminal) -> int:
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

    return _run(ctx, command_store, work, read_only=False)


@cli.command()
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
@click.argument("run_id", metavar="[RUN_ID]", required=False)
@_store_option
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
        raise click.UsageError("give a RUN_ID or --ended-before")
    if run_id is not None:

        async def one(store: EventStore, terminal: Terminal) -> int:
            if await operate.delete_run(store, run_id):
                terminal.line(f"deleted run {run_id}")
                return EXIT_OK
            raise CliError(
                f"run {run_id!r} was not deleted: it is unknown, still live, or one of its hooks "
                "retains its token",
                EXIT_FAILED,
            )

        return _run(ctx, command_store, one, read_only=False)
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

    return _run(ctx, command_store, work, read_only=False)


@cli.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    add_help_option=False,
)
@click.argument("target", metavar="MODULE:FACTORY")
@click.argument("options", nargs=-1, type=click.UNPROCESSED, metavar="[OPTION]...")
def conformance(target: str, options: tuple[str, ...]) -> int:
    """Run the store conformance kit against a store factory.

    The options go to the kit: --examples N, --seed S, --check NAME, --without CAPABILITY,
    --no-shrink (python -m runfold.conformance --help).
    """
    try:
        import runfold.conformance as kit
    except ImportError as exc:
        raise CliError(
            "the conformance kit needs its extra: pip install 'runfold[conformance]' "
            f"({exc.name or exc} is missing)",
            EXIT_USAGE,
        ) from None
    run_kit = getattr(kit, "main", None)
    if run_kit is None:
        raise CliError(
            "the conformance kit is not available in this runfold (runfold.conformance.main "
            "is missing)",
            EXIT_USAGE,
        )
    try:
        code: int = run_kit([target, *options])
    except SystemExit as done:  # the kit's own --help
        return done.code if isinstance(done.code, int) else EXIT_OK
    return code
