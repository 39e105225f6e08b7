"""Every command of the real `runfold` (a subprocess, as a user runs it) meets bad input with one
line on stderr and the exit code docs/reference/cli.md documents, never a traceback, and never
shows a password it was given."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import CompleteRun, CreateRun, StartRun
from runfold.stores import SQLiteStore
from tests.support.cli_support import ROOT, runfold_cli

SECRET = "s3cret-Pa55"
DEMO_RUNTIME = "runfold.cli.demo:OrderFulfilment"
KIT_TARGET = "runfold.stores:MemoryStore"

# (arguments, exit code, a phrase of the error). "{db}" is a store with a completed run "done"
# and a live run "live"; "{missing}" a path with no file; "{junk}" a file that is no database;
# "{taken}" a port another socket listens on.
TABLE: list[tuple[list[str], int, str]] = [
    ([], 2, "missing command"),
    (["no-such-command"], 2, "No such command"),
    (["--store", "mysql://db/runs", "runs"], 2, "bad store URL"),
    (["--store", f"postgresql://app:{SECRET}@[::1/db", "runs"], 2, "Invalid IPv6 URL"),
    (["--store", f"postgresql://app:{SECRET}@[zz]:5432/db", "show", "x"], 2, "bad store URL"),
    (["--store", f"postgresql://app:{SECRET}@127.0.0.1:1/db", "runs"], 4, "cannot open"),
    (["--store", f"host=127.0.0.1 port=1 password={SECRET}", "runs"], 4, "cannot open"),
    (["--store", f"postgresql://app:{SECRET}@/db?host=/nowhere&port=x", "runs"], 4, "port"),
    (["--store", "sqlite:///{missing}", "runs"], 4, "no store at"),
    (["--store", "sqlite:///{junk}", "runs"], 4, "cannot open"),
    (["runs", "--limit", "0"], 2, "--limit"),
    (["runs", "--limit", "many"], 2, "--limit"),
    (["runs", "--status", "bogus"], 2, "--status"),
    (["runs", "--cursor", "not-a-cursor"], 2, "cursor"),
    (["show"], 2, "Missing argument"),
    (["show", "no-such-run"], 3, "not found"),
    (["history", "no-such-run"], 3, "not found"),
    (["--store", "sqlite:///{missing}", "verify"], 4, "no store at"),
    (["--store", "sqlite:///{junk}", "migrate"], 4, "cannot open"),
    (["--store", "sqlite:///{junk}", "demo"], 4, "cannot open"),
    (["ui", "--port", "99999"], 2, "--port"),
    (["ui", "--port", "-1"], 2, "--port"),
    (["ui", "--port", "http"], 2, "--port"),
    (["ui", "--port", "{taken}"], 2, "cannot listen on 127.0.0.1"),
    (["ui", "--host", "no-such-host.invalid"], 2, "cannot listen on no-such-host.invalid"),
    (["--store", "sqlite:///{missing}", "ui"], 4, "cannot open"),
    (["cancel"], 2, "Missing argument"),
    (["cancel", "no-such-run"], 3, "not found"),
    (["cancel", "done"], 1, "terminal_state"),
    (["resume", "live"], 2, "--runtime"),
    (["resume", "--runtime", "json:loads", "live"], 2, "failed when called with"),
    (["resume", "--runtime", "json:JSONDecoder", "live"], 2, "not a WorkflowRuntime"),
    (["resume", "--runtime", "no_such_module_xyz:make", "live"], 2, "cannot import"),
    (["resume", "--runtime", "no-colon", "live"], 2, "MODULE:FACTORY"),
    (["resume", "--runtime", DEMO_RUNTIME], 2, "give a RUN_ID or --due"),
    (["resume", "--runtime", DEMO_RUNTIME, "live", "--due"], 2, "give a RUN_ID or --due"),
    (["resume", "--runtime", DEMO_RUNTIME, "no-such-run"], 3, "not found"),
    (["delete"], 2, "give a RUN_ID or --ended-before"),
    (["delete", "no-such-run"], 3, "not found"),
    (["delete", "live"], 1, "still live"),
    (["delete", "--ended-before", "yesterday"], 2, "not an ISO 8601 time"),
    (["delete", "--ended-before", "2026-01-01T00:00:00"], 2, "give a time zone"),
    (["delete", "--ended-before", "2026-01-01T00:00:00Z", "--limit", "0"], 2, "--limit"),
    (["deliver"], 2, "Missing argument"),
    (["deliver", "tok-nobody-holds"], 2, "Missing argument 'PAYLOAD'"),
    (["deliver", "tok-nobody-holds", "[]"], 1, "hook_not_found"),
    (["deliver", "tok", "[]", "--delivery-id", ""], 1, "hook_not_found"),
    (["send"], 2, "Missing argument"),
    (["send", "no-such-run"], 2, "Missing argument 'MESSAGE'"),
    (["send", "no-such-run", "hello"], 3, "no-such-run"),
    (["send", "no-such-run", "{{nope", "--value"], 2, "not JSON"),
    (["ui", "--runtime", "json:loads"], 2, "--allow-actions"),
    (["ui", "--allow-actions", "--runtime", "no_such_module:make"], 2, "no_such_module"),
    (["worker"], 2, "--app"),
    (["worker", "--app", "no_such_module_xyz"], 2, "cannot import --app"),
    (["worker", "--app", "json"], 2, "defines no @workflow"),
    (["worker", "--app", "json", "--concurrency", "0"], 2, "--concurrency"),
    (["worker", "--app", "json", "--lease", "0"], 2, "--lease"),
    (["--store", "sqlite:///{junk}", "workers"], 4, "cannot open"),
    (["--store", "sqlite:///{missing}", "workers"], 4, "no store at"),
    (["workers", "--json", "extra"], 2, "unexpected extra argument"),
    (["replay-check"], 2, "--app"),
    (["replay-check", "--app", "no_such_module_xyz"], 2, "cannot import --app"),
    (["replay-check", "--app", "json"], 2, "defines no @workflow"),
    (["replay-check", "--app", "json", "--since", "yesterday"], 2, "not an ISO 8601 time"),
    (["replay-check", "--app", "json", "--limit", "0"], 2, "--limit"),
    (["export"], 2, "give RUN_IDs or --all"),
    (["export", "done", "--all"], 2, "give RUN_IDs or --all"),
    (["export", "no-such-run"], 3, "no such run"),
    (["import"], 2, "Missing argument"),
    (["import", "{missing}"], 2, "does not exist"),
    (["import", "{junk}"], 2, "not JSON"),
    (["fork", "done", "--app", "tests.support.deploy_app_ten"], 2, "--from-step"),
    (
        ["fork", "done", "--from-step", "0", "--app", "tests.support.deploy_app_ten"],
        2,
        "--from-step",
    ),
    (["fork", "done", "--from-step", "1", "--app", "json"], 2, "defines no @workflow"),
    (
        ["fork", "no-such-run", "--from-step", "1", "--app", "tests.support.deploy_app_ten"],
        3,
        "not found",
    ),
    (
        ["fork", "done", "--from-step", "1", "--app", "tests.support.deploy_app_ten"],
        1,
        "unknown_workflow",
    ),
    (["conformance"], 2, "Missing argument"),
    (["conformance", "json:loads"], 2, "cannot make a store"),
    (["conformance", "json:JSONDecoder"], 2, "not an EventStore"),
    (["conformance", "no_such_module_xyz:make"], 2, "cannot import"),
    (["conformance", KIT_TARGET, "--examples", "-1"], 2, "--examples"),
    (["conformance", KIT_TARGET, "--examples", "many"], 2, "--examples"),
    (["conformance", KIT_TARGET, "--seed", "x"], 2, "--seed"),
    (["conformance", KIT_TARGET, "--check", "test_nothing"], 2, "--check"),
    (["conformance", KIT_TARGET, "--without", "wings"], 2, "--without"),
    (["conformance", KIT_TARGET, "--bogus"], 2, "unrecognized arguments"),
]


async def _populate(path: Path) -> None:
    store = await SQLiteStore.open(path)
    handler = CommandHandler(store)
    try:
        for run_id in ("done", "live"):
            await handler.execute(run_id, StartRun(create=CreateRun(workflow_name="w", input=b"")))
        await handler.execute("done", CompleteRun(output=b""))
    finally:
        await store.close()


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("bad-input")
    asyncio.run(_populate(folder / "runs.db"))
    (folder / "junk.db").write_bytes(b"this is not a database, not even close" * 100)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield {
            "db": str(folder / "runs.db"),
            "missing": str(folder / "missing.db"),
            "junk": str(folder / "junk.db"),
            "taken": str(taken.getsockname()[1]),
        }


def assert_one_line(done: subprocess.CompletedProcess[str], code: int, phrase: str) -> None:
    """Exit `code`, one stderr line saying `phrase`, no traceback, no password."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(("runfold: error: ", "runfold conformance: error: ")), lines
    assert phrase in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize(("args", "code", "phrase"), TABLE, ids=[" ".join(a) for a, _, _ in TABLE])
def test_bad_input_is_one_line_and_the_documented_code(
    places: dict[str, str], args: list[str], code: int, phrase: str
) -> None:
    given = [arg.format(**places) for arg in args]
    environment = {"RUNFOLD_STORE": f"sqlite:///{places['db']}"}
    assert_one_line(runfold_cli(*given, env=environment), code, phrase)


def test_the_table_covers_every_command() -> None:
    import click

    from runfold.cli.app import cli

    named = {arg for args, _, _ in TABLE for arg in args}
    commands = set(cli.list_commands(click.Context(cli)))
    assert "send" in commands
    assert commands - {"demo"} <= named  # the demo takes no input but its store


def test_every_code_in_the_table_is_documented() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for code in {code for _, code, _ in TABLE}:
        assert f"\n| {code} | " in page
    assert "(or an unknown one) says so and exits 1" not in page


@pytest.mark.parametrize("module", ["runfold", "runfold.ui"])
def test_the_inspector_stopped_with_ctrl_c_exits_130(places: dict[str, str], module: str) -> None:
    environment = {k: v for k, v in os.environ.items() if k not in ("RUNFOLD_STORE", "NO_COLOR")}
    environment["PYTHONPATH"] = str(ROOT)
    store = ["--store", f"sqlite:///{places['db']}"]
    args = [*store, "ui"] if module == "runfold" else store
    with subprocess.Popen(
        [sys.executable, "-m", module, *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    ) as served:
        assert served.stdout is not None and served.stderr is not None
        assert "inspector (read-only) on http://" in served.stdout.readline()
        served.send_signal(signal.SIGINT)
        assert served.wait(timeout=30) == 130
        err = served.stderr.read()
    assert "Traceback" not in err
    if module == "runfold":
        assert err.strip().splitlines() == ["runfold: error: interrupted"], err


@pytest.mark.parametrize(
    "command",
    [["-m", "runfold", "--store", "memory://", "ui"], ["-m", "runfold.ui", "--store", "memory://"]],
)
def test_the_inspector_without_its_extra_is_one_line(tmp_path: Path, command: list[str]) -> None:
    shadow = tmp_path / "uvicorn"  # a uvicorn that cannot be imported: as if not installed
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'uvicorn'\", name='uvicorn')\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "RUNFOLD_STORE"}
    environment["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    done = subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.endswith("needs the `ui` extra: pip install 'runfold[ui]' (uvicorn is missing)")
