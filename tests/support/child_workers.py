"""Child worker processes: how a test starts one, and the store it opens from its JSON arguments.

The tests that kill a worker or let one exit spawn `python -m tests.support.NAME '<json>'`
(`spawn_worker`); the arguments name the backend, `{"backend": "sqlite", "path": ...}` or
`{"backend": "postgres", "dsn": ..., "schema": ...}`, and every worker opens it the same way
(`open_backend`). This module imports only runfold (no pytest), so a child starts quickly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from runfold.stores import PostgresStore, SQLiteStore
from runfold.stores.protocol import EventStore

ROOT = Path(__file__).resolve().parents[2]


def spawn_worker(module: str, args: dict[str, Any]) -> subprocess.Popen[str]:
    """`python -m tests.support.MODULE '<args as JSON>'` from the repository root, its output and
    errors piped for the test to read."""
    return subprocess.Popen(
        [sys.executable, "-m", f"tests.support.{module}", json.dumps(args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def open_backend(args: dict[str, Any]) -> EventStore:
    """The store `args` names: the SQLite file `path`, or the PostgreSQL `schema` at `dsn` (a
    pool of two connections)."""
    if args["backend"] == "sqlite":
        return await SQLiteStore.open(args["path"])
    return await PostgresStore.open(args["dsn"], schema=args["schema"], pool_max=2)
