"""Parallel steps: `asyncio.gather(step(a), step(b), ...)` in workflow code, on every store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from hypothesis import given, settings

from runfold import EventStore, MemoryStore
from runfold.flow import Flow, StepError, UnsupportedAwait, current_step, step, workflow
from runfold.kernel import RetryPolicy, StepCompleted
from runfold.testing import DelegatingStore, Fault, crash_and_resume
from runfold.testing.strategies import fault_schedules
from tests.conftest import Clock

ONCE = RetryPolicy(max_attempts=1)
FINISHED: list[int] = []


async def slower_first(i: int) -> int:
    await asyncio.sleep(0.002 * (10 - i))  # the first called finishes last
    FINISHED.append(i)
    return i * i


@workflow(name="test-fan-out")
async def fan_out(n: int) -> list[int]:
    squares = await asyncio.gather(*(step(slower_first, i) for i in range(n)))
    return [*squares, await step(sum, squares)]


class Appends(DelegatingStore):
    """Records the events of every append."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.batches: list[list[str]] = []

    async def append_if_sequence(self, *args: Any, **kwargs: Any) -> Any:
        self.batches.append([e.event_type for e in args[2]])
        return await super().append_if_sequence(*args, **kwargs)


async def test_ten_parallel_steps_start_in_one_append(store: EventStore) -> None:
    FINISHED.clear()
    appends = Appends(store)
    done = await Flow(appends, [fan_out]).start(fan_out, 10, run_id="f")
    assert done.output == [i * i for i in range(10)] + [285]
    assert sorted(FINISHED) != FINISHED  # they ran together, finishing in another order
    [starts] = [b for b in appends.batches if b.count("step_started") == 10]
    assert starts[:2] == ["run_created", "run_started"]
    # Ids follow call order, not completion order.
    steps = done.snapshot.steps
    assert [steps[str(i + 1)].output for i in range(10)] == [str(i * i).encode() for i in range(10)]
    # A fresh Flow replays the gather from the history without running a step.
    FINISHED.clear()
    fresh = Flow(store, [fan_out])
    assert fresh.interpreter.decide(done.snapshot) == fresh.interpreter.decide(done.snapshot)
    assert FINISHED == []


async def test_a_gather_of_a_hundred_steps(store: EventStore) -> None:
    done = await Flow(store, [fan_out]).start(fan_out, 100, run_id="h")
    assert done.status == "completed" and done.output[-1] == sum(i * i for i in range(100))
    assert len(done.snapshot.steps) == 101


def flaky(i: int) -> str:
    if i == 1 and current_step().attempt == 1:
        raise RuntimeError("busy")
    return f"ok {i} after {current_step().attempt}"


def broken(i: int) -> str:
    raise ValueError(f"broken {i}")


@workflow(name="test-gather-outcomes")
async def outcomes(_: None) -> list[Any]:
    retried = await asyncio.gather(
        step(flaky, 0), step(flaky, 1, retry=RetryPolicy(max_attempts=2)), step(flaky, 2)
    )
    try:
        await asyncio.gather(step(broken, 3, retry=ONCE), step(broken, 4, retry=ONCE))
    except StepError as exc:
        first_failure = exc.step_error
    listed = await asyncio.gather(
        step(broken, 5, retry=ONCE), step(flaky, 6), return_exceptions=True
    )
    return [retried, first_failure, [str(x) for x in listed]]


async def test_each_step_is_retried_on_its_own_and_failures_come_in_call_order(
    store: EventStore, clock: Clock
) -> None:
    flow = Flow(store, [outcomes], clock=clock)
    started = await flow.start(outcomes, None, run_id="o")
    assert started.status == "running"  # step 2 waits for its retry; 1 and 3 are done
    assert [started.snapshot.steps[i].status for i in "123"] == [
        "completed",
        "pending",
        "completed",
    ]
    clock.advance(timedelta(minutes=1))
    await Flow(store, [outcomes], clock=clock).run_until_idle()  # a replay in a fresh process
    done = await flow.result("o")
    assert done.output == [
        ["ok 0 after 1", "ok 1 after 2", "ok 2 after 1"],
        "ValueError: broken 3",
        ["step 'broken' failed: ValueError: broken 5", "ok 6 after 1"],
    ]


@settings(max_examples=12)
@given(schedule=fault_schedules(max_write=14, max_faults=2))
async def test_a_gather_survives_any_fault_schedule(schedule: tuple[Fault, ...]) -> None:
    outcome = await crash_and_resume(fan_out, 4, store=MemoryStore(), schedule=schedule)
    assert outcome.same, outcome


async def test_a_gather_of_a_coroutine_is_refused(store: EventStore) -> None:
    async def helper() -> int:
        return 1

    @workflow(name="test-gather-coroutine")
    async def mixed(_: None) -> None:
        await asyncio.gather(step(slower_first, 1), helper())

    run = await Flow(store, [mixed]).start(mixed, None)
    assert run.status == "failed" and run.snapshot.error_code == UnsupportedAwait.__name__


async def instant(i: int) -> int:
    return i


@workflow(name="test-instant-fan-out")
async def instant_fan_out(n: int) -> list[int]:
    return list(await asyncio.gather(*(step(instant, i) for i in range(n))))


async def test_outcomes_known_together_are_committed_together(store: EventStore) -> None:
    appends = Appends(store)
    done = await Flow(appends, [instant_fan_out]).start(instant_fan_out, 10, run_id="i")
    assert done.output == list(range(10))
    # The creation with the ten starts; the ten outcomes, in call order, with the run's end.
    assert len(appends.batches) == 2, appends.batches
    assert appends.batches[1] == ["step_completed"] * 10 + ["run_completed"]
    events = [e.event for e in await store.read("i")]
    completed = [e.step_id for e in events if isinstance(e, StepCompleted)]
    assert completed == [str(i) for i in range(1, 11)]
