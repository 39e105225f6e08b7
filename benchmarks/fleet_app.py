"""The fleet benchmark's workflows as runfold code, in a module of their own so that the
`runfold worker --app benchmarks.fleet_app` processes import the very same definitions.

Both are `WORKFLOW_STEPS` steps one after the other: `fleet_cpu`'s steps each burn
`CPU_STEP_SECONDS` of the thread's CPU time in a busy loop, `fleet_io`'s each wait
`IO_STEP_SECONDS` in `asyncio.sleep` (a call to a service, say).
"""

from __future__ import annotations

import asyncio
import time

from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS
from runfold.flow import step, workflow

__all__ = ["CPU_STEP_SECONDS", "IO_STEP_SECONDS", "burn", "fleet_cpu", "fleet_io", "wait"]

CPU_STEP_SECONDS = 0.002
IO_STEP_SECONDS = 0.020


def burn(previous: str) -> str:
    """`CPU_STEP_SECONDS` of this thread's CPU time (not wall time: a step descheduled by a
    busy machine still does all its work), then the step's output."""
    end = time.thread_time() + CPU_STEP_SECONDS
    while time.thread_time() < end:
        pass
    return "o" * PAYLOAD_BYTES


async def wait(previous: str) -> str:
    """`IO_STEP_SECONDS` of waiting, then the step's output."""
    await asyncio.sleep(IO_STEP_SECONDS)
    return "o" * PAYLOAD_BYTES


@workflow(name="bench-fleet-cpu")
async def fleet_cpu(input: str) -> str:
    output = input
    for _ in range(WORKFLOW_STEPS):
        output = await step(burn, output)
    return output


@workflow(name="bench-fleet-io")
async def fleet_io(input: str) -> str:
    output = input
    for _ in range(WORKFLOW_STEPS):
        output = await step(wait, output)
    return output
