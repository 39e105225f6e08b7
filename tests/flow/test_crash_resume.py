"""runfold.testing: a workflow crashed at any write and resumed ends as a clean run does."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from runfold import EventStore, MemoryStore
from runfold.flow import Flow, step, workflow
from runfold.kernel import RetryPolicy, StoreUnavailable
from runfold.stores import SQLiteStore
from runfold.testing import CrashingStore, Fault, SimulatedCrash, crash_and_resume
from runfold.testing.strategies import fault_schedules
from tests.support.flow_workflows import chain, order

ORDER = {"id": "B7", "items": ["lamp"], "amount": 30}
APPROVAL = {"approve-B7": "yes"}


@settings(max_examples=25)
@given(schedule=fault_schedules(max_write=12, max_faults=3))
async def test_order_survives_any_fault_schedule(schedule: tuple[Fault, ...]) -> None:
    outcome = await crash_and_resume(
        order, ORDER, store=MemoryStore(), schedule=schedule, events=APPROVAL, run_id="B7"
    )
    assert outcome.expected.status == "completed"
    assert outcome.same, outcome
    assert len(outcome.struck) <= len(schedule)


@settings(max_examples=8)
@given(schedule=fault_schedules(max_write=12, max_faults=2))
async def test_order_survives_faults_on_sqlite(schedule: tuple[Fault, ...], tmp_path: Path) -> None:
    path = tmp_path / f"crash-{abs(hash(schedule))}.db"
    async with await SQLiteStore.open(path) as store:
        outcome = await crash_and_resume(
            order, ORDER, store=store, schedule=schedule, events=APPROVAL, run_id="B7"
        )
    assert outcome.same, outcome


async def test_every_write_of_a_chain_crashed_once(store: EventStore) -> None:
    # Stop after each write in turn: a 4-step run commits 5 times (once per step, then its end).
    for write in range(1, 6):
        outcome = await crash_and_resume(
            chain,
            4,
            store=store,
            schedule=[Fault(write=write, moment="after", kind="stop")],
            run_id=f"chain-{write}",
        )
        assert outcome.same and outcome.actual.output == 6
        assert outcome.restarts == 1


async def test_crashing_store_faults(store: EventStore) -> None:
    crashing = CrashingStore(
        store,
        [
            Fault(write=1, moment="before", kind="fail"),
            Fault(write=2, moment="after", kind="stop"),
        ],
    )
    flow = Flow(crashing, [chain])
    flow.handler.store_retry = None  # the fault reaches the caller
    with pytest.raises(StoreUnavailable):
        await flow.start(chain, 2, run_id="faults")
    assert await store.read("faults") == []  # before: nothing written
    with pytest.raises(SimulatedCrash):
        await flow.start(chain, 2, run_id="faults")
    assert len(await store.read("faults")) > 0  # after: written, though the caller crashed
    with pytest.raises(SimulatedCrash):
        await crashing.read("faults")  # a dead process reads nothing
    crashing.restart()
    done = await Flow(crashing, [chain]).start(chain, 2, run_id="faults")
    assert done.output == 1
    assert [f.write for f in crashing.struck] == [1, 2]


async def test_a_flow_rides_through_failed_writes_and_records_each_once(store: EventStore) -> None:
    schedule = [Fault(write=n, moment=("before", "after")[n % 2], kind="fail") for n in (2, 3, 5)]
    crashing = CrashingStore(store, schedule)
    done = await Flow(crashing, [chain]).start(chain, 3, run_id="faults")
    assert done.output == 3 and [f.write for f in crashing.struck] == [2, 3, 5]
    assert [s.attempt for s in done.snapshot.steps.values()] == [1, 1, 1]  # none spent
    history = [e.event.event_type for e in await store.read("faults")]
    assert history.count("step_started") == 3 and history.count("run_completed") == 1


def test_a_schedule_names_each_write_once() -> None:
    with pytest.raises(ValueError):
        CrashingStore(MemoryStore(), [Fault(write=1, moment="before", kind="fail")] * 2)


def out_of_stock() -> None:
    raise RuntimeError("out of stock")


@workflow(name="test-always-fails")
async def always_fails(_: None) -> None:
    await step(out_of_stock, retry=RetryPolicy(max_attempts=1))


async def test_two_runs_failing_alike_are_not_the_same_unless_asked(store: EventStore) -> None:
    schedule = [Fault(write=2, moment="after", kind="stop")]  # once the run failed
    outcome = await crash_and_resume(always_fails, None, store=store, schedule=schedule)
    assert outcome.expected.status == outcome.actual.status == "failed"
    assert outcome.alike and not outcome.same
    asked = await crash_and_resume(
        always_fails, None, store=store, schedule=schedule, run_id="asked", same_if_failed=True
    )
    assert asked.same
