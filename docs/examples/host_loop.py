"""A host for `Engine`: sleep until the next wakeup, resume what is due, repeat.

runfold has no scheduler daemon: `Engine` drives a run when asked. This is the smallest process
that asks at the right times. It starts a "reminders" run (send a reminder every 100 ms, three
times, each on a durable timer), then loops on `next_wakeup` / `resume_due` until nothing is
scheduled. Kill it half-way and start it again: the timers are in the store, so it carries on.

Run it with `python docs/examples/host_loop.py [path.db]`; run it twice and the listing at the
end shows both runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta

from runfold import CommandHandler
from runfold.engine import (
    Complete,
    Engine,
    RuntimeDecision,
    ScheduleStep,
    StepInvocation,
    WaitUntil,
    WorkflowInvocation,
)
from runfold.stores import SQLiteStore


class Reminders:
    """Each reminder is a timer, then a step that sends it; the run completes after the last."""

    workflow_names = ("reminders",)

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        run = invocation.snapshot
        plan = json.loads(run.input)
        for number in range(plan["times"]):
            timer = run.waits.get(f"timer-{number}")
            if timer is None or timer.status == "waiting":
                due = run.created_at + timedelta(milliseconds=plan["every_ms"] * (number + 1))
                return WaitUntil(wait_id=f"timer-{number}", resume_at=due)
            sent = run.steps.get(f"send-{number}")
            if sent is None or sent.status != "completed":
                return ScheduleStep(step_id=f"send-{number}", step_name="send", input=run.input)
        return Complete(output=b'"all sent"')

    async def run_step(self, invocation: StepInvocation) -> bytes:
        print(f"  sending reminder {invocation.step_id} of {invocation.run_id}")
        return b'"sent"'


async def host(engine: Engine) -> None:
    """Resume due work until no run has anything scheduled."""
    while (wakeup := await engine.next_wakeup()) is not None:
        delay = (wakeup.due_at - engine.handler.clock()).total_seconds()
        await asyncio.sleep(max(0.0, delay))
        for resumed in await engine.resume_due():
            if resumed.error is not None:
                raise resumed.error


async def main(path: str) -> None:
    async with await SQLiteStore.open(path) as store:
        engine = Engine(CommandHandler(store), Reminders())
        plan = {"to": "ada@example.com", "every_ms": 100, "times": 3}
        run = await engine.start("reminders", json.dumps(plan).encode())
        waiting = ", ".join(w.wait_id for w in run.open_waits())
        print(f"started {run.run_id}: {run.status}, waiting on {waiting}")
        await host(engine)
        page = await store.list_runs(workflow_name="reminders", limit=100)
        print(f"{len(page.items)} run(s) in {path}:")
        for summary in page.items:
            print(f"  {summary.run_id}  {summary.status}  {summary.last_sequence} events")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "runfold.db"))
