"""No hang at exit: a script that leaves its store open exits, whatever ends it.

Real child processes (`tests/support/exit_worker.py`) open a real SQLite file or PostgreSQL schema,
write a run through a `Flow` and then raise, return with the store kept in a global, or are
interrupted (SIGINT, Ctrl-C) while appending, never closing the store. Each must exit on its
own; the timeout only turns a hang into a failure instead of a stuck suite.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.child_workers import spawn_worker
from tests.support.postgres_support import DSN, admin, schema_name

pytestmark = pytest.mark.slow

HANG = 120
"""Seconds after which a child that has not exited is taken to hang (they exit in about one)."""


def backend_args(backend: str, tmp_path: Path) -> dict[str, Any]:
    if backend == "sqlite":
        return {"backend": "sqlite", "path": str(tmp_path / "runfold.db")}
    admin()  # skips the test without a server
    return {"backend": "postgres", "dsn": DSN, "schema": schema_name("exit")}


def outcome(child: subprocess.Popen[str]) -> tuple[int, str]:
    """The child's exit code and stderr; fails the test if it does not exit."""
    try:
        _, err = child.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"the child hung at exit (no exit within {HANG} s)")
    return child.returncode, err


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_script_that_raises_with_its_store_open_exits(backend: str, tmp_path: Path) -> None:
    code, err = outcome(
        spawn_worker("exit_worker", {**backend_args(backend, tmp_path), "mode": "raise"})
    )
    assert code == 1
    assert "RuntimeError: a script's own mistake" in err


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_store_left_open_in_a_global_does_not_hold_the_exit(backend: str, tmp_path: Path) -> None:
    code, err = outcome(
        spawn_worker("exit_worker", {**backend_args(backend, tmp_path), "mode": "keep"})
    )
    assert code == 0, err


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_ctrl_c_while_appending_exits(backend: str, tmp_path: Path) -> None:
    child = spawn_worker("exit_worker", {**backend_args(backend, tmp_path), "mode": "interrupt"})
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGINT)
    code, err = outcome(child)
    assert code != 0
    assert "KeyboardInterrupt" in err
