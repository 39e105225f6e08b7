"""The fleet benchmark's ceiling: the CPU workflow's step bodies alone, with no store.

`python -m benchmarks.fleet_bare --concurrency N --counter FILE` reads counts of workflows from
stdin, one per line, and runs each workflow's `WORKFLOW_STEPS` calls of `benchmarks.fleet_app.burn`
one after the other, `N` workflows at once on a pool of `N` threads (as a `runfold worker` runs
plain `def` steps), writing the number done so far into FILE. It keeps nothing: what a fleet of
these processes drains per second is what the machine gives the steps' own work at that moment,
the ceiling of any durable fleet of as many processes on it.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from benchmarks.fleet_app import burn
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS

__all__ = ["main"]

_WIDTH = 12
"""Digits of the counter file's one number (rewritten in place)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_bare")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--counter", required=True)
    args = parser.parse_args(argv)
    done = 0
    lock = threading.Lock()
    counter = os.open(args.counter, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(counter, f"{0:{_WIDTH}d}".encode(), 0)

    def workflow(_: int) -> None:
        nonlocal done
        output = "i" * PAYLOAD_BYTES
        for _ in range(WORKFLOW_STEPS):
            output = burn(output)
        with lock:
            done += 1
            os.pwrite(counter, f"{done:{_WIDTH}d}".encode(), 0)

    with ThreadPoolExecutor(args.concurrency) as pool:
        for line in sys.stdin:
            list(pool.map(workflow, range(int(line))))
    os.close(counter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
