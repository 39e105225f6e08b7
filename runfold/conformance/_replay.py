"""Checks of the optional `replay` capability: a run's snapshot, folded as its history is read.

`CommandHandler` loads a run it has not cached with `replay` when the store offers it, so a
replay must answer exactly what `read` and `project_run` answer together.
"""

from __future__ import annotations

from typing import Any, cast

from runfold.conformance._core import Context, check
from runfold.conformance.builders import HOUR, MINUTE, T0, hook, log, raises, started, write
from runfold.kernel import (
    AttributeChange,
    AttributesSet,
    CancelRequested,
    CorruptEvent,
    HistoryError,
    HookReceived,
    Limits,
    RetryPolicy,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    StoreClosed,
    WaitCompleted,
    WaitCreated,
    project_run,
)
from runfold.stores.protocol import EventStore, ReplayedRun, Replayer


def _replayer(store: EventStore) -> Replayer:
    assert isinstance(store, Replayer), (
        f"{type(store).__name__} offers `replay` as a capability but has no such method"
    )
    return cast(Replayer, store)


async def _read_and_fold(store: EventStore, run_id: str, limits: Limits) -> ReplayedRun | None:
    """What `replay` must answer: `read`, then `project_run`."""
    history = await store.read(run_id)
    if not history:
        return None
    return ReplayedRun(
        snapshot=project_run(history, limits=limits),
        first_position=history[0].position,
        last_position=history[-1].position,
    )


async def _busy_run(store: EventStore, run_id: str) -> None:
    """A run of every kind of step, a wait, a hook with a delivery, attributes and logs,
    written in several appends at several times."""
    retry = RetryPolicy(max_attempts=3)
    await write(store, run_id, *started())
    await write(
        store,
        run_id,
        StepCreated(step_id="s1", step_name="charge", input=b"in", retry=retry),
        StepStarted(step_id="s1", attempt=1),
        at=T0 + MINUTE,
    )
    await write(
        store,
        run_id,
        StepRetrying(step_id="s1", error=b"e", retry_after=T0 + HOUR),
        at=T0 + 2 * MINUTE,
    )
    await write(
        store,
        run_id,
        StepStarted(step_id="s1", attempt=2),
        StepCompleted(step_id="s1", output=b"out"),
        StepCreated(step_id="s2", step_name="ship", input=b""),
        StepStarted(step_id="s2", attempt=1),
        StepFailed(step_id="s2", error=b"no", retryable=True),
        log("done", "s1"),
        at=T0 + HOUR,
    )
    await write(
        store,
        run_id,
        WaitCreated(wait_id="w", resume_at=T0 + 2 * HOUR),
        hook("h", f"token-{run_id}"),
        HookReceived(hook_id="h", payload=b"p", delivery_id="d"),
        AttributesSet(changes=(AttributeChange(key="k", value="v"),)),
        at=T0 + HOUR + MINUTE,
    )
    await write(store, run_id, WaitCompleted(wait_id="w"), at=T0 + 2 * HOUR)


@check("replay")
async def replay_is_the_fold_of_read(ctx: Context, store: EventStore) -> None:
    """`replay(run_id)` answers what `read` and `project_run` answer together: the run's
    snapshot and the feed positions of its first and last events (`ReplayedRun`), for runs
    written in several appends (steps retried, completed and failed, a wait, a hook and its
    delivery, attributes, a cancellation) and for a run of one event, before and after more
    appends; None for an unknown run; `limits` apply as in `project_run` (a history over them
    raises the same `HistoryError`); a closed store raises `StoreClosed`."""
    replay = _replayer(store).replay
    default = Limits()
    await _busy_run(store, "a")
    await write(store, "b", *started(), CancelRequested(reason="stop"))
    await write(store, "c", started()[0])
    for run_id in ("a", "b", "c", "unknown"):
        expected = await _read_and_fold(store, run_id, default)
        assert await replay(run_id) == expected, f"replay of run {run_id!r}"
    await write(store, "c", started()[1], log("later"), at=T0 + HOUR)
    assert await replay("c") == await _read_and_fold(store, "c", default)
    tight = Limits(max_attributes=0)
    with_limits: list[Any] = []
    for fold in (_read_and_fold(store, "a", tight), replay("a", limits=tight)):
        refused = await raises(HistoryError, fold, "a history over the limits")
        with_limits.append((refused.run_id, refused.sequence, refused.reason))
    assert with_limits[1] == with_limits[0]
    await store.close()
    await raises(StoreClosed, replay("a"), "a closed store")


@check("replay", requires=("corruption",))
async def replay_names_a_corrupt_event(ctx: Context, store: EventStore) -> None:
    """A stored payload that no longer decodes makes `replay` of its run raise
    `CorruptEvent(run_id, sequence)`, never a snapshot that skips it; other runs replay as
    before."""
    for run_id in ("a", "b"):
        await _busy_run(store, run_id)
    before = await _read_and_fold(store, "b", Limits())
    store = await ctx.corrupt(store, "a", 4)
    replay = _replayer(store).replay
    corrupt = await raises(CorruptEvent, replay("a"), "replay of a run with a corrupt event")
    assert (corrupt.run_id, corrupt.sequence) == ("a", 4), corrupt
    assert await replay("b") == before
