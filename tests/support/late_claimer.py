"""A worker process that opens a SQLite store only when told: one that never saw a past stall.

Run as `python -m tests.support.late_claimer PATH` from the repository root. It prints `ready`
once imported, waits for a line on stdin, then opens the store at PATH, looks for due work once
as worker "late" (`claim_due`, then `orphaned_runs`) and prints what it found as one JSON line:
`{"claimed": [run ids], "orphaned": [run ids]}`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta

from runfold.stores import SQLiteStore


async def look(path: str) -> dict[str, list[str]]:
    """Open the store at `path` and look for due work once, as a worker started just now."""
    async with await SQLiteStore.open(path, busy_timeout=30.0) as store:
        now = datetime.now(UTC)
        claimed = await store.claim_due(
            "late", now, hold_until=now + timedelta(seconds=5), limit=10
        )
        orphaned = await store.orphaned_runs(datetime.now(UTC))
    return {
        "claimed": [due.run_id for due in claimed],
        "orphaned": [run.run_id for run in orphaned],
    }


def main() -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(asyncio.run(look(sys.argv[1]))), flush=True)


if __name__ == "__main__":
    main()
