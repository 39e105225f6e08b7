"""A child process for `tests/stores/test_exit.py`: a script that leaves its store open.

Run as `python -m tests.support.exit_worker '<json arguments>'` from the repository root. It opens
the store (SQLite file or PostgreSQL schema), starts a run of a workflow that sleeps (so the engine
has written something), and then, never closing the store:

- `raise`: raises out of `asyncio.run`;
- `keep`: keeps the store in a global and returns;
- `interrupt`: prints `ready` and starts runs one after another until interrupted (SIGINT).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

from runfold.flow import Flow, sleep, step, workflow
from runfold.stores.protocol import EventStore
from tests.support.child_workers import open_backend

kept: list[EventStore] = []


def greet(name: str) -> str:
    return f"hello {name}"


@workflow(name="test-exit-nap")
async def nap(name: str) -> str:
    greeting: str = await step(greet, name)
    await sleep(timedelta(hours=1))
    return greeting


async def main(args: dict[str, Any]) -> None:
    store = await open_backend(args)
    flow = Flow(store, [nap])
    await flow.start(nap, "first", run_id="first")
    if args["mode"] == "raise":
        raise RuntimeError("a script's own mistake")
    if args["mode"] == "keep":
        kept.append(store)
        return
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        await flow.start(nap, str(i), run_id=f"run-{i}")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
