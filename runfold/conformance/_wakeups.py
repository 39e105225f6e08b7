"""Checks of wakeups: the waits, delayed retries and deadlines of live runs, by due time.

A runtime polls `due_wakeups(now)` for work and sleeps until `next_wakeup`; both must list
exactly the live runs' pending wakeups, oldest first, and forget finished work and ended runs.
"""

from __future__ import annotations

from datetime import timedelta

from runfold.conformance._core import Context, check
from runfold.conformance.builders import FAR, HOUR, MINUTE, T0, created, started, wakeup, write
from runfold.kernel import (
    RunCompleted,
    RunStarted,
    StepCreated,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from runfold.stores.protocol import EventStore


@check("indexes")
async def due_wakeups_oldest_first(ctx: Context, store: EventStore) -> None:
    """`due_wakeups(now)` lists the waits, delayed retries and deadlines of live runs due at or
    before `now`, oldest first (ties by run id, kind, subject id), at most `limit`;
    `next_wakeup` is the earliest (None when there is none); finished work and ended runs have
    none."""
    assert await store.due_wakeups(FAR) == [], "an empty store has due wakeups"
    assert await store.next_wakeup() is None, "an empty store has a next wakeup"
    await write(
        store,
        "w",
        *started(),
        WaitCreated(wait_id="w1", resume_at=T0 + 10 * MINUTE),
        WaitCreated(wait_id="w2", resume_at=T0 + 5 * MINUTE),
        WaitCreated(wait_id="done", resume_at=T0 + MINUTE),
        WaitCompleted(wait_id="done"),
    )
    await write(
        store,
        "r",
        *started(),
        StepCreated(step_id="s1", step_name="n", input=b""),
        StepStarted(step_id="s1", attempt=1),
        StepRetrying(step_id="s1", error=b"", retry_after=T0 + 7 * MINUTE),
        StepCreated(step_id="s2", step_name="n", input=b""),
        StepStarted(step_id="s2", attempt=1),
        StepRetrying(step_id="s2", error=b"", retry_after=T0 + 2 * MINUTE),
        StepStarted(step_id="s2", attempt=2),
    )
    await write(store, "d", created(deadline=T0 + 6 * MINUTE))
    await write(store, "t-b", *started(), WaitCreated(wait_id="w", resume_at=T0 + 6 * MINUTE))
    await write(
        store,
        "t-a",
        created(deadline=T0 + 6 * MINUTE),
        RunStarted(),
        WaitCreated(wait_id="y", resume_at=T0 + 6 * MINUTE),
        WaitCreated(wait_id="x", resume_at=T0 + 6 * MINUTE),
    )
    await write(
        store,
        "ended",
        created(deadline=T0 + MINUTE),
        RunStarted(),
        WaitCreated(wait_id="w", resume_at=T0 + MINUTE),
        RunCompleted(output=b""),
    )
    expected = [
        wakeup("w", "wait", "w2", T0 + 5 * MINUTE),
        wakeup("d", "deadline", "d", T0 + 6 * MINUTE),
        wakeup("t-a", "deadline", "t-a", T0 + 6 * MINUTE),
        wakeup("t-a", "wait", "x", T0 + 6 * MINUTE),
        wakeup("t-a", "wait", "y", T0 + 6 * MINUTE),
        wakeup("t-b", "wait", "w", T0 + 6 * MINUTE),
        wakeup("r", "retry", "s1", T0 + 7 * MINUTE),
        wakeup("w", "wait", "w1", T0 + 10 * MINUTE),
    ]
    for now, limit, count in [
        (T0, 100, 0),
        (T0 + 5 * MINUTE - timedelta(microseconds=1), 100, 0),
        (T0 + 5 * MINUTE, 100, 1),
        (T0 + 6 * MINUTE, 100, 6),
        (T0 + 9 * MINUTE, 100, 7),
        (T0 + HOUR, 100, 8),
        (T0 + HOUR, 2, 2),
        (T0 + HOUR, 4, 4),
        (T0 + HOUR, 0, 0),
    ]:
        got = await store.due_wakeups(now, limit=limit)
        assert got == expected[:count], f"due_wakeups({now}, limit={limit})"
    assert await store.next_wakeup() == expected[0], "next_wakeup is not the earliest wakeup"
    await write(store, "w", WaitCompleted(wait_id="w2"), at=T0 + MINUTE)
    assert await store.next_wakeup() == expected[1], "next_wakeup kept a completed wait"
