"""The `runfold` command line: the real entry point (`python -m runfold`) in a subprocess against
a temporary SQLite file; and in process, what a subprocess cannot reach (colour on a terminal,
the conformance delegation, index verification and repair on every backend).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

import runfold
import runfold.conformance
from runfold import CommandHandler, EventStore, MemoryStore
from runfold.cli import main
from runfold.cli.output import Terminal, payload_json
from runfold.cli.values import duration, hook_status
from runfold.cli.verify import VerifyReport, can_rebuild, verify_store
from runfold.commands import CompleteRun, CreateHook, CreateRun, LazyStep, StartRun, StartStep
from runfold.engine import (
    AwaitHook,
    Complete,
    Engine,
    RuntimeDecision,
    StepInvocation,
    WaitUntil,
    WorkflowInvocation,
)
from runfold.errors import SequenceConflict, TokenConflict
from runfold.kernel import HookClaim, Wakeup, project_run, run_index
from runfold.stores import SQLiteStore
from runfold.stores.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from tests.conftest import T0, Clock
from tests.support.cli_support import Demo, cells, ok, one_line_error, run_ids, runfold_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def scratch(demo: Demo, tmp_path: Path) -> str:
    """A copy of the demo's file that a test may damage."""
    copy = tmp_path / "copy.db"
    with sqlite3.connect(demo.path) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    return f"sqlite:///{copy}"


# --- the demo -----------------------------------------------------------------------------------


def test_the_demo_runs_twice_on_one_file_and_lists_both_runs(demo: Demo) -> None:
    assert "1 run(s) of order-fulfilment" in demo.first
    assert "2 run(s) of order-fulfilment" in demo.second
    for output in (demo.first, demo.second):
        # Progress while it runs: the parallel steps, the retried failure, the timer, the hook.
        for told in (
            "step reserve-stock: attempt 1 started",
            "step charge-card: attempt 1 started",
            "step charge-card: failed (card gateway timed out), retrying in",
            "step charge-card: attempt 2 started",
            "attributes customer=acme, region=eu",
            "progress [##--] 2/4",
            "timer cool-off: rang",
            "hook shipped: received",
            "run completed",
        ):
            assert told in output, told
        timeline = output[output.index("timeline") : output.index("\nrun order_")]
        events = [cells(line)[2] for line in timeline.splitlines()[2:] if line.strip()]
        assert events[0] == "run_created" and events[-1] == "run_completed"
        assert {"step_retrying", "wait_completed", "hook_received"} <= set(events)
        assert "charge-card    completed  2" in output  # the final snapshot's step table


# --- looking at runs ----------------------------------------------------------------------------


def test_runs_lists_filters_and_pages(demo: Demo) -> None:
    table = ok(runfold_cli("--store", demo.url, "runs")).splitlines()
    assert table[0].split() == ["RUN", "WORKFLOW", "STATUS", "CREATED", "UPDATED", "EVENTS"]
    assert len(table) == 3 and all(" completed " in row for row in table[1:])
    everything = run_ids(demo.url)
    assert len(everything) == 2
    failed = json.loads(
        ok(runfold_cli("--store", demo.url, "runs", "--status", "failed", "--json"))
    )
    assert failed == {"runs": [], "cursor": None, "has_more": False}
    first = json.loads(ok(runfold_cli("--store", demo.url, "runs", "--limit", "1", "--json")))
    assert first["has_more"] and [r["run_id"] for r in first["runs"]] == everything[:1]
    rest = json.loads(
        ok(
            runfold_cli(
                "--store", demo.url, "runs", "--limit", "1", "--cursor", first["cursor"], "--json"
            )
        )
    )
    assert [r["run_id"] for r in rest["runs"]] == everything[1:]
    plain = ok(runfold_cli("--store", demo.url, "runs", "--limit", "1"))
    store = shlex.quote(demo.url)
    assert f"more: runfold runs --limit 1 --store {store} --cursor {first['cursor']}" in plain
    filtered = ok(runfold_cli("runs", "--status", "completed", "--limit", "1", "--store", demo.url))
    hint = (
        f"more: runfold runs --status completed --limit 1 --store {store} "
        f"--cursor {first['cursor']}"
    )
    assert hint in filtered  # the filters and the store given stay in the hint
    other = ok(runfold_cli("--store", demo.url, "runs", "--workflow", "nothing-like-it"))
    assert other.splitlines()[1:] == []


def test_show_prints_a_runs_snapshot(demo: Demo) -> None:
    run_id = run_ids(demo.url)[0]
    text = ok(runfold_cli("--store", demo.url, "show", run_id))
    assert text.splitlines()[0] == f"run {run_id}  completed"
    for part in ("customer=acme, region=eu", "reserve-stock", "cool-off", "shipped", "4/4"):
        assert part in text
    snapshot = json.loads(ok(runfold_cli("--store", demo.url, "show", run_id, "--json")))
    assert snapshot["run_id"] == run_id and snapshot["status"] == "completed"
    assert snapshot["steps"]["charge-card"]["attempt"] == 2
    delivery = snapshot["hooks"]["shipped"]["deliveries"][0]
    assert delivery["payload"] == {"json": {"tracking": "ZX81-0042"}}  # nested, not a string
    assert delivery["received_at"].endswith("Z")
    assert snapshot["hooks"]["shipped"]["status"] == "released"  # the run ended
    assert "  shipped  released  1" in text
    assert "token" not in snapshot["hooks"]["shipped"]  # a bearer secret: never printed


def test_history_prints_one_line_per_event_or_json(demo: Demo) -> None:
    run_id = run_ids(demo.url)[0]
    events = json.loads(ok(runfold_cli("--store", demo.url, "history", run_id, "--json")))
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "run_created" and events[-1]["type"] == "run_completed"
    [hook] = [e for e in events if e["type"] == "hook_created"]
    assert hook["event"]["hook_id"] == "shipped" and "token" not in hook["event"]
    lines = ok(runfold_cli("--store", demo.url, "history", run_id)).splitlines()
    assert len(lines) == 1 + len(events)
    assert [cells(line)[2] for line in lines[1:]] == [e["type"] for e in events]
    assert all(re.fullmatch(r"\+\d+ ms|\+[\d.]+ s", cells(line)[1]) for line in lines[1:])
    iso_utc = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert all(re.fullmatch(iso_utc, e["recorded_at"]) for e in events)
    assert "warehouse:" not in "\n".join(lines)


def test_history_shows_an_attempt_after_a_crash(tmp_path: Path) -> None:
    async def crash_inside_a_step(path: Path) -> None:
        async with await SQLiteStore.open(path) as store:
            handler = CommandHandler(store)
            await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
            lazy = LazyStep(step_name="charge", input=b"")
            await handler.execute("r", StartStep(step_id="charge", lazy=lazy))
            # The process died inside the body; the one that recovers the run starts it again.
            await handler.execute("r", StartStep(step_id="charge"))

    path = tmp_path / "crash.db"
    asyncio.run(crash_inside_a_step(path))
    url = f"sqlite:///{path}"
    lines = ok(runfold_cli("--store", url, "history", "r")).splitlines()
    started = [cells(line) for line in lines if "step_started" in line]
    assert [row[3:] for row in started] == [
        ["charge", "attempt=1"],
        ["charge", "attempt=2 after_interruption=True"],
    ]
    events = json.loads(ok(runfold_cli("--store", url, "history", "r", "--json")))
    assert [
        e["event"].get("after_interruption") for e in events if e["type"] == "step_started"
    ] == [
        False,
        True,
    ]


def test_verify_finds_a_damaged_index_row_and_rebuild_repairs_it(scratch: str) -> None:
    assert "ok: 2 run(s) checked, 0 problem(s)" in ok(runfold_cli("--store", scratch, "verify"))
    victim = run_ids(scratch)[0]
    with sqlite3.connect(scratch.removeprefix("sqlite:///")) as db:
        db.execute(
            "UPDATE runs SET status = 'running', completed_at = NULL WHERE run_id = ?", (victim,)
        )
        db.execute("INSERT INTO wakeups VALUES (?, 'wait', 'ghost', 0)", (victim,))
    found = runfold_cli("--store", scratch, "verify")
    assert found.returncode == 1
    assert f"problem  {victim}  index: summary differs in status, completed_at" in found.stdout
    assert "FAILED: 2 run(s) checked, 1 problem(s)" in found.stdout
    report = json.loads(runfold_cli("--store", scratch, "verify", "--json").stdout)
    assert report["ok"] is False and [p["run_id"] for p in report["problems"]] == [victim]
    repaired = ok(runfold_cli("--store", scratch, "verify", "--rebuild-index"))
    assert f"repaired  {victim}" in repaired and "1 repaired" in repaired
    assert "ok: 2 run(s) checked, 0 problem(s)" in ok(runfold_cli("--store", scratch, "verify"))
    listed = json.loads(ok(runfold_cli("--store", scratch, "runs", "--json")))
    assert {r["status"] for r in listed["runs"]} == {"completed"}


def test_a_corrupt_history_is_exit_5_and_a_verify_problem(scratch: str) -> None:
    victim = run_ids(scratch)[0]
    with sqlite3.connect(scratch.removeprefix("sqlite:///")) as db:
        db.execute(
            "UPDATE events SET payload = x'ff00' WHERE run_id = ? AND sequence = 2", (victim,)
        )
    for command in ("show", "history"):
        line = one_line_error(runfold_cli("--store", scratch, command, victim), 5)
        assert f"run {victim!r}: stored event 2 is corrupt" in line
    found = runfold_cli("--store", scratch, "verify", "--rebuild-index")
    assert found.returncode == 1
    assert f"problem  {victim}  history: run {victim!r}: stored event 2 is corrupt" in found.stdout


def test_migrate_says_what_it_did(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    version = SQLITE_SCHEMA_VERSION
    assert ok(runfold_cli("--store", url, "migrate")).strip() == f"migrated {url}: 0 -> {version}"
    assert (tmp_path / "new.db").exists()
    already = f"{url} is already at version {version}"
    assert ok(runfold_cli("--store", url, "migrate")).strip() == already
    assert ok(runfold_cli("--store", url, "runs")).splitlines()[1:] == []
    said = ok(runfold_cli("--store", "memory://", "migrate"))
    assert said.strip() == "MemoryStore keeps no schema: nothing to migrate"


def test_the_console_script_is_installed_and_documents_exit_codes() -> None:
    script = shutil.which("runfold", path=str(Path(sys.executable).parent))
    assert script is not None, "pip install -e . installs the runfold console script"
    shown = subprocess.run([script, "--help"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0
    for part in (
        "demo",
        "runs",
        "show",
        "history",
        "verify",
        "migrate",
        "conformance",
        "exit codes",
    ):
        assert part in shown.stdout


# --- errors: one line, a documented exit code ---------------------------------------------------


def test_an_unknown_run_is_exit_3(demo: Demo) -> None:
    for command in ("show", "history"):
        line = one_line_error(runfold_cli("--store", demo.url, command, "no-such-run"), 3)
        assert "'no-such-run' not found" in line


@pytest.mark.parametrize(
    ("arguments", "code", "says"),
    [
        (["--store", "bogus://x", "runs"], 2, "bad store URL"),
        (["--store", "sqlite:///", "runs"], 2, "bad store URL"),
        (["runs", "--limit", "0"], 2, "0 is not in the range x>=1 (see"),
        (["runs", "--status", "sleeping"], 2, "Invalid value for '--status'"),
        ([], 2, "missing command"),
        (["runs", "--bogus"], 2, "No such option '--bogus' (see runfold runs --help)"),
        (["frobnicate"], 2, "No such command 'frobnicate'"),
        (["--store", "sqlite:///{tmp}/missing.db", "runs"], 4, "no store at"),
        (["--store", "sqlite:///{tmp}/text.db", "runs"], 4, "not a SQLite database"),
        (["--store", "sqlite:///{tmp}/dir/x.db", "migrate"], 4, "cannot open"),
    ],
    ids=[
        "scheme",
        "empty-path",
        "limit",
        "status",
        "no-command",
        "no-option",
        "no-such-command",
        "missing",
        "not-a-db",
        "no-dir",
    ],
)
def test_user_mistakes_are_one_line_and_an_exit_code(
    tmp_path: Path, arguments: list[str], code: int, says: str
) -> None:
    (tmp_path / "text.db").write_text("not a database at all\n" * 100)
    (tmp_path / "dir").write_text("a file where a folder should be")
    filled = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    assert says in one_line_error(runfold_cli(*filled), code)


def test_a_bad_cursor_is_a_usage_error(demo: Demo) -> None:
    assert "cursor is malformed" in one_line_error(
        runfold_cli("--store", demo.url, "runs", "--cursor", "not-a-cursor"), 2
    )


# --- in process: colour and the conformance delegation ------------------------------------------


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("environ", "coloured"),
    [({}, True), ({"NO_COLOR": "1"}, False), ({"NO_COLOR": ""}, True), ({"TERM": "dumb"}, False)],
)
def test_colour_only_on_a_terminal_that_wants_it(environ: dict[str, str], coloured: bool) -> None:
    out = FakeTty()
    terminal = Terminal(out, io.StringIO(), environ)
    terminal.table(("RUN", "STATUS"), [("r1", "completed")], status_column=1)
    # A colour is SGR 30-37 (or 38;… for the extended ones); NO_COLOR leaves bold alone.
    assert (re.search(r"\x1b\[(?:\d+;)*3[0-8]", out.getvalue()) is not None) is coloured
    plain = io.StringIO()
    Terminal(plain, io.StringIO(), environ).table(("RUN", "STATUS"), [("r1", "completed")])
    assert "\x1b[" not in plain.getvalue()
    assert plain.getvalue().splitlines() == ["RUN  STATUS", "r1   completed"]


def test_the_progress_bar_is_drawn_on_a_terminal_only() -> None:
    err = FakeTty()
    terminal = Terminal(io.StringIO(), err, {})
    terminal.progress(1, 4, "verifying")
    terminal.progress(4, 4, "verifying")
    assert "verifying" in err.getvalue() and "4/4" in err.getvalue()
    piped = io.StringIO()
    Terminal(io.StringIO(), piped, {}).progress(1, 4, "verifying")
    assert piped.getvalue() == ""


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0.0004, "0 ms"),
        (0.25, "250 ms"),
        (1.234, "1.23 s"),
        (59.5, "59.5 s"),
        (184, "3 min 4 s"),
        (3600, "1 h"),
        (7500, "2 h 5 min"),
        (273600, "3 d 4 h"),
        (-2, "-2 s"),
    ],
)
def test_durations_are_in_words(seconds: float, words: str) -> None:
    assert duration(seconds) == words


async def test_a_hook_of_an_ended_run_is_released_or_retained(clock: Clock) -> None:
    async with MemoryStore() as store:
        handler = CommandHandler(store, clock=clock)
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        keep = T0 + timedelta(days=7)
        await handler.execute("r", CreateHook(hook_id="kept", token="t1", retain_token_until=keep))
        await handler.execute("r", CreateHook(hook_id="freed", token="t2"))
        live = await handler.snapshot("r")
        assert {hook_status(live, h) for h in live.hooks.values()} == {"active"}
        ended = (await handler.execute("r", CompleteRun(output=b""))).snapshot
        assert hook_status(ended, ended.hooks["freed"]) == "released"
        assert hook_status(ended, ended.hooks["kept"]) == "retained until 2026-01-08T12:00:00.000Z"


def test_payloads_are_labelled_json() -> None:
    assert payload_json(b'{"a": [1, 2]}') == {"json": {"a": [1, 2]}}
    assert payload_json(b"plain words") == {"text": "plain words"}
    assert payload_json(b"\xff\x00") == {"base64": "/wA="}


def test_conformance_runs_the_kit_against_a_store_factory() -> None:
    done = runfold_cli(
        "conformance", "runfold.stores:MemoryStore", "--check", "test_append_first_at_zero"
    )
    assert ok(done).splitlines()[-1] == "PASSED"
    assert "append           1       1       0" in done.stdout


def test_conformance_passes_every_option_to_the_kit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def kit_main(argv: list[str], *, prog: str) -> int:
        calls.append(argv)
        assert prog == "runfold conformance"
        return 1

    monkeypatch.setattr(runfold.conformance, "main", kit_main)
    assert main(["conformance", "mod:make", "--examples", "5", "--seed", "random"]) == 1
    assert calls == [["mod:make", "--examples", "5", "--seed", "random"]]


def test_conformance_with_a_bad_target_is_a_usage_error() -> None:
    done = runfold_cli("conformance", "tests.no_such_module:make_store")
    assert done.returncode == 2 and "cannot import 'tests.no_such_module'" in done.stderr


def test_conformance_without_the_kit_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delattr(runfold.conformance, "main")
    assert main(["conformance", "mod:make"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "conformance kit is not available" in err[0]


# --- in process: verification and repair on every backend --------------------------------------


class Parked:
    """A runtime whose runs wait on a timer and a hook, so they hold index rows."""

    workflow_names = ("parked",)

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        run = invocation.snapshot
        nap = run.waits.get("nap")
        if nap is None or nap.status == "waiting":
            return WaitUntil(wait_id="nap", resume_at=T0 + timedelta(hours=1))
        hook = run.hooks.get("h")
        if hook is None or not hook.deliveries:
            return AwaitHook(hook_id="h", token=f"token-{run.run_id}")
        return Complete(output=b"")

    async def run_step(self, invocation: StepInvocation) -> bytes:
        raise AssertionError("no steps here")


async def test_verify_store_checks_and_repairs_every_kind_of_index_row(
    store: EventStore, clock: Clock
) -> None:
    engine = Engine(CommandHandler(store, clock=clock), Parked())
    for run_id in ("a", "b"):
        await engine.start("parked", b"", run_id=run_id)
    await engine.resume_wait("b", "nap")
    assert (await verify_store(store, now=clock.now)) == VerifyReport(runs=2, problems=())
    if not can_rebuild(store):
        with pytest.raises(ValueError, match="cannot rewrite its index"):
            await verify_store(store, now=clock.now, rebuild=True)
        pytest.skip(f"{type(store).__name__} does not offer the optional rewrite_index")

    good = run_index(project_run(await store.read("a")))
    damaged = attrs.evolve(
        good,
        summary=attrs.evolve(good.summary, status="completed"),
        wakeups=(),
        hooks=(HookClaim(token="token-a", hook_id="other", retained_until=None),),
    )
    await store.rewrite_index("a", damaged, now=clock.now)  # type: ignore[attr-defined]
    orphan = run_index(project_run(await store.read("b")))
    ghost = attrs.evolve(
        orphan,
        summary=attrs.evolve(orphan.summary, run_id="ghost", last_sequence=0),
        hooks=(),
        wakeups=(Wakeup(run_id="ghost", kind="wait", subject_id="w", due_at=T0),),
    )
    await store.rewrite_index("ghost", ghost, now=clock.now)  # type: ignore[attr-defined]

    seen: list[tuple[int, int]] = []
    report = await verify_store(store, now=clock.now, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert {p.run_id: p.kind for p in report.problems} == {"a": "index", "ghost": "index"}
    [problem_a] = [p for p in report.problems if p.run_id == "a"]
    assert "summary differs in status" in problem_a.detail and "wakeup" in problem_a.detail
    assert "hook rows ['other'] should be []" in problem_a.detail  # a is still napping
    assert not report.ok

    repaired = await verify_store(store, now=clock.now, rebuild=True)
    assert repaired.ok and all(p.repaired for p in repaired.problems)
    assert (await verify_store(store, now=clock.now)).problems == ()
    assert await store.get_runs(["a", "ghost"]) == [good.summary, None]


async def test_rewrite_index_is_fenced_like_an_append(store: EventStore, clock: Clock) -> None:
    if not can_rebuild(store):
        pytest.skip(f"{type(store).__name__} does not offer the optional rewrite_index")
    engine = Engine(CommandHandler(store, clock=clock), Parked())
    for run_id in ("a", "b"):
        await engine.start("parked", b"", run_id=run_id)
        await engine.resume_wait(run_id, "nap")
    index = run_index(project_run(await store.read("a")))
    stale = attrs.evolve(index, summary=attrs.evolve(index.summary, last_sequence=2))
    rewrite = store.rewrite_index  # type: ignore[attr-defined]
    with pytest.raises(SequenceConflict):
        await rewrite("a", stale, now=clock.now)
    with pytest.raises(SequenceConflict):
        await rewrite("a", None, now=clock.now)  # a run with events keeps its rows
    stolen = attrs.evolve(
        index, hooks=(HookClaim(token="token-b", hook_id="h", retained_until=None),)
    )
    with pytest.raises(TokenConflict):
        await rewrite("a", stolen, now=clock.now)
    holder = await store.find_hook("token-b", now=clock.now)
    assert holder is not None and holder.run_id == "b"
    with pytest.raises(ValueError, match="not 'b'"):
        await rewrite("b", index, now=clock.now)
