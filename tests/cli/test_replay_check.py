"""Replay checks of a deploy against recorded runs: `runfold replay-check`, `runfold export` and
`import`, and `runfold.testing.replay` over an export file; on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from runfold.cli.inert import inert_json
from runfold.conformance.strategies import valid_histories
from runfold.errors import TokenConflict
from runfold.events import Envelope
from runfold.flow import Flow, Workflow, wait_for_event
from runfold.flow.replay import Divergence, ReplayChecker
from runfold.kernel import project_run
from runfold.stores import EventStore, SQLiteStore, open_store
from runfold.testing import replay
from runfold.transfer import (
    EXPORT_VERSION,
    ExportFormatError,
    RunsAlreadyExist,
    export_line,
    import_runs,
    read_export,
)
from tests.conftest import Clock
from tests.support.cli_support import ok, one_line_error, runfold_cli, store_url
from tests.support.deploy_versions import V1, V2, V2_UNPATCHED
from tests.support.postgres_support import postgres_url

pytestmark = pytest.mark.slow

PARKED = 3  # v1 runs parked on their timer
DONE = 2  # v1 runs completed


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL the CLI (in a subprocess) and the test share."""
    yield from store_url(request.param, tmp_path / "runs.db", "deploys")


@pytest.fixture
def other_postgres() -> Iterator[str]:
    yield from postgres_url("deploys")


async def _opened(url: str) -> EventStore:
    return await open_store(url)


@pytest.fixture
async def recorded(url: str, clock: Clock) -> str:
    """`url`'s store holding v1 runs: PARKED on their timer, DONE completed."""
    store = await _opened(url)
    try:
        flow = Flow(store, [V1], clock=clock)
        for i in range(DONE):
            await flow.start(V1, f"d{i}", run_id=f"done-{i}")
        clock.advance(timedelta(hours=2))
        await flow.run_until_idle()
        for i in range(PARKED):
            await flow.start(V1, f"p{i}", run_id=f"parked-{i}")
    finally:
        await store.close()
    return url


def test_replay_check_passes_a_patched_deploy_and_names_the_unpatched_call(recorded: str) -> None:
    passed = ok(
        runfold_cli("replay-check", "--app", "tests.support.deploy_app_v2", "--store", recorded)
    )
    assert passed.strip() == f"{PARKED + DONE} runs replayed: {PARKED + DONE} passed, 0 diverged"

    done = runfold_cli(
        "replay-check",
        "--app",
        "tests.support.deploy_app_v2_unpatched",
        "--store",
        recorded,
        "--json",
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["diverged"] == PARKED + DONE
    for run in report["runs"]:
        assert run["divergence"] == {
            "call": 2,
            "recorded": "a sleep",
            "asked": "step 'check_fraud'",
        }

    text = runfold_cli(
        "replay-check",
        "--app",
        "tests.support.deploy_app_v2_unpatched",
        "--store",
        recorded,
        "--limit",
        "1",
    )
    assert text.returncode == 1
    assert text.stdout.splitlines() == [
        "DIVERGED parked-2 (deploy-order):",
        "  at call 2: the history recorded a sleep, the code asks for step 'check_fraud'",
        "1 runs replayed: 0 passed, 1 diverged",
    ]


def test_replay_check_filters_by_workflow_and_time(recorded: str) -> None:
    app = ("replay-check", "--app", "tests.support.deploy_app_v2_unpatched", "--store", recorded)
    none = ok(runfold_cli(*app, "--workflow", "another"))
    assert none.strip() == "0 runs replayed: 0 passed, 0 diverged"
    later = ok(runfold_cli(*app, "--since", "2100-01-01T00:00:00"))
    assert later.strip() == "0 runs replayed: 0 passed, 0 diverged"
    bad = runfold_cli(*app, "--since", "yesterday")
    assert "is not an ISO 8601 time" in one_line_error(bad, 2)
    missing = runfold_cli("replay-check", "--app", "tests.no_such_module", "--store", recorded)
    assert "cannot import --app 'tests.no_such_module'" in one_line_error(missing, 2)


@pytest.mark.postgres
async def test_an_export_replays_in_a_test_and_imports_elsewhere(
    recorded: str, other_postgres: str, tmp_path: Path
) -> None:
    exported = tmp_path / "runs.jsonl"
    ok(runfold_cli("export", "--all", "--store", recorded, "--out", str(exported)))
    lines = exported.read_text().splitlines()
    assert len(lines) == PARKED + DONE
    assert {json.loads(line)["version"] for line in lines} == {EXPORT_VERSION}

    results = replay(exported, [V2])
    assert [r.passed for r in results] == [True] * (PARKED + DONE)
    diverged = replay(exported, [V2_UNPATCHED])
    assert {r.divergence for r in diverged} == {
        Divergence(call=2, recorded="a sleep", asked="step 'check_fraud'")
    }

    imported = ok(runfold_cli("import", str(exported), "--store", other_postgres))
    assert imported.strip() == f"imported {PARKED + DONE} runs"
    again = runfold_cli("import", str(exported), "--store", other_postgres)
    assert "already exist, nothing was imported" in one_line_error(again, 1)
    target = await _opened(other_postgres)
    source = await _opened(recorded)
    try:
        for line in lines:
            run_id = json.loads(line)["run_id"]
            moved = [e.event for e in await target.read(run_id)]
            assert moved == [e.event for e in await source.read(run_id)]
        # The moved runs go on in their new store, on the new code, on the old branch.
        clock = Clock()
        clock.advance(timedelta(days=1))
        await Flow(target, [V2], clock=clock).run_until_idle(clock() + timedelta(days=365))
        finished = await Flow(target, [V2]).result("parked-0")
        assert finished.output == ["charged p0", "shipped p0"]
    finally:
        await target.close()
        await source.close()
    verified = ok(runfold_cli("verify", "--store", other_postgres))
    assert verified.strip() == f"ok: {PARKED + DONE} run(s) checked, 0 problem(s)"


async def test_an_import_that_meets_one_existing_run_writes_nothing(
    store: EventStore, clock: Clock
) -> None:
    flow = Flow(store, [V1], clock=clock)
    await flow.start(V1, "a", run_id="a")
    await flow.start(V1, "b", run_id="b")
    histories = [await store.read("a"), await store.read("b")]
    renamed = list(read_export([export_line(histories[0]).replace('"a"', '"c"', 1)]))
    with pytest.raises(RunsAlreadyExist) as caught:
        await import_runs(store, [*renamed, histories[1]])
    assert caught.value.run_ids == ("b",)
    assert await store.read("c") == []  # the new one was not written either
    with pytest.raises(RunsAlreadyExist):
        await import_runs(store, [*renamed, *renamed])
    assert await import_runs(store, renamed) == 1
    assert [e.event for e in await store.read("c")] == [e.event for e in histories[0]]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not JSON"),
        ('{"format": "other"}', "not a 'runfold-runs' line"),
        ('{"format": "runfold-runs", "version": 99}', "format version 99"),
        ('{"format": "runfold-runs", "version": 1, "run_id": "r", "events": []}', "at least one"),
        (
            '{"format": "runfold-runs", "version": 1, "run_id": "r", "events": '
            '[{"sequence": 1, "type": "run_created", "schema_version": 2, '
            '"recorded_at": "2026-01-01T00:00:00+00:00", "payload": "bm90IGNib3I="}]}',
            "does not decode",
        ),
    ],
)
def test_a_bad_export_line_is_refused_with_its_number(line: str, reason: str) -> None:
    with pytest.raises(ExportFormatError, match=reason) as caught:
        list(read_export(["", line]))
    assert caught.value.line == 2


async def test_a_run_of_a_workflow_the_code_lacks_diverges_as_a_whole(
    store: EventStore, clock: Clock
) -> None:
    flow = Flow(store, [V1], clock=clock)
    started = await flow.start(V1, "x", run_id="x")
    result = ReplayChecker([]).check(started.snapshot)
    assert result.divergence == Divergence(
        call=0,
        recorded="a run of workflow 'deploy-order'",
        asked="nothing: the code defines no such workflow",
    )
    ended = await flow.cancel("x")
    assert ReplayChecker([]).check(ended.snapshot).passed  # an ended run needs no code


def _ledger(path: Path) -> list[tuple[str, int]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [(run, int(n)) for run, n in (line.split() for line in lines)]


async def test_fork_and_resume_on_the_command_line(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.deploy_app_ten import BROKEN_ENV, LEDGER_ENV, ten

    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    store = await _opened(url)
    try:
        flow = Flow(store, [ten])
        assert (await flow.start(ten, None, run_id="t")).output == 55
        monkeypatch.setenv(BROKEN_ENV, "4")
        assert (await flow.start(ten, None, run_id="u")).status == "failed"
    finally:
        await store.close()
    monkeypatch.delenv(BROKEN_ENV)  # the fix is deployed
    env = {LEDGER_ENV: str(ledger)}
    app = ("--app", "tests.support.deploy_app_ten", "--store", url)
    forked = runfold_cli("fork", "t", "--from-step", "7", "--new-id", "t-7", *app, env=env)
    assert ok(forked).strip() == "run t-7  completed  (from t)"
    assert [n for run, n in _ledger(ledger) if run == "t-7"] == [7, 8, 9, 10]

    resumed = runfold_cli(
        "resume", "u", "--runtime", "tests.support.deploy_app_ten:flow", "--store", url, env=env
    )
    line = ok(resumed).strip()
    assert line.startswith("run u-fork-") and line.endswith("  completed  (from u)")
    new_id = line.split()[1]
    assert [n for run, n in _ledger(ledger) if run == new_id] == list(range(4, 11))

    refused = runfold_cli("fork", "u", "--from-step", "6", *app, env=env)
    assert "call 4 is step 's4' (failed)" in one_line_error(refused, 1)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(history=valid_histories(run_id="hostile \u202e run \u2028 ✓"))
def test_an_export_reads_back_event_for_event_and_imports_whole(
    history: list[Envelope], tmp_path: Path
) -> None:
    """Any valid history (hostile ids, payloads, tokens) survives a line, its store, and a
    terminal's inert JSON, event for event."""
    line = export_line(history)
    raw, back = read_export([line, inert_json(line)])  # as written, and as a terminal shows it
    for read in (raw, back):
        assert [(e.run_id, e.sequence, e.event, e.recorded_at) for e in read] == [
            (e.run_id, e.sequence, e.event, e.recorded_at) for e in history
        ]

    async def through_a_store() -> None:
        store = await SQLiteStore.open(tmp_path / f"{uuid.uuid4().hex}.db")
        try:
            assert await import_runs(store, [back]) == 1
            stored = await store.read(history[0].run_id)
            assert [(e.sequence, e.event, e.recorded_at) for e in stored] == [
                (e.sequence, e.event, e.recorded_at) for e in history
            ]
            assert project_run(stored).status == project_run(history).status
        finally:
            await store.close()

    asyncio.run(through_a_store())


async def test_an_import_whose_hook_token_is_held_writes_nothing(
    store: EventStore, clock: Clock
) -> None:
    async def waits(_: None) -> object:
        return await wait_for_event("go", token="shared-token")

    waiting = Workflow(name="test-import-waits", fn=waits)
    flow = Flow(store, [waiting, V1], clock=clock)
    await flow.start(waiting, None, run_id="holder")
    await flow.start(V1, "x", run_id="plain")

    def renamed(history: list[Envelope], run_id: str) -> list[Envelope]:
        return [
            Envelope(run_id=run_id, sequence=e.sequence, event=e.event, recorded_at=e.recorded_at)
            for e in history
        ]

    plain = renamed(await store.read("plain"), "plain-copy")
    held = renamed(await store.read("holder"), "holder-copy")
    with pytest.raises(TokenConflict) as caught:
        await import_runs(store, [plain, held])
    assert caught.value.holder_run_id == "holder"
    assert "shared-token" not in str(caught.value)
    assert await store.read("plain-copy") == [] and await store.read("holder-copy") == []
