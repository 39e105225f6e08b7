"""Workflow code that sends and reads: `await send(run_id, ...)` and `await get_event(...)`.

Through every store; and a real child process SIGKILLed between a `send`'s message and the
step's outcome, on SQLite and PostgreSQL: the rerun sends under the same key, and the target
keeps the message once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runfold import EventStore
from runfold.flow import Flow, StepError, get_event, send, workflow
from runfold.flow.messages import mailbox_hook
from runfold.flow.sending import GET_EVENT_STEP, SEND_STEP
from runfold.stores import PostgresStore, SQLiteStore
from tests.support.flow_send_worker import target
from tests.support.postgres_support import DSN, admin, schema_name

ROOT = Path(__file__).resolve().parents[2]


# `target` is the child process's: it waits for a "ping" and sets "pong". The pinger is this
# file's own, as it also reads an event the target never sets (timeout 0: None at once).
@workflow(name="test-sending-pinger")
async def pinger(to: str) -> Any:
    await send(to, "ping", topic="ping")
    return [await get_event(to, "pong", timeout=10), await get_event(to, "none", timeout=0)]


@workflow(name="test-sending-stray")
async def stray(to: str) -> str:
    try:
        await send(to, "hello")
    except StepError as refused:
        return refused.step_error
    return "sent"


async def test_a_workflow_sends_to_another_and_reads_its_event(store: EventStore) -> None:
    flow = Flow(store, [pinger, target])
    await flow.start(target, None, run_id="B")
    done = await flow.start(pinger, "B", run_id="A")
    assert (done.status, done.output) == ("completed", ["ping/pong", None])
    steps = done.snapshot.steps
    assert [steps[i].step_name for i in sorted(steps, key=int)] == [
        SEND_STEP,
        GET_EVENT_STEP,
        GET_EVENT_STEP,
    ]
    target_run = await flow.result("B")
    assert (target_run.status, target_run.output) == ("completed", "ping")
    hook_id = mailbox_hook("B", "ping")[0]
    deliveries = target_run.snapshot.hooks[hook_id].deliveries
    assert len(deliveries) == 1
    # A replay (a fresh Flow, nothing in memory) sends nothing again and reads nothing again.
    again = Flow(store, [pinger, target])
    await again.recover()
    assert (await again.result("A")).output == ["ping/pong", None]
    assert len((await again.result("B")).snapshot.hooks[hook_id].deliveries) == 1


async def test_a_send_to_a_run_that_is_not_there_raises_step_error(store: EventStore) -> None:
    flow = Flow(store, [stray, target])
    done = await flow.start(stray, "nobody", run_id="S1")
    assert done.status == "completed" and "nobody" in done.output
    steps = done.snapshot.steps
    assert [s.attempt for s in steps.values()] == [1]  # not retried: it would never be found


async def test_get_event_from_workflow_code_refuses_a_negative_timeout() -> None:
    with pytest.raises(ValueError, match="negative"):
        get_event("B", "k", timeout=-1)


# --- a SIGKILL between the send and its record ----------------------------------------------------


def worker(args: dict[str, Any], generation: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.support.flow_send_worker", json.dumps(args), str(generation)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def check_one_message_after_a_kill(args: dict[str, Any], store: EventStore) -> None:
    killed = worker(args, 0)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    sender = await store.read("sender")
    assert [e.event.event_type for e in sender][-1] == "step_started"  # the outcome never made it
    hook_id = mailbox_hook("target", "ping")[0]
    events = [e.event for e in await store.read("target")]
    assert sum(e.event_type == "hook_received" for e in events) == 1  # but the message did
    finished = worker(args, 1)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout.strip().splitlines()[-1]) == ["completed", "ping/pong"]
    events = [e.event for e in await store.read("target")]
    assert sum(e.event_type == "hook_received" for e in events) == 1
    assert hook_id == "mailbox:ping"


@pytest.mark.slow
async def test_a_send_killed_before_its_record_is_kept_once_on_sqlite(tmp_path: Path) -> None:
    args = {"backend": "sqlite", "path": str(tmp_path / "send.db")}
    async with await SQLiteStore.open(args["path"]) as store:
        await check_one_message_after_a_kill(args, store)


@pytest.mark.slow
@pytest.mark.postgres
async def test_a_send_killed_before_its_record_is_kept_once_on_postgres() -> None:
    admin()  # skips (or fails under CI) without a server
    args = {"backend": "postgres", "dsn": DSN, "schema": schema_name("flowsend")}
    store = await PostgresStore.open(DSN, schema=args["schema"], pool_max=2)
    try:
        await check_one_message_after_a_kill(args, store)
    finally:
        await store.close()
