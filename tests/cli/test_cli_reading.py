"""Commands that only look never write: the real `runfold` in a subprocess on SQLite files that
are read-only, locked by another process's write, or missing."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli_support import Demo, ok, one_line_error, run_ids, runfold_cli

READING = (["runs"], ["runs", "--json"], ["verify"])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_reading_commands_leave_the_file_as_it_was(demo: Demo, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(demo.path, copy)
    url = f"sqlite:///{copy}"
    before = digest(copy)
    run_id = run_ids(url)[0]
    for command in (*READING, ["show", run_id], ["history", run_id, "--json"]):
        ok(runfold_cli("--store", url, *command))
    assert digest(copy) == before


@pytest.fixture
def read_only_copy(demo: Demo) -> Iterator[Path]:
    """The demo's file, read-only, in a folder that cannot be written either."""
    folder = Path(tempfile.mkdtemp(prefix="runfold-ro-"))
    copy = folder / "runs.db"
    shutil.copy(demo.path, copy)
    copy.chmod(0o444)
    folder.chmod(0o555)
    yield copy
    folder.chmod(0o755)
    shutil.rmtree(folder)


_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def without_root_overrides() -> None:
    """In the child, before exec: drop root's power to ignore file modes (`CAP_DAC_OVERRIDE`,
    `CAP_DAC_READ_SEARCH`) from the capability bounding set, so that a read-only file is
    read-only to it too. Nothing to do for another user."""
    if os.getuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def as_plain_user(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m runfold ARGS` by a process that file modes bind (root without overrides)."""
    return runfold_cli(*args, before_exec=without_root_overrides)


def test_a_read_only_file_can_be_listed_shown_and_verified(read_only_copy: Path) -> None:
    url = f"sqlite:///{read_only_copy}"
    listed = as_plain_user("--store", url, "runs")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 3  # the header and the demo's two runs
    run_id = listed.stdout.splitlines()[1].split()[0]
    for command in (["show", run_id], ["history", run_id], ["verify"]):
        done = as_plain_user("--store", url, *command)
        assert done.returncode == 0, (command, done.stderr)
    written = as_plain_user("--store", url, "migrate")
    assert written.returncode == 4 and "readonly" in written.stderr
    assert len(written.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in read_only_copy.parent.iterdir()) == ["runs.db"]


def test_reading_does_not_wait_for_a_writer_holding_the_lock(demo: Demo, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    with sqlite3.connect(demo.path) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    url = f"sqlite:///{copy}"
    run_id = run_ids(url)[0]
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            f"db = sqlite3.connect({str(copy)!r}, isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE')\n"
            "db.execute(\"UPDATE runs SET status = 'failed'\")\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",  # holds the write lock until told to stop
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        writing = runfold_cli("--store", url, "migrate")  # a writer waits, then gives up
        assert "locked" in one_line_error(writing, 4) or "busy" in writing.stderr
        listed = ok(runfold_cli("--store", url, "runs"))  # readers do not wait
        assert listed.count(" completed ") == 2  # the uncommitted change is not seen
        assert f"run {run_id}" in ok(runfold_cli("--store", url, "show", run_id))
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()


def test_a_missing_file_is_one_line_naming_it_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    for command in (["runs"], ["show", "r"], ["history", "r"], ["verify"]):
        line = one_line_error(runfold_cli("--store", f"sqlite:///{missing}", *command), 4)
        assert f"no store at {missing}" in line
    assert not missing.exists()


def test_reading_refuses_a_file_of_an_older_runfold_and_leaves_it(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:  # version 1: the first migration only
        db.execute("CREATE TABLE runfold_schema (version INTEGER NOT NULL)")
        db.execute("INSERT INTO runfold_schema VALUES (1)")
    url = f"sqlite:///{old}"
    line = one_line_error(runfold_cli("--store", url, "runs"), 4)
    assert "schema version 1" in line and "open it for writing to migrate it" in line
    with sqlite3.connect(old) as db:
        assert db.execute("SELECT version FROM runfold_schema").fetchall() == [(1,)]


def test_commands_that_look_take_the_read_store_and_the_others_do_not(
    demo: Demo, tmp_path: Path
) -> None:
    # The read store is a copy (a replica, say); the write store has no runs yet.
    replica = tmp_path / "replica.db"
    shutil.copy(demo.path, replica)
    primary = f"sqlite:///{tmp_path / 'primary.db'}"
    ok(runfold_cli("migrate", "--store", primary))
    env = {"RUNFOLD_STORE": primary, "RUNFOLD_READ_STORE": f"sqlite:///{replica}"}

    def listed(*args: str) -> list[str]:
        page = json.loads(ok(runfold_cli(*args, env=env)))
        return [run["run_id"] for run in page["runs"]]

    shown = listed("runs", "--json")
    assert shown and shown == run_ids(demo.url)
    ok(runfold_cli("show", shown[0], env=env))
    ok(runfold_cli("history", shown[0], env=env))
    # An explicit --store wins, before or after the command's name; writers use RUNFOLD_STORE.
    assert listed("--store", primary, "runs", "--json") == []
    assert listed("runs", "--json", "--store", primary) == []
    done = runfold_cli("cancel", shown[0], env=env)
    assert done.returncode != 0 and "not found" in one_line_error(done, done.returncode)
