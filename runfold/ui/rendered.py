"""Pages the inspector rendered lately, kept by what they show, so many operators looking at the
same run cost one rendering.

A run's page is a function of the run's head and the page's query: the key says both, so a
page is never shown stale; a live run's details also depend on the time (the timeline reaches
"now"), so their key holds the second they were rendered in. The runs page's counts, which read
every run's index row, are kept for `COUNTS_FRESH_FOR` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from starlette.responses import HTMLResponse, Response

__all__ = ["COUNTS_FRESH_FOR", "RENDERED_KEPT", "Kept", "Recent", "RenderedPages"]

RENDERED_KEPT = 64
"""How many rendered pages the inspector keeps (the least recently asked for go first)."""
COUNTS_FRESH_FOR = 2.0
"""Seconds the runs page's counts by status are reused: they cost a read of every run's row."""

T = TypeVar("T")


class Kept(Generic[T]):
    """The last `size` values put, by key; getting one makes it the most recent."""

    def __init__(self, size: int = RENDERED_KEPT) -> None:
        self._size = size
        self._values: OrderedDict[Hashable, T] = OrderedDict()

    def get(self, key: Hashable) -> T | None:
        """The value put under `key`, or None."""
        found = self._values.get(key)
        if found is not None:
            self._values.move_to_end(key)
        return found

    def put(self, key: Hashable, value: T) -> None:
        """Keep `value` under `key`, dropping the least recent value past the size."""
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self._size:
            self._values.popitem(last=False)


class Recent(Generic[T]):
    """Values computed at most `fresh_for` seconds ago, by key (`COUNTS_FRESH_FOR`).

    One computation per key at a time: while a value is recomputed, requests get the previous
    one (or, when there is none yet, wait for the computation), so that a value's expiry never
    sets every request computing it at once.
    """

    def __init__(self, fresh_for: float = COUNTS_FRESH_FOR, size: int = RENDERED_KEPT) -> None:
        self._fresh_for = fresh_for
        self._kept: Kept[tuple[float, T]] = Kept(size)
        self._pending: dict[Hashable, asyncio.Future[T]] = {}

    async def get(self, key: Hashable, compute: Callable[[], Awaitable[T]]) -> T:
        """The value of `key` computed at most `fresh_for` seconds ago, else `compute()`'s."""
        found = self._kept.get(key)
        if found is not None and time.monotonic() - found[0] < self._fresh_for:
            return found[1]
        task = self._pending.get(key)
        if task is None:
            task = asyncio.ensure_future(self._compute(key, compute))
            self._pending[key] = task
            task.add_done_callback(lambda done: _settle(self._pending, key, done))
        if found is not None:
            return found[1]
        return await asyncio.shield(task)

    async def _compute(self, key: Hashable, compute: Callable[[], Awaitable[T]]) -> T:
        value = await compute()
        self._kept.put(key, (time.monotonic(), value))
        return value


def _settle(pending: dict[Hashable, Any], key: Hashable, done: asyncio.Future[Any]) -> None:
    """Forget a finished computation; its error, if nobody awaited it, is not logged as lost
    (the next request computes again and meets it)."""
    pending.pop(key, None)
    if not done.cancelled():
        done.exception()


class RenderedPages:
    """Rendered pages by key, each rendered once however many requests ask for it.

    Kept ones are sent again, and requests that arrive while one is being rendered wait for it
    instead of rendering it too.
    A page of a live run may name a `family` (the run and the page's query): while its newer
    rendering is under way, the family's last one is sent, so readers never queue behind a
    rendering that the store's other readers slow down.
    """

    def __init__(self, size: int = RENDERED_KEPT) -> None:
        self._kept: Kept[tuple[int, bytes]] = Kept(size)
        self._latest: Kept[tuple[int, bytes]] = Kept(size)
        self._pending: dict[Hashable, asyncio.Future[Response]] = {}

    async def get(
        self,
        key: Hashable,
        render: Callable[[], Awaitable[Response]],
        *,
        family: Hashable | None = None,
    ) -> Response:
        """The page of `key`, rendered by `render` unless kept; only a 200 page is kept."""
        kept = self._kept.get(key)
        if kept is None:
            task = self._pending.get(key)
            if task is None:
                task = asyncio.ensure_future(self._render(key, render, family))
                self._pending[key] = task
                task.add_done_callback(lambda done: _settle(self._pending, key, done))
            latest = self._latest.get(family) if family is not None else None
            if latest is not None:
                return HTMLResponse(latest[1], status_code=latest[0])
            page = await asyncio.shield(task)
            kept = (page.status_code, bytes(page.body))
        return HTMLResponse(kept[1], status_code=kept[0])

    async def _render(
        self, key: Hashable, render: Callable[[], Awaitable[Response]], family: Hashable | None
    ) -> Response:
        page = await render()
        if page.status_code == 200:
            self._kept.put(key, (page.status_code, bytes(page.body)))
            if family is not None:
                self._latest.put(family, (page.status_code, bytes(page.body)))
        return page
