"""Checks of `append_if_sequence`: the head check, dense sequences, all-or-nothing batches."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    MINUTE,
    T0,
    created,
    envelopes_for,
    everything,
    hook,
    index_after,
    log,
    plain,
    positions,
    raises,
    sequences,
    started,
    write,
)
from runfold.kernel import (
    Envelope,
    Event,
    LogRecorded,
    RunCompleted,
    RunStarted,
    SequenceConflict,
    StepCreated,
    StepStarted,
    WaitCreated,
)
from runfold.stores.protocol import EventStore


async def _assert_conflict(
    ctx: Context, store: EventStore, run_id: str, expected: int, actual: int
) -> None:
    """Appending to `run_id` at `expected` raises `SequenceConflict(run_id, expected, actual)`
    and changes nothing anywhere in the store."""
    run_ids = [run_id, "bystander"]
    before = await everything(store, run_ids, ctx.capabilities)
    history = await store.read(run_id)
    # A lone event and a batch with a hook claim: stores may write the two differently.
    batches: list[list[Event]] = (
        [[log("late")], [log("late"), hook("h-new", "tok-new")]]
        if actual
        else [[created()], list(started())]
    )
    for events in batches:
        index = index_after(history, envelopes_for(run_id, actual, events, T0 + MINUTE))
        conflict = await raises(
            SequenceConflict,
            store.append_if_sequence(
                run_id, expected, events, index=index, recorded_at=T0 + MINUTE
            ),
            f"append of {len(events)} event(s) at {expected} to run {run_id!r} (head {actual})",
        )
        found = (conflict.run_id, conflict.expected, conflict.actual)
        assert found == (run_id, expected, actual), f"SequenceConflict{found}"
        assert await everything(store, run_ids, ctx.capabilities) == before, (
            "a refused append changed the store"
        )


async def _two_runs(store: EventStore) -> None:
    await write(store, "bystander", *started(), hook("h", "tok-b"))
    await write(store, "r", *started())


@check("append")
async def append_first_at_zero(ctx: Context, store: EventStore) -> None:
    """The first append to a run expects 0 and gets sequences 1…k with the events as given and
    one `recorded_at`; `read` returns exactly the envelopes `append_if_sequence` returned and
    `head` becomes k."""
    events = [*started(), StepCreated(step_id="s", step_name="n", input=b"")]
    index = index_after([], envelopes_for("r", 0, events, T0))
    appended = await store.append_if_sequence("r", 0, events, index=index, recorded_at=T0)
    assert [(e.run_id, e.sequence, e.event, e.recorded_at) for e in appended] == [
        ("r", n, event, T0) for n, event in enumerate(events, start=1)
    ]
    assert await store.read("r") == appended
    assert await store.head("r") == 3


@check("append")
async def append_at_head(ctx: Context, store: EventStore) -> None:
    """Appends at the head continue the numbering densely (1, 2, 3 …) across batches, whatever
    other runs do in between; every batch carries its own `recorded_at`; `head` is the run's last
    sequence after every append (its own or another run's); with a global feed the returned
    positions are set and rise."""
    batches: list[tuple[str, list[Event], datetime]] = [
        ("r", list(started()), T0),
        ("noise", [created(), RunStarted(), log()], T0),
        ("r", [log("a"), log("b")], T0 + MINUTE),
        ("noise", [log()], T0 + MINUTE),
        ("r", [StepCreated(step_id="s", step_name="n", input=b"")], T0 + 2 * MINUTE),
    ]
    assert await store.head("r") == 0, "head of a run with no events is not 0"
    heads = {"r": 0, "noise": 0}
    mine: list[Envelope] = []
    for run_id, events, at in batches:
        appended = await write(store, run_id, *events, at=at)
        wanted = [(run_id, heads[run_id] + n, e, at) for n, e in enumerate(events, start=1)]
        assert plain(appended) == wanted, (
            f"an append to {run_id!r} at {heads[run_id]} returned {plain(appended)}"
        )
        heads[run_id] += len(events)
        head = await store.head("r")
        assert head == heads["r"], (
            f"head('r') is {head}, not {heads['r']}, after an append to {run_id!r}"
        )
        if run_id == "r":
            mine += appended
    assert sequences(mine) == [1, 2, 3, 4, 5]
    assert await store.read("r") == mine, "read('r') differs from what the appends returned"
    if ctx.capabilities.global_feed:
        positions(mine)


@check("append")
async def append_stale_sequence_refused(ctx: Context, store: EventStore) -> None:
    """An append expecting a sequence below the head (0 on an existing run included) raises
    `SequenceConflict(run_id, expected, actual head)` and writes nothing: no event, no index row,
    no feed entry."""
    await _two_runs(store)
    for expected in (0, 1):
        await _assert_conflict(ctx, store, "r", expected, 2)


@check("append")
async def append_future_sequence_refused(ctx: Context, store: EventStore) -> None:
    """An append expecting a sequence above the head (on an existing or an unknown run) raises
    `SequenceConflict` with the actual head and writes nothing, however far above: past what a
    32- or 64-bit column holds too."""
    await _two_runs(store)
    for expected in (3, 7, 2**31 - 1, 2**31, 2**63, 2**70):
        await _assert_conflict(ctx, store, "r", expected, 2)
    for expected in (1, 5, 2**31 - 1, 2**63):
        await _assert_conflict(ctx, store, "unknown", expected, 0)


@check("append")
async def append_negative_sequence_refused(ctx: Context, store: EventStore) -> None:
    """A negative expected sequence is a `SequenceConflict` too (never "append anywhere"), on an
    existing and on an unknown run, and writes nothing."""
    await _two_runs(store)
    for expected in (-1, -(2**70)):
        await _assert_conflict(ctx, store, "r", expected, 2)
        await _assert_conflict(ctx, store, "unknown", expected, 0)


@check("append")
async def append_empty_batch_refused(ctx: Context, store: EventStore) -> None:
    """An empty batch is a `ValueError`, at the head of an existing run or at 0, and writes
    nothing."""
    await _two_runs(store)
    before = await everything(store, ["r", "new"], ctx.capabilities)
    existing = index_after(await store.read("r"), [])
    for run_id, head in (("r", 2), ("new", 0)):
        index = (
            existing if run_id == "r" else index_after([], envelopes_for("new", 0, [created()], T0))
        )
        await raises(
            ValueError,
            store.append_if_sequence(run_id, head, [], index=index, recorded_at=T0),
            f"an empty batch to run {run_id!r}",
        )
    assert await everything(store, ["r", "new"], ctx.capabilities) == before


UNENCODABLE = LogRecorded(level="info", message="\ud800")
"""An event no codec can write (a lone surrogate is not UTF-8): it makes a batch fail half-way."""


async def _assert_batch_refused(
    ctx: Context, store: EventStore, run_id: str, events: Sequence[Event]
) -> None:
    run_ids = [run_id, "bystander"]
    before = await everything(store, run_ids, ctx.capabilities)
    history = await store.read(run_id)
    head = len(history)
    index = index_after(history, envelopes_for(run_id, head, events, T0 + MINUTE))
    await raises(  # whatever the store raises, it must have written nothing
        Exception,
        store.append_if_sequence(run_id, head, events, index=index, recorded_at=T0 + MINUTE),
        "a batch with an event that cannot be encoded",
    )
    assert await everything(store, run_ids, ctx.capabilities) == before, (
        f"a batch that failed half-way left a trace in run {run_id!r}"
    )


@check("append")
async def append_batch_all_or_nothing(ctx: Context, store: EventStore) -> None:
    """A batch that fails half-way (its later event cannot be encoded) leaves nothing: no event,
    no index row (summary, hook, wakeup), no feed entry, on a new or an existing run; the run then
    takes a good append at its unchanged head."""
    await _two_runs(store)
    await _assert_batch_refused(
        ctx, store, "r", [hook("h1", "tok-1"), WaitCreated(wait_id="w", resume_at=T0), UNENCODABLE]
    )
    await _assert_batch_refused(ctx, store, "new", [*started(), hook("h1", "tok-1"), UNENCODABLE])
    appended = await write(
        store,
        "r",
        StepCreated(step_id="s", step_name="n", input=b""),
        StepStarted(step_id="s", attempt=1),
    )
    assert sequences(appended) == [3, 4]


@check("append", requires=("global_feed",))
async def append_fenced_by_head_position(ctx: Context, store: EventStore) -> None:
    """With `expected_position`, an append lands only if the event at `expected_sequence` has
    that feed position: a run deleted by retention and created again under the same id, at the
    same instant, to the same head, refuses an append decided on the old run (the kind of
    `SequenceConflict` a cache of the old run must get), and takes one fenced by its own head;
    a head of one event is fenced alike."""
    old = await write(store, "r", *started())
    if ctx.capabilities.retention:
        await write(store, "r", RunCompleted(output=b""))
        old_head = (await store.read("r"))[-1]
        assert await store.delete_runs(terminal_before=T0 + MINUTE, limit=10) == 1
        reborn = await write(store, "r", *started())
        await write(store, "r", log("new"))
        new_head = (await store.read("r"))[-1]
        assert new_head.sequence == old_head.sequence
        assert new_head.position != old_head.position, "a feed position was handed out twice"
    else:  # the run stays live: the fence is checked on its own head
        reborn, new_head = old, (await store.read("r"))[-1]
    before = await store.read("r")
    events: list[Event] = [log("late")]
    index = index_after(before, envelopes_for("r", len(before), events, T0))
    for stale in (old[-1].position, -1, 2**70):
        if stale == new_head.position:
            continue
        assert stale is not None
        conflict = await raises(
            SequenceConflict,
            store.append_if_sequence(
                "r", len(before), events, index=index, recorded_at=T0, expected_position=stale
            ),
            f"append at the head {len(before)} fenced by a stale position {stale}",
        )
        assert (conflict.expected, conflict.actual) == (len(before), len(before)), conflict
        assert await store.read("r") == before, "a fenced-off append wrote"
    appended = await store.append_if_sequence(
        "r", len(before), events, index=index, recorded_at=T0, expected_position=new_head.position
    )
    assert [e.sequence for e in appended] == [len(before) + 1]
    assert reborn[0].run_id == "r"
    # A head of one event is fenced too: the first event's position is checked like any other.
    (single,) = await write(store, "single", created())
    assert single.position is not None
    events = [RunStarted()]
    index = index_after([single], envelopes_for("single", 1, events, T0))
    for stale in (single.position + 1, -1):
        await raises(
            SequenceConflict,
            store.append_if_sequence(
                "single", 1, events, index=index, recorded_at=T0, expected_position=stale
            ),
            f"append at the head 1 fenced by a stale position {stale}",
        )
    assert await store.read("single") == [single], "a fenced-off append wrote"
    # A run that must not exist ignores the fence.
    fresh = await store.append_if_sequence(
        "fresh",
        0,
        [created()],
        index=index_after([], envelopes_for("fresh", 0, [created()], T0)),
        recorded_at=T0,
        expected_position=12345,
    )
    assert [e.sequence for e in fresh] == [1]
