"""What the commands that change runs do: `cancel`, `resume` and `delete`, on the public API of
the engine and the stores, so that a host program can do the same in a few lines.

Their options and output are `runfold.cli.operate_commands`; the runtime `resume` drives is
loaded by `runfold.cli.runtimes`."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import cast

from runfold.engine import Engine, EngineObserver, Resumption, WorkflowRuntime
from runfold.handler import CommandHandler
from runfold.kernel import CancelRun, RunStatus, Snapshot
from runfold.stores.protocol import EventStore

__all__ = [
    "cancel",
    "delete_ended",
    "resume",
]

_DELETE_BATCH = 500
"""Runs deleted per `delete_runs` call: each is one transaction, kept short."""


_LIVE: tuple[RunStatus, ...] = ("pending", "running", "cancelling")
_RESUME_ROUNDS = 100
"""`resume_due` calls at most per `resume --due`: each handles up to 100 due wakeups."""


async def cancel(store: EventStore, run_id: str, reason: str | None) -> Snapshot:
    """End a live run as cancelled now (`CancelRun`): no runtime is needed, nothing runs.

    Raises:
        RunNotFound: The run has no history.
        TerminalState: The run already ended otherwise.
    """
    outcome = await CommandHandler(store).execute(run_id, CancelRun(reason=reason))
    return outcome.snapshot


async def resume(
    store: EventStore, runtime: WorkflowRuntime, run_id: str | None
) -> tuple[Resumption, ...]:
    """Drive `run_id` to its next suspension, or (None) every interrupted or due run.

    A run interrupted mid-step gets a new attempt of that step (`Engine.drive`); with no
    `run_id`, `Engine.recover` drives every live run of the runtime's workflows once, then
    `Engine.resume_due` the ones whose timers are due.
    """
    # A runtime that observes (a Flow confirms its live coroutines) sees what is appended.
    observes = callable(getattr(runtime, "on_event", None))
    observers = (cast(EngineObserver, runtime),) if observes else ()
    engine = Engine(CommandHandler(store), runtime, observers=observers)
    if run_id is None:
        before = await _live_heads(store, engine.workflow_names)
        resumed: list[Resumption] = [
            one
            for one in await engine.recover()
            if one.snapshot is None or one.snapshot.last_sequence != before.get(one.run_id)
        ]  # a run that only waits, as it did, is not news
        for _ in range(_RESUME_ROUNDS):
            batch = await engine.resume_due()
            resumed.extend(batch)
            if not batch or all(one.error is not None for one in batch):
                break  # nothing left, or the same failing runs would come back
        return tuple(resumed)
    snapshot = await engine.drive(run_id)
    return (Resumption(run_id=run_id, wakeups=(), snapshot=snapshot, error=None),)


async def _live_heads(store: EventStore, workflow_names: Collection[str]) -> dict[str, int]:
    """The last sequence of every live run of `workflow_names`, as the run index lists it."""
    heads: dict[str, int] = {}
    for workflow_name in workflow_names:
        for status in _LIVE:
            cursor: str | None = None
            while True:
                page = await store.list_runs(
                    workflow_name=workflow_name, status=status, cursor=cursor, limit=500
                )
                heads.update((s.run_id, s.last_sequence) for s in page.items)
                if not page.has_more or page.cursor is None:
                    break
                cursor = page.cursor
    return heads


async def delete_run(store: EventStore, run_id: str) -> bool:
    """Delete `run_id` if it ended (by now) and retains no hook token; whether it was deleted."""
    now = datetime.now(UTC)
    return await store.delete_runs(terminal_before=now, limit=1, run_ids=(run_id,)) == 1


async def delete_ended(store: EventStore, before: datetime, limit: int | None) -> int:
    """Delete up to `limit` (None: all) runs that ended before `before`; how many went."""
    deleted = 0
    while limit is None or deleted < limit:
        batch = _DELETE_BATCH if limit is None else min(_DELETE_BATCH, limit - deleted)
        gone = await store.delete_runs(terminal_before=before, limit=batch)
        deleted += gone
        if gone < batch:
            break
    return deleted
