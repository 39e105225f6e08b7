"""A child process for `tests/flow/test_flow_sigkill.py`: drives order workflows until killed.

Run as `python -m tests.support.flow_worker '<json arguments>'` from the repository root. It opens
the store (SQLite file or PostgreSQL schema), prints `ready`, recovers every live run, then carries
runs `order-0 … order-{n-1}` to their end, one after another, printing `done <run id>` after
each; with `report` it prints their outputs as one JSON line at the end. The parent SIGKILLs
it at random moments.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from runfold.flow import Flow
from runfold.testing import RoundClock, run_to_end
from tests.support.child_workers import open_backend
from tests.support.flow_workflows import order


def order_input(i: int) -> dict[str, Any]:
    """The input of run `order-{i}`."""
    return {"id": str(i), "items": ["item"] * (i % 3 + 1), "amount": 10 + i}


def approvals(n: int) -> dict[str, str]:
    """What the approvers answer: every third order is rejected."""
    return {f"approve-{i}": "no" if i % 3 == 2 else "yes" for i in range(n)}


async def main(args: dict[str, Any]) -> None:
    n = args["runs"]
    async with await open_backend(args) as store:
        # Each process's clock starts later than the last one's: time moves on across restarts.
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=100 * args["generation"])
        clock = RoundClock(start)
        flow = Flow(store, [order], clock=clock)
        print("ready", flush=True)
        outputs = {}
        for i in range(n):
            run = await run_to_end(
                flow,
                order,
                order_input(i),
                run_id=f"order-{i}",
                events=approvals(n),
                clock=clock,
            )
            outputs[run.run_id] = [run.status, run.output]
            print(f"done {run.run_id}", flush=True)
        if args.get("report"):
            print(json.dumps(outputs), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
