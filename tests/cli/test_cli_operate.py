"""Operating runs from the command line: the real `runfold` in subprocesses. A demo interrupted
with SIGINT exits 130 and leaves its run live; the next demo finishes it; `cancel`, `resume`
and `delete` act on such runs."""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import CreateHook, CreateRun, StartRun
from runfold.flow import Flow
from runfold.stores import SQLiteStore, open_store
from runfold.testing import CrashingStore, Fault, SimulatedCrash
from tests.support.cli_support import ROOT, ok, one_line_error, run_ids, runfold_cli, store_url

pytestmark = pytest.mark.slow

DEMO_RUNTIME = "runfold.cli.demo:OrderFulfilment"


def interrupted_demo(url: str, after: str) -> tuple[str, str]:
    """Start `runfold demo` on `url`, send SIGINT once it prints `after`; (stdout, stderr)
    after checking it exited 130 with one line and no traceback."""
    environment = {k: v for k, v in os.environ.items() if k not in ("RUNFOLD_STORE", "NO_COLOR")}
    environment["PYTHONPATH"] = str(ROOT)
    with subprocess.Popen(
        [sys.executable, "-m", "runfold", "demo", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    ) as demo:
        assert demo.stdout is not None and demo.stderr is not None
        seen = []
        for line in demo.stdout:
            seen.append(line)
            if after in line:
                demo.send_signal(signal.SIGINT)
                break
        out = "".join(seen) + demo.stdout.read()
        err = demo.stderr.read()
        assert demo.wait(timeout=60) == 130, (out, err)
    assert "Traceback" not in err
    assert err.strip().splitlines() == ["runfold: error: interrupted"], err
    return out, err


def wait_until(when: datetime) -> None:
    """Sleep until `when` has passed (the run's timer or retry is then due)."""
    time.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()) + 0.05)


def status_of(url: str, run_id: str) -> str:
    shown = json.loads(ok(runfold_cli("show", run_id, "--json", "--store", url)))
    status: str = shown["status"]
    return status


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ops.db'}"


def test_sigint_mid_demo_exits_130_and_the_next_demo_finishes_the_run(url: str) -> None:
    out, _ = interrupted_demo(url, "retrying in")
    [interrupted] = run_ids(url)
    assert interrupted in out and status_of(url, interrupted) == "running"
    again = ok(runfold_cli("demo", "--store", url))
    assert f"finishing interrupted run {interrupted}" in again
    assert status_of(url, interrupted) == "completed"
    assert "2 run(s) of order-fulfilment" in again
    history = json.loads(ok(runfold_cli("history", interrupted, "--json", "--store", url)))
    charged = [e for e in history if e["event"].get("step_id") == "charge-card"]
    assert charged[-1]["type"] == "step_completed"


def test_cancel_ends_an_interrupted_run(url: str) -> None:
    interrupted_demo(url, "attempt 1 started")
    [run_id] = run_ids(url)
    said = ok(runfold_cli("cancel", run_id, "--reason", "operator gave up", "--store", url))
    assert said.strip() == f"run {run_id}  cancelled"
    history = json.loads(ok(runfold_cli("history", run_id, "--json", "--store", url)))
    assert history[-1]["type"] == "run_cancelled"
    assert history[-1]["event"]["reason"] == "operator gave up"
    assert ok(runfold_cli("cancel", run_id, "--store", url)).strip() == f"run {run_id}  cancelled"
    ok(runfold_cli("demo", "--store", url))  # nothing left to finish: one new run
    completed = [r for r in run_ids(url) if r != run_id]
    line = one_line_error(runfold_cli("cancel", completed[0], "--store", url), 1)
    assert "terminal_state" in line
    assert "not found" in one_line_error(runfold_cli("cancel", "nope", "--store", url), 3)


def test_resume_drives_an_interrupted_run_then_the_due_ones(url: str) -> None:
    interrupted_demo(url, "retrying in")
    [run_id] = run_ids(url)
    retry_after = json.loads(ok(runfold_cli("show", run_id, "--json", "--store", url)))["steps"][
        "charge-card"
    ]["retry_after"]
    wait_until(datetime.fromisoformat(retry_after))
    resumed = ok(runfold_cli("resume", "--runtime", DEMO_RUNTIME, run_id, "--store", url))
    assert resumed.strip() == f"run {run_id}  running"  # now waiting on its timer or hook
    shown = json.loads(ok(runfold_cli("show", run_id, "--json", "--store", url)))
    assert shown["steps"]["charge-card"]["status"] == "completed"
    assert "cool-off" in shown["waits"]
    wait_until(datetime.fromisoformat(shown["waits"]["cool-off"]["resume_at"]))
    due = ok(runfold_cli("resume", "--runtime", DEMO_RUNTIME, "--due", "--store", url))
    assert due.strip() == f"run {run_id}  running"  # the timer rang; now the hook waits
    shown = json.loads(ok(runfold_cli("show", run_id, "--json", "--store", url)))
    assert shown["waits"]["cool-off"]["status"] == "completed" and "shipped" in shown["hooks"]
    assert shown["hooks"]["shipped"]["status"] == "active"
    nothing = ok(runfold_cli("resume", "--runtime", DEMO_RUNTIME, "--due", "--store", url))
    assert nothing.strip() == "nothing is due"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["resume", "--runtime", DEMO_RUNTIME], "give a RUN_ID or --due"),
        (["resume", "--runtime", DEMO_RUNTIME, "r", "--due"], "give a RUN_ID or --due"),
        (
            ["resume", "--runtime", "no_such_module:make", "r"],
            "cannot import 'no_such_module:make'",
        ),
        (["resume", "--runtime", "runfold.handler:utc_now", "r"], "not a WorkflowRuntime"),
        (["resume", "--runtime", "nocolon", "r"], "expected MODULE:FACTORY"),
        (["delete", "--ended-before", "yesterday"], "not an ISO 8601 time"),
        (["delete", "--ended-before", "2026-01-01T00:00:00"], "give a time zone"),
    ],
)
def test_operating_mistakes_are_usage_errors(url: str, arguments: list[str], says: str) -> None:
    ok(runfold_cli("migrate", "--store", url))
    assert says in one_line_error(runfold_cli(*arguments, "--store", url), 2)


def test_delete_removes_the_runs_that_ended_before_a_time(url: str) -> None:
    for _ in range(2):
        ok(runfold_cli("demo", "--store", url))
    interrupted_demo(url, "attempt 1 started")
    assert len(run_ids(url)) == 3
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert ok(runfold_cli("delete", "--ended-before", past, "--store", url)).startswith(
        "deleted 0 run(s)"
    )
    future = (datetime.now(UTC) + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    one = ok(runfold_cli("delete", "--ended-before", future, "--limit", "1", "--store", url))
    assert one.startswith("deleted 1 run(s) that ended before ")
    rest = ok(runfold_cli("delete", "--ended-before", future, "--store", url))
    assert rest.startswith("deleted 1 run(s)")
    [live] = run_ids(url)  # the interrupted run has not ended: it stays
    assert status_of(url, live) == "running"


def test_delete_run_id_removes_that_ended_run_only(url: str) -> None:
    for _ in range(2):
        ok(runfold_cli("demo", "--store", url))
    interrupted_demo(url, "attempt 1 started")
    runs = run_ids(url)
    [live] = [r for r in runs if status_of(url, r) == "running"]
    ended = [r for r in runs if r != live]
    assert ok(runfold_cli("delete", ended[0], "--store", url)).strip() == f"deleted run {ended[0]}"
    assert sorted(run_ids(url)) == sorted([live, ended[1]])
    refused = one_line_error(runfold_cli("delete", live, "--store", url), 1)
    assert "was not deleted" in refused and "still live" in refused
    assert "not found" in one_line_error(runfold_cli("delete", "no-such-run", "--store", url), 3)
    assert live in run_ids(url)
    both = one_line_error(
        runfold_cli("delete", live, "--ended-before", "2026-01-01T00:00:00Z", "--store", url), 2
    )
    assert "give a RUN_ID or --ended-before" in both


RELAY_RUNTIME = """
from runfold.flow import Flow, step, wait_for_event, workflow

FLOW = None


async def tell(token):
    await FLOW.deliver(token, "from the relay")  # a write of the runtime's own
    return "told"


@workflow(name="test-cli-relay")
async def relay(token):
    return await step(tell, token)


@workflow(name="test-cli-listener")
async def listener(token):
    return await wait_for_event("told", token=token)


def make(store):
    global FLOW
    FLOW = Flow(store, [relay, listener])
    return FLOW
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url(request.param, tmp_path / "ops.db", "operate")


async def test_resume_hands_the_store_to_a_factory_that_takes_one(
    tmp_path: Path, backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = backend_url
    (tmp_path / "relay_runtime.py").write_text(RELAY_RUNTIME)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("relay_runtime")
    async with await open_store(url) as store:
        flow = module.make(store)
        await flow.start(module.listener, "told-token", run_id="L")
        dying = Flow(CrashingStore(store, [Fault(write=1, moment="after", kind="stop")]))
        with pytest.raises(SimulatedCrash):  # the relay's step started, never ran
            await dying.start(module.relay, "told-token", run_id="R")
    resumed = ok(
        runfold_cli("resume", "--runtime", "relay_runtime:make", "R", "--store", url, cwd=tmp_path)
    )
    assert resumed.strip() == "run R  completed"
    listened = json.loads(ok(runfold_cli("show", "L", "--json", "--store", url)))
    assert listened["status"] == "completed"


TOKEN = "tok-SECRET-4f2a9c"


async def _waiting_on_a_hook(path: Path) -> None:
    store = await SQLiteStore.open(path)
    handler = CommandHandler(store)
    try:
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="w", input=b"")))
        await handler.execute("r", CreateHook(hook_id="approval", token=TOKEN))
    finally:
        await store.close()


def test_deliver_hands_a_payload_to_the_hook_holding_a_token(tmp_path: Path) -> None:
    path = tmp_path / "hooks.db"
    asyncio.run(_waiting_on_a_hook(path))
    url = f"sqlite:///{path}"
    first = runfold_cli("deliver", TOKEN, '{"ok": true}', "--delivery-id", "d1", "--store", url)
    assert ok(first).strip() == "delivered to hook approval of run r  running"
    again = runfold_cli("deliver", TOKEN, '{"ok": true}', "--delivery-id", "d1", "--store", url)
    assert "already delivered: nothing changed" in ok(again)
    piped = subprocess.run(
        [sys.executable, "-m", "runfold", "deliver", TOKEN, "-", "--json", "--store", url],
        input=b"\xff\x00raw",
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    deliveries = json.loads(piped.stdout)["hooks"]["approval"]["deliveries"]
    assert [d["payload"] for d in deliveries] == [
        {"json": {"ok": True}},
        {"base64": base64.b64encode(b"\xff\x00raw").decode()},
    ]
    unknown = runfold_cli("deliver", "tok-nobody-holds", "{}", "--store", url)
    assert "no live hook holds the given token" in one_line_error(unknown, 1)
    for done in (first, again, unknown):
        assert TOKEN not in done.stdout + done.stderr and "tok-nobody" not in done.stderr
    assert TOKEN.encode() not in piped.stdout + piped.stderr
