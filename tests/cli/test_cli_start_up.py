"""`runfold --help` and `runfold runs` start without what they do not need: no kernel, store,
driver or rich for the help, no PostgreSQL driver for a SQLite store. (How long they take is
the benchmark's: `python -m benchmarks --only start-up`.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from runfold.cli.app import COMMANDS, cli
from tests.support.cli_support import ROOT, ok, runfold_cli

HEAVY = ("runfold.kernel", "runfold.stores", "runfold.engine", "rich", "attrs", "psycopg")
"""Modules `runfold --help` must not import (nor any module under them)."""


def _modules_after(*argv: str) -> list[str]:
    """The modules a new interpreter holds after running `runfold ARGV`."""
    program = (
        "import json, sys\n"
        "from runfold.cli import main\n"
        f"code = main({list(argv)!r})\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def _under(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == r or m.startswith(r + ".") for r in roots)]


def test_help_imports_no_kernel_store_driver_or_rich() -> None:
    loaded = _modules_after("--help")
    assert _under(loaded, HEAVY) == []
    assert "sqlite3" not in loaded and "aiosqlite" not in loaded


def test_runs_on_sqlite_imports_no_postgres_driver_nor_engine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    ok(runfold_cli("migrate", "--store", url))
    loaded = _modules_after("runs", "--store", url)
    assert "runfold.stores.sqlite" in loaded
    assert _under(loaded, ("psycopg", "psycopg_pool", "runfold.stores.postgres")) == []
    assert _under(loaded, ("runfold.engine", "runfold.flow", "runfold.conformance")) == []


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_help_lists_each_command_as_its_own_help_says(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None and command.name == name
    assert COMMANDS[name][2] == command.get_short_help_str(limit=1000)


def test_the_help_lists_every_command() -> None:
    shown = ok(runfold_cli("--help"))
    listed = shown.split("Commands:")[1]
    for name in COMMANDS:
        assert f"\n  {name} " in listed, name
