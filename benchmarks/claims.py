"""How often a fleet's workers race for one run, and what a worker's look at the store costs.

`python -m benchmarks.claims --store URL [--runfold PATH]` starts 4 `runfold worker` processes
(`--app benchmarks.claims_app`, polling every 50 ms, 8 runs at once each) on the store, queues
200 runs of a 10-step workflow that sleeps after every third step (so each run comes back to the
fleet as a due wakeup three times), waits for them, stops the fleet with SIGTERM, and prints
as JSON: the drives the workers made, the claims another worker won first (`RunOwned`, from the
workers' last log line), and the store statements one idle look costs (`Worker._look`, counted
on the store's connections in this process; PostgreSQL only). `--runfold` names the `runfold`
executable of another checkout, to measure it the same way (its code, this workflow).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.claims_app import claims_run
from runfold.engine import Worker
from runfold.flow import Flow
from runfold.stores import PostgresStore, open_store

ROOT = Path(__file__).resolve().parent.parent
WORKERS = 4
RUNS = 200
STEPS = 10


async def _prepare(url: str) -> None:
    """Create (or migrate) the store's schema before the workers open it."""
    store = await open_store(url)
    await store.close()


async def _queue_and_wait(url: str) -> None:
    async with await open_store(url) as store:
        flow = Flow(store, [claims_run])
        ids = [(await flow.start(claims_run, STEPS, queued=True)).run_id for _ in range(RUNS)]
        for run_id in ids:
            done = await flow.result(run_id, wait=300)
            assert done.status == "completed", done


async def _statements_per_look(url: str) -> float | None:
    async with await open_store(url) as store:
        if not isinstance(store, PostgresStore):
            return None
        worker = Worker(Flow(store, [claims_run]).engine)
        counted = 0
        fetch = store._fetch

        async def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal counted
            counted += 1
            return await fetch(*args, **kwargs)

        store._fetch = counting
        looks = 20
        for _ in range(looks):
            await worker._look()
        return counted / looks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--runfold", default=str(Path(sys.executable).with_name("runfold")))
    args = parser.parse_args()
    asyncio.run(_prepare(args.store))
    command = [args.runfold, "worker", "--app", "benchmarks.claims_app", "--store", args.store]
    command += ["--poll", "0.05", "--concurrency", "8", "--grace", "10"]
    with tempfile.TemporaryDirectory() as logs:
        paths = [Path(logs) / f"worker-{n}.log" for n in range(WORKERS)]
        fleet = []
        for path in paths:
            with path.open("wb") as log:
                fleet.append(subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log))
        try:
            asyncio.run(_queue_and_wait(args.store))
        finally:
            for process in fleet:
                process.send_signal(signal.SIGTERM)
            for process in fleet:
                process.wait(timeout=60)
        drives = refused = 0
        for path in paths:
            found = re.search(
                r"WorkerCounts\(drives=(\d+), takeovers=\d+, refused=(\d+)", path.read_text()
            )
            if found:
                drives, refused = drives + int(found[1]), refused + int(found[2])
    print(
        json.dumps(
            {
                "drives": drives,
                "refused": refused,
                "refused_share": round(refused / max(drives + refused, 1), 4),
                "statements_per_idle_look": asyncio.run(_statements_per_look(args.store)),
            }
        )
    )


if __name__ == "__main__":
    main()
