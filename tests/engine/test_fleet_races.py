"""A fleet's worker acting on what it read while things change under it: a run it lets go
gets input, a schedule's tick meets a store that is down.

Each is staged with a wrapper of the store that makes something happen in the middle of a
chosen call, so the interleaving is the same on every run and every backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from runfold.events import RunReleased
from runfold.flow import Flow, step, wait_for_event, workflow
from runfold.kernel import Envelope, Event, StoreUnavailable
from runfold.stores import EventStore
from runfold.stores.due_work import DueRun
from runfold.testing import DelegatingStore


class AfterRelease(DelegatingStore):
    """Once the append that releases run `run_id` is written, has `meanwhile` run (once), and
    sets `handed_out` when `claim_due` hands the run out (meanwhile, once it began)."""

    def __init__(
        self, inner: EventStore, run_id: str, meanwhile: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(inner)
        self.run_id = run_id
        self.meanwhile: Callable[[], Awaitable[None]] | None = meanwhile
        self.handed_out = asyncio.Event()

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        appended = await super()._append_if_sequence(*call)
        events: Sequence[Event] = call[2]
        meanwhile = self.meanwhile
        if (
            meanwhile is not None
            and call[0] == self.run_id
            and any(isinstance(e, RunReleased) for e in events)
        ):
            self.meanwhile = None
            self.handed_out.clear()  # from now on
            await meanwhile()
        return appended

    async def _forward_claim_due(self, *args: Any, **kwargs: Any) -> list[DueRun]:
        due = await super()._forward_claim_due(*args, **kwargs)
        if any(item.run_id == self.run_id for item in due):
            self.handed_out.set()
        return due


@workflow(name="race-webhook")
async def paid(order: str) -> str:
    payment = await wait_for_event("payment", token=f"pay-{order}")
    text: str = await step(str.upper, f"{order}:{payment}")
    return text


async def test_a_delivery_as_the_worker_releases_the_run_is_driven_at_once(
    store: EventStore,
) -> None:
    """A web process delivers to a run just as its worker's drive releases it, and the worker's
    next look is handed the run while that drive is still ending: the worker drives it again
    once the drive ended, rather than leaving it held for itself, undriven, until the hold
    lapses (a lease's length: 30 s here)."""
    run_id = "order-race"
    web = Flow(store, [paid])

    async def deliver_and_look() -> None:
        await web.deliver("pay-o", "card")  # recorded; the run's `ready` wakeup is due
        await asyncio.wait_for(staged.handed_out.wait(), 10.0)

    staged = AfterRelease(store, run_id, deliver_and_look)
    worker_flow = Flow(staged, [paid])
    serving = asyncio.create_task(
        worker_flow.serve(poll_interval=0.05, lease=timedelta(seconds=30), handle_signals=False)
    )
    try:
        while worker_flow.worker is None:
            await asyncio.sleep(0.01)
        await web.start(paid, "o", run_id=run_id, queued=True)
        finished = await web.result(run_id, wait=5.0)
        assert (finished.status, finished.output) == ("completed", "O:CARD")
    finally:
        worker_flow.stop()
        await serving
    assert staged.meanwhile is None  # the race was staged


class Outage(DelegatingStore):
    """Appends to run `run_id` fail as if the store were down, while `down`; `looks` counts
    the calls of `claim_due`."""

    def __init__(self, inner: EventStore, run_id: str) -> None:
        super().__init__(inner)
        self.run_id = run_id
        self.down = True
        self.refused = 0
        self.looks = 0

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        if self.down and call[0] == self.run_id:
            self.refused += 1
            raise StoreUnavailable("the store is down (staged)")
        return await super()._append_if_sequence(*call)

    async def _forward_claim_due(self, *args: Any, **kwargs: Any) -> list[DueRun]:
        self.looks += 1
        return await super()._forward_claim_due(*args, **kwargs)


@workflow(name="race-tick", schedule="* * * * * *")
async def ticked(tick: str) -> str:
    return tick


async def test_a_tick_whose_run_the_store_refused_is_recorded_once_it_is_back(
    store: EventStore,
) -> None:
    """The store is down as a worker records a tick's run, for longer than the handler tries
    again: the worker records it at a later look, once the store is back, rather than passing
    over the tick for good (the worker lived all along)."""
    now = datetime(2026, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)
    run_id = "race-tick@2026-01-01T00:00:01Z"
    outage = Outage(store, run_id)
    flow = Flow(outage, [ticked], clock=lambda: now)
    flow.handler.store_retry = None  # the outage outlasts any retry
    serving = asyncio.create_task(flow.serve(poll_interval=0.02, handle_signals=False))
    try:
        while outage.looks < 2:  # serving, past the time it counts ticks from
            await asyncio.sleep(0.01)
        now += timedelta(seconds=1)  # the tick at 00:00:01 is due
        while outage.refused < 1:
            await asyncio.sleep(0.01)
        looks = outage.looks
        while outage.looks < looks + 2:  # looks made while the store is still down
            await asyncio.sleep(0.01)
        outage.down = False
        for _ in range(250):  # 5 s: a worker looks every 20 ms
            if await store.read(run_id, limit=1):
                break
            await asyncio.sleep(0.02)
        finished = await flow.result(run_id, wait=5.0)
        assert (finished.status, finished.output) == ("completed", "2026-01-01T00:00:01+00:00")
    finally:
        flow.stop()
        await serving
