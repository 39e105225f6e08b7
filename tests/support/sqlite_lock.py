"""Another process that takes a SQLite file's write lock when told, and lets it go when told.

As a worker stopped in the middle of a transaction holds it (or an application sharing the file
in a long transaction): every other connection's writes wait until it lets go.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
print("ready", flush=True)
sys.stdin.readline()
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@contextlib.contextmanager
def lock_holder(path: str) -> Iterator[subprocess.Popen[str]]:
    """Another process, started and ready to take the file's write lock (`take`, `let_go`)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        yield holder
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=10)
        holder.stdout.close()


@contextlib.contextmanager
def write_lock_held(path: str) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds the file's write lock from the block's start to its end.

    `let_go` lets it go sooner.
    """
    with lock_holder(path) as holder:
        take(holder)
        yield holder


def take(holder: subprocess.Popen[str]) -> None:
    """Make the holder take the write lock; return once it holds it."""
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "locked"


def let_go(holder: subprocess.Popen[str]) -> None:
    """Make the holder let the write lock go (it rolls back and ends)."""
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
