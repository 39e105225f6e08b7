"""Checks of retention: `delete_runs` removes ended runs with all their rows, and nothing else.

Only terminal runs that ended before the cutoff and hold no token retained past it go, with their
events and index rows, a bounded number per call; a deleted run's id and tokens can be used again.
"""

from __future__ import annotations

from datetime import datetime

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    HOUR,
    MINUTE,
    T0,
    all_run_ids,
    caught_up_feed,
    created,
    holder,
    hook,
    kernel_summary,
    run_state,
    started,
    write,
)
from runfold.kernel import (
    CancelRequested,
    Event,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    RunTimedOut,
    StepCreated,
)
from runfold.stores.protocol import EventStore

CUTOFF = T0 + HOUR
"""The `terminal_before` of the retention checks."""


async def _retention_runs(store: EventStore) -> dict[str, bool]:
    """Runs and whether `delete_runs(terminal_before=CUTOFF)` may delete them."""
    ended: list[tuple[str, list[Event], datetime]] = [
        ("done", [RunCompleted(output=b"")], T0 + MINUTE),
        ("failed", [RunFailed(error=b"")], T0 + 2 * MINUTE),
        ("cancelled", [CancelRequested(), RunCancelled()], T0 + 3 * MINUTE),
        ("timed-out", [RunTimedOut(deadline=T0)], T0 + 4 * MINUTE),
        ("recent", [RunCompleted(output=b"")], CUTOFF + MINUTE),
        ("at-cutoff", [RunCompleted(output=b"")], CUTOFF),
    ]
    for run_id, ending, at in ended:
        await write(store, run_id, *started(), StepCreated(step_id="s", step_name="n", input=b""))
        await write(store, run_id, *ending, at=at)
    await write(store, "live", created(deadline=T0 + HOUR), RunStarted())
    await write(store, "cancelling", *started(), CancelRequested())
    for run_id, until in [("retained", CUTOFF + HOUR), ("retention-over", CUTOFF - MINUTE)]:
        await write(store, run_id, *started(), hook("h", f"tok-{run_id}", until))
        await write(store, run_id, RunCompleted(output=b""), at=T0 + MINUTE)
    return {
        "done": True,
        "failed": True,
        "cancelled": True,
        "timed-out": True,
        "recent": False,
        "at-cutoff": False,
        "live": False,
        "cancelling": False,
        "retained": False,
        "retention-over": True,
    }


@check("retention")
async def delete_runs_before_cutoff(ctx: Context, store: EventStore) -> None:
    """`delete_runs(terminal_before=t)` removes exactly the terminal runs that ended before `t`
    and hold no token retained past `t`: their events (`read`, `head`, correlation reads, the
    feed) and index rows (summary, hooks, wakeups) go; live, cancelling, recent and retaining
    runs are untouched; it returns how many it deleted, and a second call deletes nothing."""
    deletable = await _retention_runs(store)
    doomed = sorted(r for r, d in deletable.items() if d)
    kept = sorted(r for r, d in deletable.items() if not d)
    kept_state = await run_state(store, kept)
    kept_feed = (
        [e for e in await caught_up_feed(store) if e.run_id in kept]
        if ctx.capabilities.global_feed
        else None
    )
    assert await store.delete_runs(terminal_before=CUTOFF, limit=100) == len(doomed)
    for run_id in doomed:
        assert await store.read(run_id) == [], f"{run_id} still has events"
        assert await store.head(run_id) == 0
        for correlation in ("s", "h"):
            assert await store.read_by_correlation(run_id, correlation) == [], (
                f"{run_id} still has events correlated with {correlation!r}"
            )
    assert await store.get_runs(doomed) == [None] * len(doomed)
    assert sorted(await all_run_ids(store)) == kept
    if ctx.capabilities.global_feed:
        assert await caught_up_feed(store) == kept_feed
    assert await store.find_hook("tok-retention-over", now=T0) is None
    assert await store.find_hook("tok-retained", now=CUTOFF) is not None
    assert await run_state(store, kept) == kept_state
    assert await store.delete_runs(terminal_before=CUTOFF, limit=100) == 0


@check("retention")
async def delete_runs_honours_limit(ctx: Context, store: EventStore) -> None:
    """`delete_runs` deletes at most `limit` runs a call (0 deletes none), so retention can run
    in small batches until it returns 0."""
    deletable = await _retention_runs(store)
    total = sum(deletable.values())
    assert await store.delete_runs(terminal_before=CUTOFF, limit=0) == 0
    counts = [await store.delete_runs(terminal_before=CUTOFF, limit=2) for _ in range(4)]
    assert counts == [2, 2, total - 4, 0]
    assert sorted(await all_run_ids(store)) == sorted(r for r, d in deletable.items() if not d)


@check("retention")
async def deleted_run_id_and_token_reusable(ctx: Context, store: EventStore) -> None:
    """After retention deleted a run, its id starts again from sequence 1 with fresh index rows
    and its hook token can be claimed by another run."""
    await write(store, "r", *started(), hook("h", "tok", T0 + MINUTE))
    await write(store, "r", RunCompleted(output=b""))
    assert await store.delete_runs(terminal_before=CUTOFF, limit=10) == 1
    again = await write(store, "r", created("second"), at=CUTOFF)
    await write(store, "other", *started(), hook("h", "tok"), at=CUTOFF)
    assert [e.sequence for e in again] == [1]
    assert [e.event for e in await store.read("r")] == [created("second")]
    assert await store.get_runs(["r"]) == [await kernel_summary(store, "r")]
    assert await store.find_hook("tok", now=CUTOFF) == holder("other", "h")
