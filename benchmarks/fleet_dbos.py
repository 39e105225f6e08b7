"""The fleet benchmark's DBOS Transact peer (benchmark-only import): the two workflows of
`benchmarks.fleet_app` as DBOS code, and the worker process that serves them from a queue.

`python -m benchmarks.fleet_dbos --url URL --schema S --executor ID --concurrency N --poll P`
launches DBOS on the system database in schema S under executor id ID, registers the queue
`QUEUE` with `worker_concurrency=N` and `polling_interval_sec=P`, prints `ready`, and serves
until SIGTERM. The benchmark enqueues with a `DBOSClient` (`client`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from dbos import DBOS, DBOSClient, DBOSConfig

from benchmarks.fleet_app import burn, wait
from benchmarks.workloads import WORKFLOW_STEPS

__all__ = ["APP", "QUEUE", "VERSION", "client", "dbos_fleet_cpu", "dbos_fleet_io", "main"]

APP = "runfold-bench-fleet"
QUEUE = "bench-fleet"
VERSION = "bench"
"""One application version for every process, so each dequeues what the client enqueued."""
QUEUE_THREAD_START = 1.5
"""Seconds DBOS's queue manager takes, at most, to start polling a queue registered after
launch (it looks for new queues every second)."""


@DBOS.step()
def _burn(previous: str) -> str:
    return burn(previous)


@DBOS.step()
async def _wait(previous: str) -> str:
    return await wait(previous)


@DBOS.workflow(name="bench-fleet-cpu")
def dbos_fleet_cpu(input: str) -> str:
    output = input
    for _ in range(WORKFLOW_STEPS):
        output = _burn(output)
    return output


@DBOS.workflow(name="bench-fleet-io")
async def dbos_fleet_io(input: str) -> str:
    output = input
    for _ in range(WORKFLOW_STEPS):
        output = await _wait(output)
    return output


def client(url: str, schema: str) -> DBOSClient:
    """A client enqueueing onto the workers' queue in `schema` (it runs no workflow)."""
    return DBOSClient(system_database_url=url, dbos_system_schema=schema, application_name=APP)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_dbos")
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--executor", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--poll", type=float, required=True)
    args = parser.parse_args(argv)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    config: DBOSConfig = {
        "name": APP,
        "log_level": "WARNING",
        "system_database_url": args.url,
        "dbos_system_schema": args.schema,
        "executor_id": args.executor,
        "application_version": VERSION,
    }
    DBOS(config=config)
    try:
        DBOS.launch()
        DBOS.register_queue(
            QUEUE, worker_concurrency=args.concurrency, polling_interval_sec=args.poll
        )
        time.sleep(QUEUE_THREAD_START)
        print("ready", flush=True)
        # A wait with a timeout: the kernel may hand SIGTERM to one of DBOS's threads, and a main
        # thread blocked for good in `wait()` would never run the handler.
        while not stopping.wait(timeout=0.2):
            pass
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
