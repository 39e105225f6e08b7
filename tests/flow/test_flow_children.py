"""Child workflows: `start_child`, `await handle.result()`, `await child(...)`, on every store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings

from runfold import EventStore, MemoryStore
from runfold.flow import (
    ChildWorkflowError,
    Flow,
    child,
    sleep,
    start_child,
    step,
    wait_for_event,
    workflow,
    workflow_info,
)
from runfold.kernel import HookNotFound, RetryPolicy, RunNotFound
from runfold.testing import Fault, crash_and_resume
from runfold.testing.strategies import fault_schedules
from tests.conftest import Clock
from tests.support.meanwhile import AroundCreation, ChildEndsFirst


def price(item: str) -> int:
    return len(item)


def out_of_stock(item: str) -> None:
    raise RuntimeError(f"no {item}")


@workflow(name="test-order-line")
async def order_line(item: str) -> dict[str, Any]:
    cost: int = await step(price, item)
    if item.startswith("wait"):
        await wait_for_event("packed", token=f"packed-{item}")
    if item.startswith("gone"):
        await step(out_of_stock, item, retry=RetryPolicy(max_attempts=1))
    if item.startswith("slow"):
        await sleep(timedelta(days=3))
    return {"item": item, "cost": cost, "parent": workflow_info().parent_run_id}


@workflow(name="test-order-parent")
async def order_parent(items: list[str]) -> list[Any]:
    handles = [await start_child(order_line, item) for item in items]
    lines: list[Any] = []
    for handle in handles:
        try:
            lines.append([handle.run_id, await handle.result()])
        except ChildWorkflowError as exc:
            lines.append([handle.run_id, exc.child_status, exc.child_error])
    lines.append(await child(order_line, "gift-wrap"))
    return lines


async def test_children_are_linked_awaited_and_report_failures(store: EventStore) -> None:
    flow = Flow(store, [order_parent, order_line])
    done = await flow.start(order_parent, ["pen", "gone-ink"], run_id="P")
    assert done.status == "completed", done.error
    assert done.output == [
        ["P/1", {"item": "pen", "cost": 3, "parent": "P"}],
        ["P/2", "failed", "StepError: step 'out_of_stock' failed: RuntimeError: no gone-ink"],
        {"item": "gift-wrap", "cost": 9, "parent": "P"},
    ]
    links = done.snapshot.children
    assert [(k, v.child_run_id, v.operation_id) for k, v in links.items()] == [
        ("1", "P/1", "test-order-line"),
        ("2", "P/2", "test-order-line"),
        ("5", "P/5", "test-order-line"),
    ]
    for child_id in ("P/1", "P/2", "P/5"):
        assert (await flow.result(child_id)).snapshot.parent_run_id == "P"


async def test_the_parent_wakes_when_its_child_ends(store: EventStore) -> None:
    await Flow(store, [order_parent, order_line]).start(order_parent, ["wait-1"], run_id="W")
    # A fresh process: the child's end, delivered by a webhook, wakes the parent at once.
    flow = Flow(store, [order_parent, order_line])
    assert (await flow.result("W")).status == "running"
    child_run = await flow.deliver("packed-wait-1", True)
    assert (child_run.run_id, child_run.status) == ("W/1", "completed")
    parent = await flow.result("W")
    assert parent.status == "completed" and parent.output[0][0] == "W/1"


async def test_a_parent_woken_late_after_a_crash_is_found_by_recover(store: EventStore) -> None:
    flow = Flow(store, [order_parent, order_line])
    await flow.start(order_parent, ["wait-2"], run_id="R")
    await flow.handler.deliver("packed-wait-2", flow.codec.encode(True))
    await flow.engine.drive("R/1")  # the child ends; the process dies before waking the parent
    assert (await flow.result("R/1")).status == "completed"
    assert (await flow.result("R")).status == "running"
    await Flow(store, [order_parent, order_line]).recover()
    assert (await flow.result("R")).status == "completed"


async def test_cancelling_or_timing_out_the_parent_cancels_its_children(
    store: EventStore, clock: Clock
) -> None:
    flow = Flow(store, [order_parent, order_line], clock=clock)
    await flow.start(order_parent, ["slow-1", "wait-3"], run_id="C")
    cancelled = await flow.cancel("C", reason="customer gave up")
    assert cancelled.status == "cancelled"
    for child_id in ("C/1", "C/2"):
        ended = await flow.result(child_id)
        assert ended.status == "cancelled", child_id
        assert ended.snapshot.cancellation is not None
        assert "'C' ended cancelled" in (ended.snapshot.cancellation.reason or "")

    await flow.start(order_parent, ["slow-2"], run_id="T", timeout=timedelta(days=1))
    clock.advance(timedelta(days=1))
    await flow.run_until_idle()
    assert (await flow.result("T")).status == "timed_out"
    assert (await flow.result("T/1")).status == "cancelled"


@workflow(name="test-order-cancels-a-line")
async def order_cancelling_a_line(items: list[str]) -> list[Any]:
    handles = [await start_child(order_line, item) for item in items]
    await wait_for_event("go", token=f"go-{workflow_info().run_id}")  # the lines ran meanwhile
    await handles[0].cancel("the customer dropped it")
    await handles[0].cancel()  # a line already cancelling (or cancelled) is left alone
    lines: list[Any] = []
    for handle in handles:
        try:
            lines.append(await handle.result())
        except ChildWorkflowError as exc:
            lines.append(exc.child_status)
    return lines


async def test_a_parent_cancels_a_child_through_its_handle(store: EventStore) -> None:
    flow = Flow(store, [order_cancelling_a_line, order_line])
    await flow.start(order_cancelling_a_line, ["wait-6", "pen"], run_id="X")
    assert (await flow.result("X/1")).status == "running"  # waiting to be packed
    run = await flow.deliver("go-X", True)
    assert run.status == "completed", run.error
    assert run.output[0] == "cancelled" and run.output[1]["item"] == "pen"
    line = await flow.result("X/1")
    assert line.snapshot.cancellation is not None
    assert line.snapshot.cancellation.reason == "the customer dropped it"
    names = [s.step_name for s in run.snapshot.steps.values()]
    assert names.count("runfold.cancel_child") == 2  # each recorded once, as a step


@settings(max_examples=10)
@given(schedule=fault_schedules(max_write=16, max_faults=2))
async def test_a_child_cancelled_by_its_parent_survives_any_fault_schedule(
    schedule: tuple[Fault, ...],
) -> None:
    outcome = await crash_and_resume(
        order_cancelling_a_line,
        ["wait-7", "pen"],
        store=MemoryStore(),
        schedule=schedule,
        workflows=[order_line],
        events={"go-Y": True},
        run_id="Y",
    )
    assert outcome.same, outcome


@settings(max_examples=15)
@given(schedule=fault_schedules(max_write=16, max_faults=2))
async def test_parent_and_children_survive_any_fault_schedule(schedule: tuple[Fault, ...]) -> None:
    outcome = await crash_and_resume(
        order_parent,
        ["pen", "wait-4"],
        store=MemoryStore(),
        schedule=schedule,
        workflows=[order_line],
        events={"packed-wait-4": True},
        run_id="H",
    )
    assert outcome.same, outcome


async def test_children_under_a_fleet_of_two_workers(store: EventStore) -> None:
    flows = [Flow(store, [order_parent, order_line]) for _ in range(2)]
    serving = [
        asyncio.create_task(flow.serve(poll_interval=0.05, handle_signals=False)) for flow in flows
    ]
    try:
        async with asyncio.timeout(60):
            while not all(flow.worker is not None for flow in flows):
                await asyncio.sleep(0.01)
            await flows[0].start(order_parent, ["pen", "wait-5"], run_id="F", queued=True)
            while await _status(flows[1], "F/2") != "running":
                await asyncio.sleep(0.02)  # a worker took the child up
            while True:  # the hook is there once the child's worker drove it to the wait
                try:
                    await flows[1].deliver("packed-wait-5", True)
                    break
                except HookNotFound:
                    await asyncio.sleep(0.02)
            done = await _ended(flows[0], "F")
            assert done.status == "completed", done.error
            assert [line[0] for line in done.output[:2]] == ["F/1", "F/2"]
    finally:
        for flow in flows:
            flow.stop()
        await asyncio.gather(*serving)


async def test_a_child_ending_while_its_parent_appends_the_hook_wakes_the_parent(
    store: EventStore,
) -> None:
    elsewhere = Flow(store, [order_parent, order_line])  # another process: the child's worker

    async def child_ends() -> None:
        ended = await elsewhere.deliver("packed-wait-8", True)
        # Its end found no hook to deliver to: the parent has not appended it yet.
        assert (ended.run_id, ended.status) == ("E/2", "completed")

    wrapped = ChildEndsFirst(store, "E/2", child_ends)
    flow = Flow(wrapped, [order_parent, order_line])
    await flow.start(order_parent, ["pen", "wait-8"], run_id="E")
    assert wrapped.meanwhile is None  # the child did end between the two
    done = await flow.result("E")
    assert done.status == "completed", done.error
    assert [line[0] for line in done.output[:2]] == ["E/1", "E/2"]


async def test_a_serving_parent_is_woken_by_a_child_that_ended_before_its_hook(
    store: EventStore,
) -> None:
    # The worker drives the parent; the Flow's follow-ups run beside it, in a task of their
    # own, and may look at the child before the parent's hook is appended.
    observer = Flow(store, [order_parent, order_line])

    async def child_ends() -> None:
        while await _status(observer, "S/1") != "completed":  # the worker drives it meanwhile
            await asyncio.sleep(0.02)
        while flow.family.queue:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # what follows the child's end ran and found no hook

    wrapped = ChildEndsFirst(store, "S/1", child_ends)
    flow = Flow(wrapped, [order_parent, order_line])
    serving = asyncio.create_task(flow.serve(poll_interval=0.05, handle_signals=False))
    try:
        async with asyncio.timeout(30):
            while flow.worker is None:
                await asyncio.sleep(0.01)
            await flow.start(order_parent, ["pen"], run_id="S", queued=True)
            done = await _ended(flow, "S")
            assert wrapped.meanwhile is None
            assert done.status == "completed", done.error
            assert done.output[0][0] == "S/1"
    finally:
        flow.stop()
        await serving


async def _status(flow: Flow, run_id: str) -> str | None:
    try:
        return (await flow.result(run_id)).status
    except RunNotFound:
        return None


async def _ended(flow: Flow, run_id: str) -> Any:
    while True:
        run = await flow.result(run_id)
        if run.status not in ("pending", "running"):
            return run
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
async def test_a_child_created_while_its_parent_is_cancelled_is_cancelled(
    store: EventStore, before: bool
) -> None:
    elsewhere = Flow(store, [order_parent, order_line])  # another process cancels the parent

    async def parent_cancelled() -> None:
        cancelled = await elsewhere.cancel("K", reason="gave up")
        assert cancelled.status == "cancelled"

    wrapped = AroundCreation(store, "K/1", parent_cancelled, before=before)
    flow = Flow(wrapped, [order_parent, order_line])
    await flow.start(order_parent, ["wait-9"], run_id="K", queued=True)
    await flow.recover()  # the parent, recorded first, is driven: it starts the child
    parent = await flow.result("K")
    assert wrapped.meanwhile is None and parent.status == "cancelled"
    # The parent ended before it linked the child: the child, made all the same, is not left
    # waiting for ever.
    assert "1" not in parent.snapshot.children
    left = await flow.result("K/1")
    assert left.status == "cancelled", left.status
    assert left.snapshot.cancellation is not None
    assert "'K' ended cancelled" in (left.snapshot.cancellation.reason or "")
