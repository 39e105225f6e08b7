"""A workflow run driven by hand through `CommandHandler` on a SQLite file.

Run it with `make demo` (or `python docs/examples/quickstart.py [path.db]`). Each run adds one
order-fulfilment run to the file and prints its timeline; run it twice and the listing at the
end shows both runs.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from runfold import (
    CommandHandler,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateRun,
    CreateWait,
    LazyStep,
    RecordProgress,
    RetryPolicy,
    RetryStep,
    SetAttributes,
    StartRun,
    StartStep,
    correlation_id,
    new_run_id,
)
from runfold.stores import SQLiteStore


async def main(path: str) -> None:
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store)
        run_id = new_run_id()
        order = b'{"order": 1042, "items": 3}'
        await handler.execute(
            run_id, StartRun(create=CreateRun(workflow_name="order-fulfilment", input=order))
        )
        await handler.execute(run_id, SetAttributes(changes={"customer": "acme", "region": "eu"}))

        # Two steps; the card charge fails once and is retried.
        retry = RetryPolicy(max_attempts=3, initial_interval=timedelta(milliseconds=10))
        for step_id in ("reserve-stock", "charge-card"):
            lazy = LazyStep(step_name=step_id, input=order, retry=retry)
            started = await handler.execute(run_id, StartStep(step_id=step_id, lazy=lazy))
            assert started.created_step
        await handler.execute(run_id, CompleteStep(step_id="reserve-stock", output=b'"ok"'))
        await handler.execute(
            run_id,
            RetryStep(
                step_id="charge-card",
                error=b'"gateway timeout"',
                retry_after=handler.clock() + timedelta(milliseconds=10),
            ),
        )
        await asyncio.sleep(0.02)
        await handler.execute(run_id, StartStep(step_id="charge-card"))
        await handler.execute(run_id, CompleteStep(step_id="charge-card", output=b'"paid"'))
        await handler.execute(run_id, RecordProgress(progress_id="payment", completed=2, total=3))

        # A durable timer and a hook the warehouse calls back on.
        await handler.execute(
            run_id,
            CreateWait(wait_id="cool-off", resume_at=handler.clock() + timedelta(seconds=1)),
        )
        await handler.execute(run_id, CompleteWait(wait_id="cool-off"))
        token = f"warehouse-{run_id}"
        await handler.execute(run_id, CreateHook(hook_id="shipped", token=token))
        await handler.deliver(token, b'{"tracking": "ZX81"}', delivery_id="d-1")
        done = await handler.execute(run_id, CompleteRun(output=b'{"status": "shipped"}'))

        print(f"run {run_id}: {done.snapshot.status}")
        for envelope in await handler.history(run_id):
            event = envelope.event
            subject = correlation_id(event) or ""
            print(f"  {envelope.sequence:>3}  {event.event_type:<18} {subject}")
        for name, step in done.snapshot.steps.items():
            print(f"  step {name}: {step.status} after {step.attempt} attempt(s)")

        page = await store.list_runs(workflow_name="order-fulfilment", limit=10)
        print(f"{len(page.items)} run(s) in {path}:")
        for summary in page.items:
            print(f"  {summary.run_id}  {summary.status}  {summary.last_sequence} events")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "runfold.db"))
