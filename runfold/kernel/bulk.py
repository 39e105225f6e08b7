"""Pausing CPython's cycle collector while a read or a fold builds many objects at once.

A replay allocates a few objects per event (the decoded row, the event, its envelope, the
records of the fold), none of them in a reference cycle. Each 700 allocations the collector
runs anyway, and every so often it walks the whole heap (a "full" collection, triggered when
the objects promoted since the last one reach a quarter of the heap): in a process that holds
much, those walks cost more than the decode and the fold together. With the collector paused
for the length of the work, objects freed by reference counting are never looked at, and the
ones kept are looked at once, at the next collection.

The pause is process-wide (CPython has no other kind) and lasts one synchronous call, never
across an `await`. It is taken only when the collector is on, and ended only by the call that
took it: work that overlaps in another thread may run with the collector on again, which
costs time, never correctness, since none of this work creates cycles for it to find.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["BULK", "in_bulk"]

P = ParamSpec("P")
T = TypeVar("T")

BULK = 1_000
"""Rows or events from which a read or a fold pauses the collector.

Below it, the collector would run a young-generation pass or two, which cost less than the
pause."""


def in_bulk(count: int, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`work(*args, **kwargs)`, with the cycle collector paused if `count` is at least `BULK`.

    `count` is how many rows or events `work` builds objects for; a collector already off is
    left off.
    """
    if count < BULK or not gc.isenabled():
        return work(*args, **kwargs)
    gc.disable()
    try:
        return work(*args, **kwargs)
    finally:
        gc.enable()
