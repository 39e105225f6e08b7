"""A child process for `tests/flow/test_flow_sending.py`: a `send` from workflow code, killed.

That test imports `target` from here too, so the in-process and the killed runs share one target.

Run as `python -m tests.support.flow_send_worker '<json arguments>' GENERATION` from the
repository root. It opens the store (SQLite file or PostgreSQL schema) and recovers every live
run. Generation 0 starts run `target` (it waits for a "ping") and run `sender`, whose `send`
records the message and then SIGKILLs the process before the step's outcome is recorded.
Generation 1 carries both on and prints the sender's status and output.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from runfold.flow import Flow, get_event, recv, send, set_event, workflow
from runfold.kernel import Envelope, HookReceived
from tests.support.child_workers import open_backend

ARGS: dict[str, Any] = json.loads(sys.argv[1]) if __name__ == "__main__" else {}
GENERATION = int(sys.argv[2]) if __name__ == "__main__" else 0


@workflow(name="test-send-target")
async def target(_: None) -> str:
    got: str = await recv("ping")
    await set_event("pong", f"{got}/pong")
    return got


@workflow(name="test-send-sender")
async def sender(to: str) -> Any:
    await send(to, "ping", topic="ping")
    return await get_event(to, "pong", timeout=30)


class DyingFlow(Flow):
    """A Flow whose process dies once a message from workflow code is recorded."""

    observed_events = Flow.observed_events | {HookReceived}

    async def on_event(self, envelope: Envelope) -> None:
        if type(envelope.event) is HookReceived and envelope.run_id == "target":
            os.kill(os.getpid(), signal.SIGKILL)  # after the message, before the step's outcome
        await super().on_event(envelope)


async def main() -> None:
    async with await open_backend(ARGS) as store:
        flow = (DyingFlow if GENERATION == 0 else Flow)(store, [target, sender])
        await flow.recover()
        await flow.start(target, None, run_id="target")
        run = await flow.start(sender, "target", run_id="sender")
        print(json.dumps([run.status, run.output]), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
