"""The options commands share, declared once so that they read the same on every command.

`--store` may come before or after the command's name (the group takes one too); `--json`
prints JSON instead of text; `on_a_run` gives a command about one run its `RUN_ID`, `--json` and
`--store`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from runfold.cli.completion import complete_run_id

__all__ = ["json_option", "on_a_run", "store_option"]

F = TypeVar("F", bound=Callable[..., Any])


def store_option(command: F) -> F:
    """`--store` on a command too, so that it may come before or after the command's name."""
    return click.option(
        "--store",
        "command_store",
        metavar="URL",
        help="the store (overrides the one given before the command)",
    )(command)


def json_option(command: F) -> F:
    """`--json`: print JSON instead of text (the flag arrives as `as_json`)."""
    return click.option("--json", "as_json", is_flag=True, help="print JSON")(command)


def on_a_run(command: F) -> F:
    """A command about one run: `RUN_ID`, `--json`, `--store`, and the click context."""
    with_context = click.pass_context(command)
    return cast(
        F,
        click.argument("run_id", metavar="RUN_ID", shell_complete=complete_run_id)(
            json_option(store_option(with_context))
        ),
    )
