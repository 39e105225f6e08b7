"""The workflow and queues the queue tests serve from real `runfold worker` processes.

Module-level so worker subprocesses import the very same definitions (`--app
tests.support.queue_workflows`). Each run's one step writes a ledger row at its start and its end
(`start|end run pid monotonic-ns`, appended with O_APPEND, one write a line): from it a test
counts the bodies running at once, in all and per process.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

from runfold.flow import Queue, current_step, sleep, step, workflow

LEDGER_ENV = "RUNFOLD_QUEUE_LEDGER"
"""Where the ledger file is: an environment variable, so subprocesses find it."""

emails = Queue(name="emails", concurrency=3, worker_concurrency=2)
"""At most 3 runs at once across the fleet, 2 per worker."""
reports = Queue(name="reports", rate_limit=2, rate_period=timedelta(seconds=1))
"""At most 2 starts a second across the fleet."""
ordered = Queue(name="ordered", concurrency=1)
"""One run at a time: they start in priority order."""
sleepy = Queue(name="sleepy", concurrency=3, worker_concurrency=1)
"""3 runs at once across the fleet, 1 per worker, though each run sleeps between its steps."""


def _write(kind: str) -> None:
    line = f"{kind} {current_step().run_id} {os.getpid()} {time.monotonic_ns()}\n"
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def body(seconds: float) -> str:
    _write("start")
    await asyncio.sleep(seconds)
    _write("end")
    return "done"


@workflow(name="test-queued")
async def queued_run(seconds: float) -> str:
    done: str = await step(body, seconds)
    return done


@workflow(name="test-queued-sleepy")
async def sleepy_run(seconds: float) -> str:
    """Three steps with a sleep between each: the run is released, then resumed, twice."""
    for _ in range(2):
        await step(body, seconds)
        await sleep(timedelta(seconds=seconds))
    done: str = await step(body, seconds)
    return done


def read_ledger(path: Path) -> list[tuple[str, str, int, int]]:
    """The ledger's rows: (kind, run, pid, monotonic ns), in time order."""
    rows = []
    for line in path.read_text().splitlines():
        kind, run, pid, at = line.split()
        rows.append((kind, run, int(pid), int(at)))
    return sorted(rows, key=lambda row: row[3])


def most_at_once(rows: list[tuple[str, str, int, int]], pid: int | None = None) -> int:
    """The most bodies running at once (of process `pid`, or of any)."""
    running, most = 0, 0
    for kind, _, row_pid, _ in rows:
        if pid is not None and row_pid != pid:
            continue
        running += 1 if kind == "start" else -1
        most = max(most, running)
    return most
