"""Checks of the calls that pick some runs only: the wakeups of some workflows (services that
share a store each ask for their own) and the deletion of runs named by id."""

from __future__ import annotations

from runfold.conformance._core import Context, check
from runfold.conformance.builders import FAR, MINUTE, T0, created, write
from runfold.kernel import RunCompleted, RunStarted, WaitCreated
from runfold.stores.protocol import EventStore


@check("indexes")
async def wakeups_of_served_workflows(ctx: Context, store: EventStore) -> None:
    """With `workflow_names`, `due_wakeups` and `next_wakeup` list only the wakeups of runs of
    those workflows, filtered before the limit (a page is never filled by other workflows'
    wakeups, even earlier ones); an empty collection serves none; None serves all."""
    for n in range(5):  # the other service's wakeups, all due before ours
        await write(
            store,
            f"other-{n}",
            created("billing"),
            RunStarted(),
            WaitCreated(wait_id="w", resume_at=T0 + n * MINUTE),
        )
    for n in range(2):
        await write(
            store,
            f"mine-{n}",
            created("shipping"),
            RunStarted(),
            WaitCreated(wait_id="w", resume_at=T0 + (10 + n) * MINUTE),
        )
    mine = await store.due_wakeups(FAR, limit=2, workflow_names=["shipping"])
    assert [w.run_id for w in mine] == ["mine-0", "mine-1"], mine
    both = await store.due_wakeups(FAR, limit=3, workflow_names={"shipping", "billing"})
    assert [w.run_id for w in both] == ["other-0", "other-1", "other-2"], both
    assert await store.due_wakeups(FAR, workflow_names=()) == []
    assert len(await store.due_wakeups(FAR)) == 7
    assert await store.due_wakeups(T0 + 10 * MINUTE, workflow_names=["shipping"]) == mine[:1]
    first = await store.next_wakeup(workflow_names=["shipping"])
    assert first is not None and first.run_id == "mine-0", first
    assert await store.next_wakeup(workflow_names=["nobody"]) is None
    anyone = await store.next_wakeup()
    assert anyone is not None and anyone.run_id == "other-0", anyone


@check("retention")
async def delete_runs_by_id(ctx: Context, store: EventStore) -> None:
    """`delete_runs(..., run_ids=…)` deletes only runs among those, by the same rules: an ended
    run named goes, an ended run not named stays, a live one named stays; an empty collection
    deletes nothing."""
    for run_id in ("named", "other"):
        await write(store, run_id, created("wf"), RunStarted())
        await write(store, run_id, RunCompleted(output=b""), at=T0 + MINUTE)
    await write(store, "live", created("wf"), RunStarted())
    later = T0 + 2 * MINUTE
    assert await store.delete_runs(terminal_before=later, limit=10, run_ids=()) == 0
    assert await store.delete_runs(terminal_before=later, limit=10, run_ids=["live"]) == 0
    assert await store.delete_runs(terminal_before=later, limit=10, run_ids=["named"]) == 1
    assert await store.head("named") == 0
    assert await store.head("other") == 3 and await store.head("live") == 2
    assert await store.delete_runs(terminal_before=later, limit=10) == 1  # "other"
