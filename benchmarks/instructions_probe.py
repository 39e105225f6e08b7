"""`python -m benchmarks.instructions_probe WORKFLOWS`: run `WORKFLOWS` 10-step workflows through
the engine on `MemoryStore`, after a warm-up, and nothing else; `benchmarks.instructions` runs it
under callgrind twice (with none and with some) and takes the difference."""

from __future__ import annotations

import asyncio
import sys

from benchmarks.workflows import SequentialWorkflow
from benchmarks.workloads import PAYLOAD_BYTES
from runfold import CommandHandler, MemoryStore
from runfold.engine import Engine

WARM_UP = 3
"""Workflows run before the counted ones, in both runs: imports, caches and first calls."""


async def _main(workflows: int) -> None:
    engine = Engine(CommandHandler(MemoryStore()), SequentialWorkflow())
    for _ in range(WARM_UP + workflows):
        run = await engine.start("sequential", b"i" * PAYLOAD_BYTES)
        assert run.status == "completed"


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1])))
