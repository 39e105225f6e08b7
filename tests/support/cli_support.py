"""Running the real `runfold` entry point in a subprocess, as a user does, and reading what it
printed; a `runfold worker` for the length of a block; the demo's file that the CLI tests share
(`tests/conftest.py`: `demo`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from tests.support.postgres_support import postgres_url

ROOT = Path(__file__).resolve().parents[2]


def runfold_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    before_exec: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m runfold ARGS` as a user runs it: piped, so never coloured; `before_exec` runs
    in the child before the interpreter starts."""
    dropped = ("RUNFOLD_STORE", "RUNFOLD_READ_STORE", "NO_COLOR")
    environment = {k: v for k, v in os.environ.items() if k not in dropped}
    environment["PYTHONPATH"] = str(ROOT)
    environment.update(env or {})
    done = subprocess.run(
        [sys.executable, "-m", "runfold", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd or ROOT,
        env=environment,
        preexec_fn=before_exec,
    )
    assert "\x1b[" not in done.stdout + done.stderr, "piped output must carry no colour codes"
    assert "Traceback" not in done.stderr, done.stderr
    return done


def cells(line: str) -> list[str]:
    """The cells of a table line (columns are two or more spaces apart)."""
    return re.split(r"\s{2,}", line.strip())


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The single stderr line of a failed command (and its exit code is `code`)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("runfold: error: "), done.stderr
    return lines[0]


@attrs.frozen
class Demo:
    """The file two demos ran on, its URL, and what each printed."""

    path: Path
    url: str
    first: str
    second: str


def run_ids(url: str) -> list[str]:
    listed = json.loads(ok(runfold_cli("--store", url, "runs", "--json")))
    return [run["run_id"] for run in listed["runs"]]


def store_url(backend: str, sqlite_path: Path, label: str) -> Iterator[str]:
    """A store URL that a test and the CLI in a subprocess share, for a fixture to `yield from`:
    the SQLite file `sqlite_path` for backend "sqlite", else a fresh PostgreSQL schema named after
    `label` (`postgres_url`)."""
    if backend == "sqlite":
        yield f"sqlite:///{sqlite_path}"
        return
    yield from postgres_url(label)


@contextlib.contextmanager
def runfold_worker(app: str, url: str) -> Iterator[subprocess.Popen[str]]:
    """`runfold worker --app APP --store URL --poll 0.05` from the repository root, stopped with
    SIGTERM when the block ends; if the block succeeded, the worker must then exit 0."""
    runfold = str(Path(sys.executable).parent / "runfold")
    worker = subprocess.Popen(
        [runfold, "worker", "--app", app, "--store", url, "--poll", "0.05"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield worker
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
