"""The claim benchmark's workflow, in a module of its own so that `runfold worker --app
benchmarks.claims_app` processes import the very same definition: 10 short I/O steps with a
sleep after every third, so its runs come back to the fleet as due wakeups as well as queued.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from runfold.flow import sleep, step, workflow

__all__ = ["claims_run"]


async def _io(n: int) -> int:
    await asyncio.sleep(0.002)
    return n


@workflow(name="bench-claims")
async def claims_run(steps: int) -> int:
    total = 0
    for n in range(steps):
        total += await step(_io, n)
        if n % 3 == 2:
            await sleep(timedelta(milliseconds=30))
    return total
