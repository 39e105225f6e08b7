"""Checks that a store's index rows are the kernel's after every append, whatever led there.

Everything an index query answers (summaries, listings, token holders, wakeups) must agree with
what the kernel derives from the stored history (`run_index(project_run(read(run)))`). These
checks follow one run through its life and to each of its ends, and replay random interleavings
of valid histories of three runs against every query at once. Each query family has its own
checks besides: `_run_listing`, `_hook_tokens`, `_wakeups`, and `_retention` for deleting runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import attrs
from hypothesis import given
from hypothesis import strategies as st

from runfold.conformance import strategies
from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    ALL,
    FAR,
    HOUR,
    MINUTE,
    RUN_ENDINGS,
    T0,
    all_run_ids,
    created,
    holder,
    hook,
    index_after,
    kernel_summary,
    started,
    wakeup,
    write,
)
from runfold.kernel import (
    AttributeChange,
    AttributesSet,
    CancelRequested,
    Envelope,
    Event,
    HookConflict,
    HookCreated,
    HookHolder,
    RunCancelled,
    RunIndex,
    RunStarted,
    StepCreated,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
    Wakeup,
    project_run,
    run_index,
)
from runfold.stores.protocol import EventStore

# --- what the kernel says the indexes hold ------------------------------------------------------


def _live(retained_until: datetime | None, now: datetime) -> bool:
    return retained_until is None or retained_until > now


def expected_holders(indexes: Mapping[str, RunIndex], now: datetime) -> dict[str, HookHolder]:
    """Token → live holder at `now`, from the runs' index rows."""
    return {
        claim.token: holder(run_id, claim.hook_id, claim.retained_until)
        for run_id, index in indexes.items()
        for claim in index.hooks
        if _live(claim.retained_until, now)
    }


def expected_wakeups(indexes: Mapping[str, RunIndex]) -> list[Wakeup]:
    """Every wakeup of the runs, in the order `due_wakeups` returns them."""
    found = [w for index in indexes.values() for w in index.wakeups]
    return sorted(found, key=lambda w: (w.due_at, w.run_id, w.kind, w.subject_id))


async def assert_indexes_agree(
    store: EventStore, indexes: Mapping[str, RunIndex], now: datetime, tokens: Sequence[str]
) -> None:
    """Every index query of `store` answers as the kernel's `indexes` (all the runs there are)
    say it must at `now` (no earlier than any append): summaries, listing order, token holders,
    live hooks, due and next wakeups."""
    run_ids = sorted(indexes)
    summaries = [indexes[r].summary for r in run_ids]
    assert await store.get_runs([*run_ids, "no-such-run"]) == [*summaries, None], "get_runs"
    newest_first = sorted(summaries, key=lambda s: (s.created_at, s.run_id), reverse=True)
    assert list((await store.list_runs(limit=ALL)).items) == newest_first, "list_runs"
    holders = expected_holders(indexes, now)
    for token in tokens:
        found = await store.find_hook(token, now=now)
        assert found == holders.get(token), f"find_hook at {now}: {found} != {holders.get(token)}"
    live = sorted(holders.values(), key=lambda h: (h.run_id, h.hook_id))
    assert list((await store.list_hooks(now=now, limit=ALL)).items) == live, "list_hooks"
    wakeups = expected_wakeups(indexes)
    assert await store.due_wakeups(now, limit=ALL) == [w for w in wakeups if w.due_at <= now], (
        f"due_wakeups({now})"
    )
    assert await store.next_wakeup() == (wakeups[0] if wakeups else None), "next_wakeup"


# --- summaries ----------------------------------------------------------------------------------


@check("indexes")
async def summary_agrees_with_kernel(ctx: Context, store: EventStore) -> None:
    """After every append of a run's life (created, started, attributes, cancel requested,
    cancelled) `get_runs` returns exactly the summary the kernel derives from the stored history:
    status, workflow, parent, created/updated/completed times, last sequence, attributes."""
    steps: list[tuple[datetime, list[Event]]] = [
        (T0, [created("wf", parent_run_id="p", deadline=T0 + HOUR)]),
        (T0 + MINUTE, [RunStarted()]),
        (T0 + 2 * MINUTE, [AttributesSet(changes=(AttributeChange(key="k", value="v"),))]),
        (T0 + 3 * MINUTE, [CancelRequested(reason="r")]),
        (T0 + 4 * MINUTE, [RunCancelled(reason="r")]),
    ]
    statuses = []
    for at, events in steps:
        await write(store, "r", *events, at=at)
        [summary] = await store.get_runs(["r"])
        assert summary == await kernel_summary(store, "r")
        assert summary is not None
        statuses.append(summary.status)
    assert statuses == ["pending", "running", "running", "cancelling", "cancelled"]
    [final] = await store.get_runs(["r"])
    assert final is not None
    times = (final.created_at, final.updated_at, final.completed_at)
    assert times == (T0, T0 + 4 * MINUTE, T0 + 4 * MINUTE), f"created/updated/completed: {times}"
    rest = (final.workflow_name, final.parent_run_id, final.last_sequence, dict(final.attributes))
    assert rest == ("wf", "p", 5, {"k": "v"}), f"workflow/parent/last sequence/attributes: {rest}"


@check("indexes")
async def index_follows_run_end(ctx: Context, store: EventStore) -> None:
    """When a run ends (each terminal status), its index rows change in the same append: the
    summary shows the status and `completed_at`, `list_runs(status=…)` finds it, its hooks
    release their tokens (but a retaining hook keeps its own), and its waits, retries and
    deadline stop being wakeups: `due_wakeups` and `next_wakeup` then answer with the live runs'
    wakeups only, and with nothing once none is left."""
    assert await store.next_wakeup() is None, "an empty store has a next wakeup"
    live = wakeup("live", "wait", "w", T0 + 3 * HOUR)
    await write(store, "live", *started(), WaitCreated(wait_id="w", resume_at=live.due_at))
    for status, ending in RUN_ENDINGS.items():
        run_id = f"r-{status}"
        await write(
            store,
            run_id,
            created(deadline=T0 + HOUR),
            RunStarted(),
            hook("h", f"tok-{status}"),
            hook("kept", f"kept-{status}", T0 + 2 * HOUR),
            WaitCreated(wait_id="w", resume_at=T0 + MINUTE),
            StepCreated(step_id="s", step_name="n", input=b""),
            StepStarted(step_id="s", attempt=1),
            StepRetrying(step_id="s", error=b"", retry_after=T0 + MINUTE),
        )
        assert len([w for w in await store.due_wakeups(FAR, limit=ALL) if w.run_id == run_id]) == 3
        await write(store, run_id, *ending, at=T0 + 2 * MINUTE)
        [summary] = await store.get_runs([run_id])
        assert summary is not None and summary == await kernel_summary(store, run_id)
        assert (summary.status, summary.completed_at) == (status, T0 + 2 * MINUTE)
        assert run_id in await all_run_ids(store, status=status)
        now = T0 + 2 * MINUTE
        assert await store.find_hook(f"tok-{status}", now=now) is None, "token not released"
        assert await store.find_hook(f"kept-{status}", now=now) == holder(
            run_id, "kept", T0 + 2 * HOUR
        )
        assert await store.due_wakeups(FAR, limit=ALL) == [live], f"wakeups after run {status}"
        assert await store.next_wakeup() == live, f"next wakeup after run {status}"
    await write(store, "live", WaitCompleted(wait_id="w"), at=T0 + 2 * MINUTE)
    assert await store.due_wakeups(FAR, limit=ALL) == [], "wakeups with no live wait left"
    assert await store.next_wakeup() is None, "a next wakeup with no live wait left"


def _distinct_tokens(history: list[Envelope]) -> list[Envelope]:
    """The history with its hook tokens prefixed by its run id, so runs never contend for one."""
    renamed = []
    for envelope in history:
        event = envelope.event
        if isinstance(event, HookCreated | HookConflict):
            event = attrs.evolve(event, token=f"{envelope.run_id}/{event.token}")
        renamed.append(attrs.evolve(envelope, event=event))
    return renamed


def _pieces(history: list[Envelope], cuts: list[bool]) -> list[list[Envelope]]:
    """Split a history into appends: never across two `recorded_at`s, and wherever `cuts` says
    (one flag per boundary between two events)."""
    pieces = [[history[0]]]
    for envelope, cut in zip(history[1:], cuts, strict=False):
        if cut or envelope.recorded_at != pieces[-1][-1].recorded_at:
            pieces.append([envelope])
        else:
            pieces[-1].append(envelope)
    return pieces


_RUNS = ("run-a", "run-b", "run-c")


@check("indexes", sync=True)
def index_agrees_with_kernel(ctx: Context) -> None:
    """Property: for any interleaving of appends from valid histories of three runs
    (`strategies.valid_histories()`, cut into batches at random), after every append each index
    query (`get_runs`, `list_runs`, `find_hook`, `list_hooks`, `due_wakeups`, `next_wakeup`)
    answers exactly what `run_index(project_run(history))` of every run implies, now and after
    every retention deadline has passed."""

    async def replay(plan: list[list[Envelope]]) -> None:
        store = await ctx.new_store()
        try:
            histories: dict[str, list[Envelope]] = {}
            indexes: dict[str, RunIndex] = {}
            tokens = sorted(
                {e.event.token for piece in plan for e in piece if isinstance(e.event, HookCreated)}
            )
            latest = T0
            for piece in plan:
                run_id, at = piece[0].run_id, piece[0].recorded_at
                history = histories.setdefault(run_id, [])
                events = [e.event for e in piece]
                index = index_after(history, piece)
                await store.append_if_sequence(
                    run_id, len(history), events, index=index, recorded_at=at
                )
                history.extend(piece)
                indexes[run_id] = index
                latest = max(latest, at)
                await assert_indexes_agree(store, indexes, latest, tokens)
            assert indexes == {r: run_index(project_run(h)) for r, h in histories.items()}
            await assert_indexes_agree(store, indexes, latest + timedelta(days=31), tokens)
        finally:
            await ctx.close(store)

    histories = st.tuples(*(strategies.valid_histories(r, max_commands=15) for r in _RUNS))

    @ctx.effort.seeded
    @ctx.effort.settings()
    @given(histories, st.data())
    def property(drawn: tuple[list[Envelope], ...], data: st.DataObject) -> None:
        queues = []
        for history in drawn:
            cuts = data.draw(
                st.lists(st.booleans(), min_size=len(history) - 1, max_size=len(history))
            )
            queues.append(_pieces(_distinct_tokens(history), cuts))
        plan: list[list[Envelope]] = []
        while any(queues):
            pick = data.draw(st.integers(0, len(queues) - 1))
            queue = queues[pick] if queues[pick] else next(q for q in queues if q)
            plan.append(queue.pop(0))
        ctx.run(replay(plan))

    property()
