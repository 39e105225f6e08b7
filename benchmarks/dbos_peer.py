"""The DBOS Transact peer (benchmark-only import): the workflow benchmark's 10-step sequential
workflow as DBOS code, with DBOS's primary (synchronous) API; and the 10 parallel steps of the
durable-functions benchmark, with its async API (`asyncio.gather` of async steps)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping

from dbos import DBOS, DBOSConfig

from benchmarks.harness import StepClock
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS

__all__ = ["CLOCK", "dbos_launched", "parallel_workflow", "sequential_workflow"]

CLOCK = StepClock()
"""Stamped by every step body; DBOS steps are module functions, so the clock is one too."""


@DBOS.step()
def _step(input: str) -> str:
    CLOCK.step()
    return "o" * PAYLOAD_BYTES


@DBOS.workflow()
def sequential_workflow(input: str) -> str:
    """`WORKFLOW_STEPS` steps, one after the other, each fed the previous one's output."""
    output = input
    for _ in range(WORKFLOW_STEPS):
        output = _step(output)
    return output


@DBOS.step()
async def _async_step(input: str) -> str:
    return "o" * PAYLOAD_BYTES


@DBOS.workflow()
async def parallel_workflow(input: str) -> list[str]:
    """`WORKFLOW_STEPS` steps at once, each fed the input."""
    return list(await asyncio.gather(*(_async_step(input) for _ in range(WORKFLOW_STEPS))))


@contextlib.contextmanager
def dbos_launched(settings: Mapping[str, str]) -> Iterator[None]:
    """DBOS launched on the system database `settings` name (a backend's `dbos_config`),
    destroyed afterwards (its registry of workflows stays, for the next launch)."""
    config: DBOSConfig = {
        "name": "runfold-bench",
        "log_level": "WARNING",
        "system_database_url": settings["system_database_url"],
    }
    if "dbos_system_schema" in settings:
        config["dbos_system_schema"] = settings["dbos_system_schema"]
    DBOS(config=config)
    try:
        DBOS.launch()
        yield
    finally:
        DBOS.destroy()
