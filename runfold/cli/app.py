"""The `runfold` command: one click group, its commands by area, and `main`, which runs it.

Every mistake a user can make (an unknown run id, a bad store URL, a server that does not
answer) ends as one line on stderr and a documented exit code, never a traceback. Commands that
only look (`runs`, `show`, `history`, `verify` without `--rebuild-index`) open the store
read-only: they never create, migrate or lock it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from runfold.cli.exit_codes import (
    EPILOG,
    EXIT_DATA,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STORE,
    EXIT_USAGE,
    CliError,
)
from runfold.cli.state import DEFAULT_STORE, State

if TYPE_CHECKING:
    from runfold.cli.output import Terminal

# The commands live by area: looking at runs (`inspection`), acting on them as an operator
# (`intervention`, `messaging`), looking after the store (`maintenance`), the fleet (`fleet`),
# the demo (`demo`) and the conformance kit (`certification`). What they share is in
# `exit_codes`, `store_access` and `options`; the exit codes and the default store are
# re-exported here, where they have always been public.
#
# Each command's module is imported only when that command runs (or its own help is asked
# for): `runfold --help` lists them from `COMMANDS` and imports no kernel, store or rich, so
# it starts in the time Python and click take. tests/cli/test_cli_start_up.py checks both.

COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": (
        "runfold.cli.demo",
        "demo_command",
        "Run an order-fulfilment workflow through the engine and tell it as it goes.",
    ),
    "runs": (
        "runfold.cli.inspection",
        "runs",
        "List runs, newest first, a page at a time (read-only).",
    ),
    "show": (
        "runfold.cli.inspection",
        "show",
        "A run's snapshot: steps, waits, hooks, progress, attributes (read-only).",
    ),
    "history": ("runfold.cli.inspection", "history", "A run's events, one line each (read-only)."),
    "verify": (
        "runfold.cli.maintenance",
        "verify",
        "Replay every run and check its index rows against its history.",
    ),
    "migrate": (
        "runfold.cli.maintenance",
        "migrate",
        "Create or upgrade the store's schema, and say what was done.",
    ),
    "ui": (
        "runfold.cli.inspection",
        "ui",
        "Serve a web inspector of the store's runs until stopped (the `ui` extra).",
    ),
    "cancel": (
        "runfold.cli.intervention",
        "cancel",
        "End a live run as cancelled now, without asking its workflow (no cleanup steps).",
    ),
    "resume": (
        "runfold.cli.intervention",
        "resume",
        "Drive an interrupted run (RUN_ID), or the runs that are due (--due), with your runtime.",
    ),
    "delete": (
        "runfold.cli.intervention",
        "delete",
        "Delete one ended run (RUN_ID), or the runs that ended before a time (--ended-before).",
    ),
    "deliver": (
        "runfold.cli.intervention",
        "deliver",
        "Deliver PAYLOAD (text, or - to read bytes from stdin) to the hook holding TOKEN.",
    ),
    "send": (
        "runfold.cli.messaging",
        "send",
        "Send MESSAGE (text, or - to read bytes from stdin) to the live run RUN_ID.",
    ),
    "worker": (
        "runfold.cli.fleet",
        "worker",
        "Serve the workflows of MODULE as one worker of a fleet, until SIGTERM or Ctrl-C.",
    ),
    "workers": (
        "runfold.cli.fleet",
        "workers",
        "List the fleet's workers: their leases, and how many live runs each owns.",
    ),
    "replay-check": (
        "runfold.cli.deploys",
        "replay_check",
        "Replay recorded runs against MODULE's workflow code; exit 1 on any divergence.",
    ),
    "export": (
        "runfold.cli.deploys",
        "export",
        "Write runs (RUN_ID..., or --all) as JSON lines, one run a line (read-only).",
    ),
    "import": (
        "runfold.cli.deploys",
        "import_",
        "Add the runs of an export file (SOURCE) to the store, each as a new run.",
    ),
    "fork": (
        "runfold.cli.deploys",
        "fork",
        "Make a new run of RUN_ID that reuses its outcomes before step N and runs the rest.",
    ),
    "conformance": (
        "runfold.cli.certification",
        "conformance",
        "Run the store conformance kit against a store factory.",
    ),
}
"""Each command: the module and name of its click command, and its one-line help."""


class _Commands(click.Group):
    """The `runfold` group: its commands imported when resolved, listed from `COMMANDS`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = COMMANDS.get(cmd_name)
        if found is None:
            return None
        module, name, _ = found
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, _, short) in COMMANDS.items()])


def _terminal() -> Terminal:
    from runfold.cli.output import Terminal

    return Terminal(sys.stdout, sys.stderr)


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `runfold` command line with `argv` (default: `sys.argv[1:]`).

    Returns:
        The exit code: one of the `EXIT_*` constants.
    """
    state = State(_terminal)
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(arguments, prog_name="runfold", standalone_mode=False, obj=state)
        return code if isinstance(code, int) else EXIT_OK
    except CliError as exc:
        state.terminal.error(_scrub(exc.message, arguments))
        return exc.exit_code
    except click.UsageError as exc:  # may quote an argument: a store URL given out of place
        where = exc.ctx.command_path if exc.ctx is not None else "runfold"
        state.terminal.error(
            _scrub(f"{exc.format_message().rstrip('.')} (see {where} --help)", arguments)
        )
        return EXIT_USAGE
    except click.ClickException as exc:
        state.terminal.error(_scrub(exc.format_message(), arguments))
        return exc.exit_code
    except click.exceptions.Exit as done:  # --help, --version
        return done.exit_code
    except (click.Abort, KeyboardInterrupt):
        state.terminal.error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `runfold history … | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


def _scrub(message: str, arguments: Sequence[str]) -> str:
    """`message` without any password that an argument, `$RUNFOLD_STORE` or
    `$RUNFOLD_READ_STORE` holds."""
    from runfold.stores import conninfo

    environment = (os.environ.get(name, "") for name in ("RUNFOLD_STORE", "RUNFOLD_READ_STORE"))
    for given in (*arguments, *environment):
        message = conninfo.scrub(message, given)
    return message


@click.group(
    cls=_Commands,
    epilog=EPILOG,
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
    ctx.ensure_object(State).store = store
    if ctx.invoked_subcommand is None:
        raise click.UsageError("missing command", ctx)
