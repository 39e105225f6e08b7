"""Messages: `Flow.send(run_id, message, topic=...)` and `await recv(topic, timeout=...)`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings

from runfold import EventStore, MemoryStore
from runfold.flow import Flow, recv, sleep, step, workflow
from runfold.flow.messages import mailbox_hook
from runfold.kernel import EntityConflict, TerminalState
from runfold.testing import Fault, crash_and_resume
from runfold.testing.strategies import fault_schedules
from tests.conftest import Clock


def handled(message: Any) -> str:
    return f"handled {message}"


@workflow(name="test-inbox")
async def inbox(n: int) -> list[Any]:
    received = [await recv("orders", timeout=timedelta(hours=1)) for _ in range(n)]
    received.append(await step(handled, await recv()))
    return received


async def test_messages_are_kept_until_received_each_once_in_order(
    store: EventStore, clock: Clock
) -> None:
    flow = Flow(store, [inbox], clock=clock)
    await flow.start(inbox, 3, run_id="m")
    await flow.send("m", "first", topic="orders")
    await flow.send("m", "second", topic="orders", idempotency_key="k2")
    await flow.send("m", "second", topic="orders", idempotency_key="k2")  # a retried send
    with pytest.raises(EntityConflict):
        await flow.send("m", "other", topic="orders", idempotency_key="k2")
    clock.advance(timedelta(hours=2))  # the third recv times out
    await Flow(store, [inbox], clock=clock).run_until_idle()  # in a fresh process
    late = await flow.send("m", "late", topic="orders")  # left for a recv that never comes
    assert late.status == "running"
    done = await Flow(store, [inbox], clock=clock).send("m", "plain")  # before or after: kept
    assert (done.status, done.output) == ("completed", ["first", "second", None, "handled plain"])
    with pytest.raises(TerminalState):
        await flow.send("m", "too late")


async def test_messages_sent_before_the_workflow_asks_are_kept(
    store: EventStore, clock: Clock
) -> None:
    @workflow(name="test-late-reader")
    async def late_reader(_: None) -> list[Any]:
        await sleep(timedelta(hours=1))
        return [await recv("news"), await recv("news")]

    flow = Flow(store, [late_reader], clock=clock)
    await flow.start(late_reader, None, run_id="r")  # asleep, no mailbox yet
    await flow.send("r", 1, topic="news")  # makes the mailbox on the run
    await flow.send("r", 2, topic="news")
    clock.advance(timedelta(hours=1))
    await flow.run_until_idle()
    assert (await flow.result("r")).output == [1, 2]


@workflow(name="test-one-message")
async def one_message(_: None) -> Any:
    return [await step(handled, "before"), await recv("t", timeout=timedelta(days=3))]


@settings(max_examples=12)
@given(schedule=fault_schedules(max_write=8, max_faults=2))
async def test_a_message_survives_any_fault_schedule(schedule: tuple[Fault, ...]) -> None:
    token = mailbox_hook("M", "t")[1]
    outcome = await crash_and_resume(
        one_message,
        None,
        store=MemoryStore(),
        schedule=schedule,
        events={token: "hello"},
        run_id="M",
    )
    assert outcome.same, outcome
    assert outcome.actual.output == ["handled before", "hello"]
