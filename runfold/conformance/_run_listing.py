"""Checks of finding runs: `list_runs` filters, pages and cursors, and `get_runs` by id.

Runs are listed newest first (ties by run id) with the kernel's summaries; filters combine with
AND, following cursors visits every matching run exactly once, and a cursor keeps its place when
runs arrive or change after it was issued.
"""

from __future__ import annotations

from typing import Any

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    HOUR,
    MINUTE,
    T0,
    all_run_ids,
    created,
    kernel_summary,
    walk,
    write,
)
from runfold.kernel import RunCompleted, RunFailed, RunStarted
from runfold.stores.protocol import EventStore


async def _listing_runs(store: EventStore) -> None:
    """p (parent, running, T0-1m); a1 (alpha, running, T0); a2 (alpha, completed, child of p,
    T0+1m); b1 (beta, running, child of p, T0+2m); b2 (beta, failed, T0+3m)."""
    await write(store, "p", created("parent"), RunStarted(), at=T0 - MINUTE)
    await write(store, "a1", created("alpha"), RunStarted(), at=T0)
    await write(store, "a2", created("alpha", parent_run_id="p"), at=T0 + MINUTE)
    await write(store, "b1", created("beta", parent_run_id="p"), RunStarted(), at=T0 + 2 * MINUTE)
    await write(store, "b2", created("beta"), at=T0 + 3 * MINUTE)
    await write(store, "a2", RunStarted(), RunCompleted(output=b""), at=T0 + 10 * MINUTE)
    await write(store, "b2", RunFailed(error=b""), at=T0 + 11 * MINUTE)


_FILTERS: list[tuple[dict[str, Any], list[str]]] = [
    ({}, ["b2", "b1", "a2", "a1", "p"]),
    ({"workflow_name": "alpha"}, ["a2", "a1"]),
    ({"workflow_name": "nope"}, []),
    ({"status": "running"}, ["b1", "a1", "p"]),
    ({"status": "failed"}, ["b2"]),
    ({"status": "pending"}, []),
    ({"parent_run_id": "p"}, ["b1", "a2"]),
    ({"created_before": T0 + 2 * MINUTE}, ["a2", "a1", "p"]),
    ({"created_before": T0 - MINUTE}, []),
    ({"workflow_name": "alpha", "status": "completed"}, ["a2"]),
    ({"workflow_name": "alpha", "status": "failed"}, []),
    ({"workflow_name": "beta", "parent_run_id": "p"}, ["b1"]),
    ({"status": "running", "created_before": T0 + MINUTE}, ["a1", "p"]),
    ({"parent_run_id": "p", "created_before": T0 + 2 * MINUTE}, ["a2"]),
    (
        {
            "workflow_name": "beta",
            "status": "running",
            "parent_run_id": "p",
            "created_before": T0 + 3 * MINUTE,
        },
        ["b1"],
    ),
]


@check("indexes")
async def list_runs_filters_combine(ctx: Context, store: EventStore) -> None:
    """`list_runs` filters (workflow name, status, parent, created before) each select exactly
    their runs and combine with AND, newest first, with the kernel's summaries; an empty store
    lists nothing."""
    empty = await store.list_runs()
    assert (empty.items, empty.cursor, empty.has_more) == ((), None, False)
    await _listing_runs(store)
    for filters, expected in _FILTERS:
        page = await store.list_runs(**filters)
        assert [s.run_id for s in page.items] == expected, f"list_runs({filters})"
        assert (page.cursor, page.has_more) == (None, False)
        assert list(page.items) == [await kernel_summary(store, r) for r in expected]


async def _many_runs(store: EventStore, count: int) -> list[str]:
    """`count` runs, four per `created_at` (ties broken by run id), alternating workflows,
    written out of order; returns their ids newest first."""
    order = sorted(range(count), key=lambda i: (i * 7) % count)
    for i in order:
        workflow = "even" if i % 2 == 0 else "odd"
        await write(store, f"run-{i:03d}", created(workflow), at=T0 + (i // 4) * MINUTE)
    return [f"run-{i:03d}" for i in sorted(range(count), key=lambda i: (i // 4, i), reverse=True)]


@check("indexes")
async def list_runs_pagination_visits_every_run_once(ctx: Context, store: EventStore) -> None:
    """Following `list_runs` cursors visits every matching run exactly once, newest first, even
    when many runs share a `created_at`: full pages while `has_more`, a cursor exactly when
    there is more, for page sizes 1 to larger than the listing, with and without filters; the
    default page size is 20."""
    newest_first = await _many_runs(store, 23)
    cases: list[tuple[dict[str, Any], int]] = [
        ({}, 1),
        ({}, 3),
        ({}, 4),
        ({}, 5),
        ({}, 23),
        ({}, 50),
        ({"workflow_name": "even"}, 2),
        ({"workflow_name": "odd", "created_before": T0 + 4 * MINUTE}, 3),
    ]
    for filters, limit in cases:
        matching = set(await all_run_ids(store, **filters))
        expected = [r for r in newest_first if r in matching]

        async def fetch(
            cursor: str | None, filters: dict[str, Any] = filters, limit: int = limit
        ) -> Any:
            return await store.list_runs(cursor=cursor, limit=limit, **filters)

        seen = [s.run_id for s in await walk(fetch, limit)]
        assert seen == expected, f"list_runs({filters}, limit={limit}) visited {seen}"
    default = await store.list_runs()
    assert [s.run_id for s in default.items] == newest_first[:20] and default.has_more


@check("indexes")
async def list_runs_cursor_stable_when_runs_arrive(ctx: Context, store: EventStore) -> None:
    """A cursor keeps its place when newer runs arrive and listed runs change after it was
    issued: the rest of the listing neither repeats nor skips a run."""
    newest_first = await _many_runs(store, 8)
    first = await store.list_runs(limit=3)
    await write(store, "zz-newest", created(), at=T0 + HOUR)
    await write(store, "run-000", RunStarted(), at=T0 + HOUR)  # an update does not move a run
    rest = await store.list_runs(cursor=first.cursor, limit=100)
    assert [s.run_id for s in first.items + rest.items] == newest_first
    assert [s.run_id for s in (await store.list_runs(limit=1)).items] == ["zz-newest"]


@check("indexes")
async def get_runs_order_and_unknowns(ctx: Context, store: EventStore) -> None:
    """`get_runs` answers in the order asked, repeats a repeated id, gives None for unknown ids,
    and takes an empty list."""
    await _listing_runs(store)
    a1, b2 = await kernel_summary(store, "a1"), await kernel_summary(store, "b2")
    assert await store.get_runs(["b2", "zz", "a1", "b2"]) == [b2, None, a1, b2]
    assert await store.get_runs([]) == []
    assert await store.get_runs(["x", "y"]) == [None, None]
