"""Launching the peers a benchmark compares with, or saying in a remark why one is missing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType

from benchmarks.backend import Backend
from benchmarks.harness import Remark, Result

__all__ = ["dbos_on"]


@contextlib.contextmanager
def dbos_on(
    backend: Backend, group: str, remarks: list[Result | Remark]
) -> Iterator[ModuleType | None]:
    """`benchmarks.dbos_peer` with DBOS launched on a fresh system database of `backend` (until
    the block ends), or None and a remark of `group` saying why DBOS is not there."""
    try:
        from benchmarks import dbos_peer
    except ImportError:
        remarks.append(Remark(group=group, text="DBOS is not installed: no peer rows."))
        yield None
        return
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(dbos_peer.dbos_launched(stack.enter_context(backend.dbos_config())))
        except Exception as exc:  # a peer that cannot run here is reported, not hidden
            remarks.append(
                Remark(group=group, text=f"DBOS could not start on {backend.name}: {exc!r}.")
            )
            yield None
            return
        yield dbos_peer
