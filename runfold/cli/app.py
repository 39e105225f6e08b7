"""The `runfold` command: argument parsing, the store, the commands, and exit codes.

Every mistake a user can make (an unknown run id, a bad store URL, a server that does not
answer) ends as one line on stderr and a documented exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import NoReturn, get_args

from runfold.cli.demo import run_demo
from runfold.cli.output import (
    Terminal,
    envelope_json,
    redact,
    render_snapshot,
    render_timeline,
    to_json,
)
from runfold.cli.verify import can_rebuild, verify_store
from runfold.handler import CommandHandler, utc_now
from runfold.kernel import (
    CorruptEvent,
    EventDecodeError,
    HistoryError,
    RunfoldError,
    RunNotFound,
    RunNotSupported,
    RunStatus,
    StoreError,
)
from runfold.stores import EventStore, open_store

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

That is: `verify` found problems it did not repair, a `conformance` check failed, or the demo's
run did not complete.
"""
EXIT_USAGE = 2
"""A usage error: bad arguments, a malformed store URL, cursor or `MODULE:FACTORY`.

Also when the conformance kit is not installed.
"""
EXIT_NOT_FOUND = 3
"""The run id is unknown to the store."""
EXIT_STORE = 4
"""The store cannot be used (the message says why).

No such file, not a runfold database, written by a newer runfold, a missing driver, or a server
that does not answer.
"""
EXIT_DATA = 5
"""A stored history is corrupt (an event does not decode, or the history breaks a law)."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C)."""

_EXIT_CODES = """\
exit codes:
  0    success
  1    a check failed (verify, conformance, the demo run) or the engine refused something
  2    usage error: bad arguments, store URL, cursor or MODULE:FACTORY
  3    unknown run id
  4    the store cannot be opened or reached
  5    a stored history is corrupt
  130  interrupted
"""


class CliError(Exception):
    """A user-facing failure: `message` is printed as one line, `exit_code` returned."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and an exit code, not usage and exit(2)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)", EXIT_USAGE)


_Command = Callable[[argparse.Namespace, Terminal], int]
_StoreWork = Callable[[EventStore, argparse.Namespace, Terminal], Awaitable[int]]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `runfold` command line with `argv` (default: `sys.argv[1:]`).

    Returns:
        The exit code: one of the `EXIT_*` constants.
    """
    terminal = Terminal(sys.stdout, sys.stderr)
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as done:  # --help
            return done.code if isinstance(done.code, int) else EXIT_OK
        command: _Command = args.command
        return command(args, terminal)
    except CliError as exc:
        terminal.error(exc.message)
        return exc.exit_code
    except KeyboardInterrupt:
        terminal.error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `runfold history … | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _parser() -> _Parser:
    parser = _Parser(
        prog="runfold",
        description="Inspect, verify and demonstrate runfold stores.",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=os.environ.get("RUNFOLD_STORE") or DEFAULT_STORE,
        help="store URL: sqlite:///path.db, memory://, postgresql://… "
        f"(default: $RUNFOLD_STORE or {DEFAULT_STORE})",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    demo = commands.add_parser("demo", help="run an order-fulfilment workflow through the engine")
    demo.set_defaults(command=_store_command(_demo, create=True))

    runs = commands.add_parser("runs", help="list runs, newest first")
    runs.add_argument("--status", choices=get_args(RunStatus))
    runs.add_argument("--workflow", help="only runs of this workflow")
    runs.add_argument("--limit", type=_positive, default=20, help="runs per page (default 20)")
    runs.add_argument("--cursor", help="continue after a page (printed when there are more)")
    runs.add_argument("--json", action="store_true", help="print JSON")
    runs.set_defaults(command=_store_command(_runs))

    show = commands.add_parser("show", help="a run's snapshot: steps, waits, hooks, attributes")
    show.add_argument("run_id", metavar="RUN_ID")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(command=_store_command(_show))

    history = commands.add_parser("history", help="a run's events, one line each")
    history.add_argument("run_id", metavar="RUN_ID")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(command=_store_command(_history))

    verify = commands.add_parser(
        "verify", help="replay every run and check its index rows against the log"
    )
    verify.add_argument(
        "--rebuild-index", action="store_true", help="rewrite the index rows that differ"
    )
    verify.add_argument("--json", action="store_true", help="print JSON")
    verify.set_defaults(command=_store_command(_verify))

    migrate = commands.add_parser("migrate", help="create or upgrade the store's schema")
    migrate.set_defaults(command=_store_command(_migrate, create=True))

    conformance = commands.add_parser(
        "conformance", help="run the store conformance kit against a store factory"
    )
    conformance.add_argument(
        "target", metavar="MODULE:FACTORY", help="a callable returning a fresh, empty store"
    )
    conformance.add_argument(
        "options",
        nargs=argparse.REMAINDER,
        metavar="OPTION",
        help="passed on to the kit: --examples N, --seed S, --check NAME, --without CAPABILITY, "
        "--no-shrink (python -m runfold.conformance --help)",
    )
    conformance.set_defaults(command=_conformance)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


# --- the store ----------------------------------------------------------------------------------


def _store_command(work: _StoreWork, *, create: bool = False) -> _Command:
    """A command that opens the store, does `work`, closes it, and turns errors into lines."""

    def command(args: argparse.Namespace, terminal: Terminal) -> int:
        return asyncio.run(_with_store(work, args, terminal, create=create))

    return command


async def _with_store(
    work: _StoreWork, args: argparse.Namespace, terminal: Terminal, *, create: bool
) -> int:
    url: str = args.store
    store = await _open(url, create=create)
    try:
        return await work(store, args, terminal)
    except RunNotFound as exc:
        raise CliError(str(exc), EXIT_NOT_FOUND) from None
    except (CorruptEvent, HistoryError, EventDecodeError, RunNotSupported) as exc:
        raise CliError(str(exc), EXIT_DATA) from None
    except StoreError as exc:
        raise CliError(f"store {url}: {exc}", EXIT_STORE) from None
    except RunfoldError as exc:
        raise CliError(f"{exc} [{exc.code}]", EXIT_FAILED) from None
    finally:
        await store.close()


async def _open(url: str, *, create: bool) -> EventStore:
    """Open the store at `url`; a SQLite file must already exist unless `create`."""
    if url.startswith("sqlite:///") and not create:
        path = url[len("sqlite:///") :]
        if path and path != ":memory:" and not Path(path).exists():
            raise CliError(
                f"no store at {path} (`runfold demo` or `runfold migrate` creates one; "
                "or pass --store)",
                EXIT_STORE,
            )
    try:
        return await open_store(url)
    except ValueError as exc:
        raise CliError(f"bad store URL: {exc}", EXIT_USAGE) from None
    except ImportError as exc:
        raise CliError(f"cannot open {url}: a driver is missing ({exc})", EXIT_STORE) from None
    except (StoreError, OSError) as exc:
        raise CliError(f"cannot open {url}: {exc}", EXIT_STORE) from None


# --- commands -----------------------------------------------------------------------------------


async def _demo(store: EventStore, args: argparse.Namespace, terminal: Terminal) -> int:
    completed = await run_demo(store, terminal, redact(args.store))
    return EXIT_OK if completed else EXIT_FAILED


async def _runs(store: EventStore, args: argparse.Namespace, terminal: Terminal) -> int:
    try:
        page = await store.list_runs(
            workflow_name=args.workflow, status=args.status, cursor=args.cursor, limit=args.limit
        )
    except ValueError as exc:  # a cursor that is not one of ours
        raise CliError(str(exc), EXIT_USAGE) from None
    if args.json:
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
                s.created_at.isoformat(timespec="seconds"),
                s.updated_at.isoformat(timespec="seconds"),
                str(s.last_sequence),
            )
            for s in page.items
        ],
        status_column=2,
    )
    if page.has_more and page.cursor is not None:
        terminal.line(f"more: runfold runs --cursor {page.cursor}")
    return EXIT_OK


async def _show(store: EventStore, args: argparse.Namespace, terminal: Terminal) -> int:
    snapshot = await CommandHandler(store).snapshot(args.run_id)
    if args.json:
        terminal.json(to_json(snapshot))
    else:
        render_snapshot(terminal, snapshot)
    return EXIT_OK


async def _history(store: EventStore, args: argparse.Namespace, terminal: Terminal) -> int:
    history = await store.read(args.run_id)
    if not history:
        raise CliError(f"run {args.run_id!r} not found", EXIT_NOT_FOUND)
    if args.json:
        terminal.json([envelope_json(e) for e in history])
    else:
        render_timeline(terminal, history)
    return EXIT_OK


async def _verify(store: EventStore, args: argparse.Namespace, terminal: Terminal) -> int:
    if args.rebuild_index and not can_rebuild(store):
        raise CliError(
            f"{type(store).__name__} cannot rewrite its index (it has no rewrite_index)",
            EXIT_USAGE,
        )
    report = await verify_store(
        store,
        now=utc_now(),
        rebuild=args.rebuild_index,
        progress=lambda done, total: terminal.progress(done, total, "verifying"),
    )
    if args.json:
        terminal.json(
            {
                "runs": report.runs,
                "ok": report.ok,
                "problems": [to_json(p) for p in report.problems],
            }
        )
        return EXIT_OK if report.ok else EXIT_FAILED
    for problem in report.problems:
        mark = (
            terminal.paint("repaired", "green")
            if problem.repaired
            else terminal.paint("problem", "red")
        )
        terminal.line(f"{mark}  {problem.run_id}  {problem.kind}: {problem.detail}")
    repaired = sum(p.repaired for p in report.problems)
    left = len(report.problems) - repaired
    verdict = terminal.paint("ok", "green") if report.ok else terminal.paint("FAILED", "red")
    terminal.line(
        f"{verdict}: {report.runs} run(s) checked, {left} problem(s)"
        + (f", {repaired} repaired" if repaired else "")
    )
    return EXIT_OK if report.ok else EXIT_FAILED


async def _migrate(store: EventStore, args: argparse.Namespace, terminal: Terminal) -> int:
    migrate = getattr(store, "migrate", None)
    if migrate is None:
        terminal.line(
            f"{type(store).__name__} migrates when it is opened: {redact(args.store)} is at the "
            "current schema"
        )
        return EXIT_OK
    await migrate()
    terminal.line(f"migrated {redact(args.store)}")
    return EXIT_OK


def _conformance(args: argparse.Namespace, terminal: Terminal) -> int:
    """Delegate to the conformance kit's command line (`runfold.conformance.main`, the face of
    `run_conformance(factory, …)`), which drives its own event loop, prints its table and
    returns 0, 1 (a check failed) or 2 (a bad target)."""
    try:
        import runfold.conformance as kit
    except ImportError as exc:
        raise CliError(
            f"the conformance kit needs runfold[conformance] installed ({exc})", EXIT_USAGE
        ) from None
    run_kit = getattr(kit, "main", None)
    if run_kit is None:
        raise CliError(
            "the conformance kit is not available in this runfold (runfold.conformance.main "
            "is missing)",
            EXIT_USAGE,
        )
    code: int = run_kit([args.target, *args.options])
    return code
