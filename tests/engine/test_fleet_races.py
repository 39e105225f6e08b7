"""Races of a fleet's workers with what happens elsewhere as they let a run go.

Each is staged with a wrapper of the store that lets something happen in the middle of a
chosen call, so the interleaving is the same on every run and every backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from runfold.events import RunReleased
from runfold.flow import Flow, step, wait_for_event, workflow
from runfold.kernel import Envelope, Event
from runfold.stores import EventStore
from runfold.stores.due_work import DueRun, Queue
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

    async def _forward_claim_due(
        self,
        worker_id: str,
        now: datetime,
        *,
        hold_until: datetime,
        limit: int,
        workflow_names: Collection[str] | None = None,
        queues: Collection[Queue] = (),
    ) -> list[DueRun]:
        due = await super()._forward_claim_due(
            worker_id,
            now,
            hold_until=hold_until,
            limit=limit,
            workflow_names=workflow_names,
            queues=queues,
        )
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
