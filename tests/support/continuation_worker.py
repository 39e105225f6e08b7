"""A child process for `tests/flow/test_flow_continuation.py`: drives a `counter` chain and SIGKILLs
itself inside a continuation.

Run as `python -m tests.support.continuation_worker '<json arguments>'` from the repository root.
With
`kill_at` = "created", it kills itself once the successor of generation `generation` exists and
before the run links it; with "linked", once the link is appended (with the run's end, in one
append) and before the successor is driven. With
`kill_at` = None it recovers every live run and prints the chain's result as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from runfold.engine import LinkChildOperation, RuntimeDecision, WorkflowInvocation
from runfold.flow import Flow
from runfold.flow.continuation import CONTINUE_KIND
from runfold.kernel import ChildLinked, Envelope
from tests.support.child_workers import open_backend
from tests.support.continuation_workflows import counter


class KillingFlow(Flow):
    """A `Flow` that SIGKILLs its own process at one point of one continuation."""

    kill_at: str | None = None
    generation = 0

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        decision = await super().run_workflow(invocation)
        if (
            self.kill_at == "created"
            and isinstance(decision, LinkChildOperation)
            and decision.kind == CONTINUE_KIND
            and decision.child_run_id == f"c~{self.generation}"
        ):
            os.kill(os.getpid(), signal.SIGKILL)  # the successor exists, the link does not
        return decision

    async def on_event(self, envelope: Envelope) -> None:
        await super().on_event(envelope)
        event = envelope.event
        if (
            self.kill_at == "linked"
            and isinstance(event, ChildLinked)
            and event.kind == CONTINUE_KIND
            and event.child_run_id == f"c~{self.generation}"
        ):
            os.kill(os.getpid(), signal.SIGKILL)  # the run ended, its successor is not started


async def main(args: dict[str, Any]) -> None:
    async with await open_backend(args) as store:
        flow = KillingFlow(store, [counter], step_threads=0)
        flow.kill_at, flow.generation = args["kill_at"], args["generation"]
        if args["kill_at"] is not None:
            await flow.start(counter, {"n": 0, "target": args["target"]}, run_id="c")
            print("not killed", flush=True)
            return
        await flow.recover()
        run = await flow.result("c")
        print(json.dumps({"run_id": run.run_id, "status": run.status, "output": run.output}))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
