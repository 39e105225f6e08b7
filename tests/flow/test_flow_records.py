"""Attributes, progress and a run's timeout from `runfold.flow` code, on every store."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from runfold import EventStore, MemoryStore
from runfold.engine import RunDefinitionConflict
from runfold.flow import (
    Flow,
    FlowNonDeterminism,
    FlowRun,
    report_progress,
    set_attributes,
    sleep,
    step,
    workflow,
)
from runfold.kernel import Envelope
from runfold.testing import DelegatingStore
from tests.conftest import Clock


def pack(order_id: str) -> str:
    return f"parcel {order_id}"


@workflow(name="test-recorded")
async def recorded(order_id: str) -> str:
    await set_attributes({"customer": "ada", "stage": "packing"})
    await report_progress(1, total=2, message="packing")
    parcel: str = await step(pack, order_id)
    await sleep(timedelta(minutes=1))
    await set_attributes({"stage": "shipped", "customer": None})
    await report_progress(2, total=2, message="shipped")
    return parcel


async def test_attributes_and_progress_are_recorded_once(store: EventStore, clock: Clock) -> None:
    flow = Flow(store, [recorded], clock=clock)
    started = await flow.start(recorded, "P1", run_id="p")
    assert dict(started.snapshot.attributes) == {"customer": "ada", "stage": "packing"}
    assert [p.message for p in started.snapshot.progress.values()] == ["packing"]
    clock.advance(timedelta(minutes=1))
    await Flow(store, [recorded], clock=clock).run_until_idle()  # a replay goes past them
    done = await flow.result("p")
    assert (done.status, done.output) == ("completed", "parcel P1")
    assert dict(done.snapshot.attributes) == {"stage": "shipped"}
    progress = done.snapshot.progress
    assert [(p.completed, p.total, p.message) for p in progress.values()] == [
        (1, 2, "packing"),
        (2, 2, "shipped"),
    ]
    kinds = [e.event.event_type for e in await store.read("p")]
    assert kinds.count("attributes_set") == 2 and kinds.count("progress_recorded") == 2


async def test_a_step_where_progress_was_recorded_is_reported(store: EventStore) -> None:
    @workflow(name="test-drifting-records")
    async def drifting(_: None) -> None:
        await report_progress(1)
        await sleep(timedelta(days=1))

    await Flow(store, [drifting]).start(drifting, None, run_id="d")

    @workflow(name="test-drifting-records")  # type: ignore[no-redef]  # redeployed
    async def drifting(_: None) -> None:
        await step(pack, "x")

    with pytest.raises(FlowNonDeterminism) as caught:
        await Flow(store, [drifting]).engine.drive("d")
    assert (caught.value.recorded, caught.value.asked) == ("report_progress", "step 'pack'")


@workflow(name="test-slow-order")
async def slow_order(order_id: str) -> str:
    await sleep(timedelta(hours=2))
    return order_id


async def test_a_timeout_is_fixed_at_the_first_start(store: EventStore, clock: Clock) -> None:
    flow = Flow(store, [slow_order], clock=clock)
    first = await flow.start(slow_order, "o", run_id="o", timeout=timedelta(hours=1))
    clock.advance(timedelta(minutes=5))
    again = await flow.start(slow_order, "o", run_id="o", timeout=timedelta(hours=1))  # a retry
    assert again.snapshot.deadline == first.snapshot.deadline == clock.now + timedelta(minutes=55)
    with pytest.raises(RunDefinitionConflict):
        await flow.start(slow_order, "other", run_id="o", timeout=timedelta(hours=1))
    clock.advance(timedelta(hours=1))
    await flow.run_until_idle()
    ended = await flow.result("o")
    assert ended.status == "timed_out"
    # Its timer went with it: nothing is due for the run any more.
    later = clock.now + timedelta(days=1)
    assert await flow.engine.open_suspensions(later) == ()
    assert await store.due_wakeups(later, limit=10) == []


class RacedByAnotherStart(DelegatingStore):
    """Lets another process's start of the same run commit right after this one's nth read."""

    def __init__(
        self, inner: EventStore, racer: Callable[[], Awaitable[object]], reads: int
    ) -> None:
        super().__init__(inner)
        self.racer: Callable[[], Awaitable[object]] | None = racer
        self.reads = reads

    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        found = await super()._read(run_id, after, limit, descending)
        self.reads -= 1
        racer, self.racer = (self.racer, None) if self.reads == 0 else (None, self.racer)
        if racer is not None:
            await racer()
        return found


@pytest.mark.parametrize("reads", [1, 2])  # before its deadline is fixed; before it records
async def test_a_start_racing_the_first_start_gets_its_deadline(
    store: EventStore, clock: Clock, caplog: pytest.LogCaptureFixture, reads: int
) -> None:
    # Two web requests for one order: the second read no run, then the first recorded it with
    # its deadline, a moment before the second's. The same start: not a conflict.
    first_flow = Flow(store, [slow_order], clock=clock)
    later = Clock(clock.now + timedelta(seconds=1))

    async def first() -> FlowRun:
        return await first_flow.start(slow_order, "o", run_id="o", timeout=timedelta(hours=1))

    raced = RacedByAnotherStart(store, first, reads)
    second = await Flow(raced, [slow_order], clock=later).start(
        slow_order, "o", run_id="o", timeout=timedelta(hours=1)
    )
    assert raced.racer is None  # the first start did go in between
    assert second.snapshot.deadline == clock.now + timedelta(hours=1)
    # The refused first try is not logged as a failure to record (with two tracebacks).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    with pytest.raises(RunDefinitionConflict):  # another input is still another run
        await Flow(store, [slow_order], clock=later).start(
            slow_order, "other", run_id="o", timeout=timedelta(hours=1)
        )


async def test_a_timeout_must_be_positive() -> None:
    flow = Flow(MemoryStore(), [slow_order])
    with pytest.raises(ValueError, match="timeout"):
        await flow.start(slow_order, "o", timeout=timedelta(0))
