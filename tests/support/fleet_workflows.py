"""The workflow the fleet tests run: steps that write a ledger row at start and end, and sleeps.

Module-level so worker subprocesses import the very same definition. The ledger is a file of
lines `start|end run step attempt pid monotonic-ns` (appended with O_APPEND, one write a line):
from it a test counts bodies run twice and bodies run at once by two processes.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

from runfold.flow import current_step, sleep, step, workflow
from runfold.kernel import RetryPolicy

LEDGER_ENV = "RUNFOLD_FLEET_LEDGER"
"""Where the ledger file is: an environment variable, so subprocesses find it."""
STEPS = 10
RETRY = RetryPolicy(max_attempts=20, initial_interval=timedelta(milliseconds=50))
"""More attempts than kills and pauses can interrupt: every run must complete."""


def _write(kind: str) -> None:
    invocation = current_step()
    line = (
        f"{kind} {invocation.run_id} {invocation.step_id} {invocation.attempt} "
        f"{os.getpid()} {time.monotonic_ns()}\n"
    )
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def ledger_step(n: int, work: float) -> int:
    """A body that takes `work` seconds between its start and end rows."""
    _write("start")
    await asyncio.sleep(work)
    _write("end")
    return n * n


@workflow(name="test-fleet")
async def fleet_run(spec: dict[str, float]) -> int:
    total = 0
    for n in range(STEPS):
        total += await step(ledger_step, n, spec["work"], retry=RETRY)
        if n % 4 == 3:
            await sleep(timedelta(seconds=spec["sleep"]))
    return total


EXPECTED = sum(n * n for n in range(STEPS))
"""What every run of `fleet_run` returns."""


def read_ledger(path: Path) -> list[tuple[str, str, str, int, int, int]]:
    """The ledger's rows: (kind, run, step, attempt, pid, monotonic ns)."""
    rows = []
    for line in path.read_text().splitlines():
        kind, run, step_id, attempt, pid, at = line.split()
        rows.append((kind, run, step_id, int(attempt), int(pid), int(at)))
    return rows


def overlaps(rows: list[tuple[str, str, str, int, int, int]]) -> int:
    """How many times a body of a step started while another body of it was running."""
    open_bodies: dict[tuple[str, str], set[tuple[int, int]]] = {}
    found = 0
    for kind, run, step_id, attempt, pid, _ in sorted(rows, key=lambda r: r[5]):
        key = (run, step_id)
        bodies = open_bodies.setdefault(key, set())
        if kind == "start":
            if bodies:
                found += 1
            bodies.add((attempt, pid))
        else:
            bodies.discard((attempt, pid))
    return found


def ran_twice(rows: list[tuple[str, str, str, int, int, int]]) -> int:
    """How many step bodies started more than once."""
    starts: dict[tuple[str, str], int] = {}
    for kind, run, step_id, *_ in rows:
        if kind == "start":
            starts[(run, step_id)] = starts.get((run, step_id), 0) + 1
    return sum(1 for count in starts.values() if count > 1)
