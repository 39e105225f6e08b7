"""`asyncio.TaskGroup` of steps in workflow code, deterministic, on every store."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from hypothesis import given, settings

from runfold import EventStore, MemoryStore
from runfold.flow import Flow, FlowNonDeterminism, StepError, UnsupportedAwait, step, workflow
from runfold.kernel import RetryPolicy
from runfold.testing import Fault, crash_and_resume
from runfold.testing.strategies import fault_schedules
from tests.flow.test_flow_family_crashes import opened
from tests.flow.test_flow_parallel import FINISHED, Appends, slower_first

ONCE = RetryPolicy(max_attempts=1)


@workflow(name="test-task-group")
async def grouped(n: int) -> list[int]:
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(step(slower_first, i)) for i in range(n)]
    squares = [t.result() for t in tasks]
    return [*squares, await step(sum, squares)]


async def test_a_task_group_of_ten_steps_starts_them_in_one_append(store: EventStore) -> None:
    FINISHED.clear()
    appends = Appends(store)
    done = await Flow(appends, [grouped]).start(grouped, 10, run_id="g")
    assert done.status == "completed", done.error
    assert done.output == [i * i for i in range(10)] + [285]
    assert sorted(FINISHED) != FINISHED  # they ran together, finishing in another order
    [starts] = [b for b in appends.batches if b.count("step_started") == 10]
    assert starts[:2] == ["run_created", "run_started"]
    # Ids follow creation order, not completion order.
    steps = done.snapshot.steps
    assert [steps[str(i + 1)].output for i in range(10)] == [str(i * i).encode() for i in range(10)]
    # A fresh Flow replays the group from the history without running a step.
    FINISHED.clear()
    fresh = Flow(store, [grouped])
    assert fresh.interpreter.decide(done.snapshot) == fresh.interpreter.decide(done.snapshot)
    assert FINISHED == []


def broken(i: int) -> str:
    raise ValueError(f"broken {i}")


def fine(i: int) -> str:
    return f"fine {i}"


@workflow(name="test-task-group-failures")
async def failing(_: None) -> list[str]:
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(step(broken, 1, retry=ONCE))
            ok = tg.create_task(step(fine, 2))
            tg.create_task(step(broken, 3, retry=ONCE))
    except* StepError as group:
        failures = [str(e) for e in group.exceptions]
    return [*failures, ok.result()]


async def test_failed_steps_of_a_group_come_in_creation_order(store: EventStore) -> None:
    flow = Flow(store, [failing])
    done = await flow.start(failing, None, run_id="tf")
    assert done.status == "completed", done.error
    assert done.output == [
        "step 'broken' failed: ValueError: broken 1",
        "step 'broken' failed: ValueError: broken 3",
        "fine 2",  # a sibling of a failed step is not cancelled: they ran together
    ]
    again = Flow(store, [failing])  # a replay in a fresh process gives the same outcome
    assert again.interpreter.decide(done.snapshot) == flow.interpreter.decide(done.snapshot)


@workflow(name="test-task-group-mixed")
async def mixed_group(_: None) -> list[Any]:
    async with asyncio.TaskGroup() as tg:
        first = tg.create_task(step(fine, 1))
        awaited = await step(fine, 2)  # the block's own call, before the group's steps
        seen = await first  # a task awaited in the block is that step, run now
        last = tg.create_task(step(fine, 3))
    return [awaited, seen, last.result(), await first]


async def test_a_group_with_its_own_awaits_is_deterministic(store: EventStore) -> None:
    done = await Flow(store, [mixed_group]).start(mixed_group, None, run_id="tm")
    assert done.status == "completed", done.error
    assert done.output == ["fine 2", "fine 1", "fine 3", "fine 1"]
    steps = done.snapshot.steps
    assert [steps[i].output for i in "123"] == [b'"fine 2"', b'"fine 1"', b'"fine 3"']


@workflow(name="test-task-group-raising-block")
async def raising_block(_: None) -> list[str]:
    try:
        async with asyncio.TaskGroup() as tg:
            never = tg.create_task(step(fine, 1))
            raise ValueError("changed its mind")
    except* ValueError as group:
        seen = [str(e) for e in group.exceptions]
    return [*seen, str(never.cancelled()), await step(fine, 2)]


async def test_a_group_whose_block_raises_abandons_its_steps(store: EventStore) -> None:
    done = await Flow(store, [raising_block]).start(raising_block, None, run_id="tx")
    assert done.status == "completed", done.error
    assert done.output == ["changed its mind", "True", "fine 2"]
    assert [s.step_name for s in done.snapshot.steps.values()] == ["fine"]  # 1 never ran


async def helper() -> int:
    return 1


@workflow(name="test-task-group-coroutine")
async def coroutine_task(_: None) -> None:
    async with asyncio.TaskGroup() as tg:
        tg.create_task(helper())


@workflow(name="test-task-group-timer")
async def timer_in_code(_: None) -> None:
    await asyncio.sleep(1)


async def test_what_cannot_be_deterministic_is_refused_by_name(store: EventStore) -> None:
    flow = Flow(store, [coroutine_task, timer_in_code])
    run = await flow.start(coroutine_task, None, run_id="tc")
    assert run.status == "failed" and run.snapshot.error_code == UnsupportedAwait.__name__
    assert run.error is not None and "made a task of helper" in run.error
    run = await flow.start(timer_in_code, None, run_id="tt")
    assert run.status == "failed" and run.snapshot.error_code == UnsupportedAwait.__name__
    assert run.error is not None and "call_later" in run.error


@workflow(name="test-task-group-changed")
async def reordered(_: None) -> list[int]:
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(step(slower_first, i)) for i in (2, 1)]
    return [t.result() for t in tasks]


async def test_a_group_created_in_another_order_is_non_determinism(store: EventStore) -> None:
    done = await Flow(store, [grouped]).start(grouped, 2, run_id="tr")
    assert done.status == "completed"
    code = Flow(store, [reordered]).interpreter
    code.workflows = {"test-task-group": reordered}
    with pytest.raises(FlowNonDeterminism, match=r"at call 1: .*another input"):
        code.decide(done.snapshot)


@settings(max_examples=12)
@given(schedule=fault_schedules(max_write=14, max_faults=2))
async def test_a_task_group_survives_any_fault_schedule(schedule: tuple[Fault, ...]) -> None:
    outcome = await crash_and_resume(grouped, 4, store=MemoryStore(), schedule=schedule)
    assert outcome.same, outcome


SCHEDULES = [
    (Fault(write=2, moment="after", kind="stop"),),
    (Fault(write=2, moment="before", kind="stop"), Fault(write=4, moment="after", kind="fail")),
    (Fault(write=3, moment="after", kind="stop"), Fault(write=5, moment="after", kind="stop")),
]


async def test_a_task_group_survives_crashes_on_every_store(store: EventStore) -> None:
    for i, schedule in enumerate(SCHEDULES):
        outcome = await crash_and_resume(
            grouped, 4, store=store, schedule=schedule, run_id=f"crash-{i}"
        )
        assert outcome.same, outcome
        assert outcome.struck, outcome  # the faults did strike


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@settings(max_examples=8, deadline=None)
@given(schedule=fault_schedules(max_write=10, max_faults=2))
async def test_a_task_group_survives_any_fault_schedule_on_a_real_store(
    backend: str, schedule: tuple[Fault, ...]
) -> None:
    async with opened(backend) as store:
        outcome = await crash_and_resume(
            grouped, 3, store=store, schedule=schedule, run_id=f"g-{uuid.uuid4().hex[:8]}"
        )
    assert outcome.same, outcome
