"""The `runfold` command: one click group, its commands by area, and `main`, which runs it.

Every mistake a user can make (an unknown run id, a bad store URL, a server that does not
answer) ends as one line on stderr and a documented exit code, never a traceback. Commands that
only look (`runs`, `show`, `history`, `verify` without `--rebuild-index`) open the store
read-only: they never create, migrate or lock it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from runfold.cli.certification import conformance
from runfold.cli.demo import demo_command
from runfold.cli.deploys import export, fork, import_, replay_check
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
from runfold.cli.fleet import worker, workers
from runfold.cli.inspection import history, runs, show, ui
from runfold.cli.intervention import cancel, delete, deliver, resume
from runfold.cli.maintenance import migrate, verify
from runfold.cli.output import Terminal
from runfold.cli.store_access import DEFAULT_STORE, State
from runfold.stores import _conninfo

# The commands live by area: looking at runs (`inspection`), acting on them as an operator
# (`intervention`), looking after the store (`maintenance`), the demo (`demo`) and the conformance
# kit (`certification`). What they share is in `exit_codes`, `store_access` and `options`; the
# exit codes and the default store are re-exported here, where they have always been public.

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
    terminal = Terminal(sys.stdout, sys.stderr)
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(arguments, prog_name="runfold", standalone_mode=False, obj=State(terminal))
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


def _scrub(message: str, arguments: Sequence[str]) -> str:
    """`message` without any password that an argument, `$RUNFOLD_STORE` or
    `$RUNFOLD_READ_STORE` holds."""
    environment = (os.environ.get(name, "") for name in ("RUNFOLD_STORE", "RUNFOLD_READ_STORE"))
    for given in (*arguments, *environment):
        message = _conninfo.scrub(message, given)
    return message


@click.group(
    epilog=EPILOG,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    commands=[
        demo_command,
        runs,
        show,
        history,
        verify,
        migrate,
        ui,
        cancel,
        resume,
        delete,
        deliver,
        worker,
        workers,
        replay_check,
        export,
        import_,
        fork,
        conformance,
    ],
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
