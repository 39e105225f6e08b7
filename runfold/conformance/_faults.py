"""Checks of faults and lifecycle: cancellation mid-append, close and reopen, corrupted rows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    ALL,
    HOUR,
    MINUTE,
    T0,
    caught_up_feed,
    created,
    envelopes_for,
    feed_after,
    holder,
    hook,
    index_after,
    log,
    plain,
    raises,
    run_state,
    settle,
    started,
    write,
)
from runfold.handler import CommandHandler
from runfold.kernel import (
    CorruptEvent,
    Envelope,
    Event,
    RecordLog,
    RunCompleted,
    StepCreated,
    StoreClosed,
    WaitCreated,
)
from runfold.stores.protocol import EventStore


def _batch(run_id: str, new: bool) -> list[Event]:
    """A batch that changes every kind of index row: a hook, a wait (a wakeup), the summary."""
    body: list[Event] = [hook("h", f"tok-{run_id}"), WaitCreated(wait_id="w", resume_at=T0 + HOUR)]
    return [*started(), *body] if new else [log(), *body]


@check("faults")
async def cancelled_append_all_or_nothing(ctx: Context, store: EventStore) -> None:
    """An append whose task is cancelled at any point (before it starts, at each of its awaits,
    after it finished) leaves all of it or none of it once the store settles: events, summary,
    hook claim, wakeup and feed entries together; an append that returned is all there; the run
    then takes the next append at its head."""
    cases: list[tuple[str, bool, int]] = []
    for yields in range(10):
        for new in (True, False):
            run_id = f"{'new' if new else 'old'}-{yields}"
            if not new:
                await write(store, run_id, *started(), at=T0 - MINUTE)
            cases.append((run_id, new, yields))
    run_ids = [run_id for run_id, _, _ in cases]
    before = {run_id: await run_state(store, [run_id], T0 + MINUTE) for run_id in run_ids}
    finished: dict[str, list[Envelope]] = {}
    for run_id, new, yields in cases:
        history = await store.read(run_id)
        events = _batch(run_id, new)
        index = index_after(history, envelopes_for(run_id, len(history), events, T0))
        task = asyncio.create_task(
            store.append_if_sequence(run_id, len(history), events, index=index, recorded_at=T0)
        )
        for _ in range(yields):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            finished[run_id] = await task

    await settle(lambda: run_state(store, run_ids, T0 + MINUTE))
    for run_id, new, _ in cases:
        state = await run_state(store, [run_id], T0 + MINUTE)
        if state == before[run_id]:
            assert run_id not in finished, f"{run_id}: an acknowledged append is missing"
            continue
        events = _batch(run_id, new)
        stored = await store.read(run_id)
        head = len(stored)
        assert [e.event for e in stored[head - len(events) :]] == events, (
            f"{run_id}: a cancelled append left part of its batch"
        )
        [summary] = await store.get_runs([run_id])
        assert summary is not None and summary.last_sequence == head, (
            f"{run_id}: the events of a cancelled append are there but its summary is not"
        )
        assert await store.find_hook(f"tok-{run_id}", now=T0 + MINUTE) == holder(run_id, "h"), (
            f"{run_id}: the events of a cancelled append are there but its hook claim is not"
        )
        wakeups = await store.due_wakeups(T0 + 2 * HOUR, limit=ALL)
        assert [w.subject_id for w in wakeups if w.run_id == run_id] == ["w"], (
            f"{run_id}: the events of a cancelled append are there but its wakeup is not"
        )
    for run_id in run_ids:
        head = await store.head(run_id)
        appended = await write(store, run_id, *([log("after")] if head else started()))
        assert appended[0].sequence == head + 1


@check("reopen")
async def reopen_holds_acknowledged(ctx: Context, store: EventStore) -> None:
    """A store closed while appends are in flight and opened again (`reopen_store`) holds
    exactly what was acknowledged: every append that returned is there with the same sequences,
    positions, summaries, hook claims and wakeups; every append refused with `StoreClosed` left
    nothing; the closed store refuses calls; the reopened one takes new appends."""
    await write(store, "base", *started(), hook("h", "tok"), WaitCreated(wait_id="w", resume_at=T0))
    await write(store, "ended", *started(), hook("kept", "kept", T0 + HOUR))
    await write(store, "ended", RunCompleted(output=b""), at=T0 + MINUTE)
    base = ["base", "ended"]
    base_state = await run_state(store, base)
    base_feed = await caught_up_feed(store) if ctx.capabilities.global_feed else []

    async def append(run_id: str) -> list[Envelope]:
        return await write(store, run_id, *started(), log(run_id))

    tasks = [asyncio.create_task(append(f"w{n}")) for n in range(12)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    closing = asyncio.create_task(store.close())
    tasks += [asyncio.create_task(append(f"w{n}")) for n in range(12, 18)]
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    await closing
    acked = {f"w{n}": o for n, o in enumerate(outcomes) if isinstance(o, list)}
    refused = [o for o in outcomes if not isinstance(o, list)]
    assert all(isinstance(o, StoreClosed) for o in refused), f"refused with {refused}"
    await raises(StoreClosed, store.head("base"), "head() on the closed store")

    reopened = await ctx.reopen(store)
    assert await run_state(reopened, base) == base_state, "the reopened store lost or changed data"
    for n in range(18):
        run_id = f"w{n}"
        assert await reopened.read(run_id) == acked.get(run_id, []), f"{run_id} after reopen"
    assert sorted(await _listed(reopened)) == sorted([*base, *acked])
    if ctx.capabilities.global_feed:
        feed = await caught_up_feed(reopened)
        written = sorted((e for a in acked.values() for e in a), key=lambda e: e.position or 0)
        assert feed == base_feed + written, "the feed after reopen differs"
    assert await reopened.find_hook("tok", now=T0) == holder("base", "h")
    await write(reopened, "base", log("after reopen"), at=T0 + MINUTE)
    assert await reopened.head("base") == 5


async def _listed(store: EventStore) -> list[str]:
    return [s.run_id for s in (await store.list_runs(limit=ALL)).items]


@check("corruption")
async def corrupt_payload_fails_its_run_only(ctx: Context, store: EventStore) -> None:
    """A stored payload that no longer decodes (`corrupt_payload`) raises `CorruptEvent(run_id,
    sequence)` from every read that returns it (`read`, `read_by_correlation`, `read_all`, a
    handler's load) and never a silent skip; reads around it, the run's index rows, and every
    other run keep working."""
    for run_id in ("a", "b"):
        await write(store, run_id, *started(), StepCreated(step_id="s", step_name="n", input=b""))
        await write(store, run_id, log("two"))
    damaged = (await store.read("a"))[2]
    if ctx.capabilities.global_feed:
        await caught_up_feed(store)  # damage only what the feed already shows
    store = await ctx.corrupt(store, "a", 3)
    failing: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("read", lambda: store.read("a")),
        ("read_by_correlation", lambda: store.read_by_correlation("a", "s")),
        (
            "a handler",
            lambda: CommandHandler(store).execute("a", RecordLog(level="info", message="x")),
        ),
    ]
    if ctx.capabilities.global_feed:
        failing.append(("read_all", lambda: store.read_all()))
    for name, call in failing:
        corrupt = await raises(CorruptEvent, call(), f"{name} of a run with a corrupt event")
        assert (corrupt.run_id, corrupt.sequence) == ("a", 3), f"{name}: {corrupt!r}"
    assert [e.sequence for e in await store.read("a", after=3)] == [4]
    assert [e.sequence for e in await store.read("a", limit=2)] == [1, 2]
    assert await store.head("a") == 4
    assert [e.sequence for e in await store.read("b")] == [1, 2, 3, 4]
    assert [e.sequence for e in await store.read_by_correlation("b", "s")] == [3]
    appended = await write(store, "b", log("three"))
    assert [e.sequence for e in appended] == [5]
    summaries = await store.get_runs(["a", "b"])
    assert [s.last_sequence if s else None for s in summaries] == [4, 5]
    assert sorted(await _listed(store)) == ["a", "b"]
    if ctx.capabilities.global_feed:
        after = await feed_after(store, damaged.position or 0, 6)  # a4, b1 … b5
        assert ("b", 5) in {(e.run_id, e.sequence) for e in after}
        assert ("a", 3) not in {(e.run_id, e.sequence) for e in after}


def _calls(ctx: Context) -> list[tuple[str, Callable[[EventStore], Awaitable[Any]]]]:
    """One call of each method (the append creates run "new": it works once, while open)."""
    events = [created()]
    index = index_after([], envelopes_for("new", 0, events, T0))
    calls: list[tuple[str, Callable[[EventStore], Awaitable[Any]]]] = [
        (
            "append_if_sequence",
            lambda s: s.append_if_sequence("new", 0, events, index=index, recorded_at=T0),
        ),
        ("read", lambda s: s.read("r")),
        ("read(limit=0)", lambda s: s.read("r", limit=0)),
        ("head", lambda s: s.head("r")),
        ("read_by_correlation", lambda s: s.read_by_correlation("r", "s")),
        ("list_runs", lambda s: s.list_runs()),
        ("list_runs(limit=0)", lambda s: s.list_runs(limit=0)),
        ("get_runs", lambda s: s.get_runs(["r"])),
        ("get_runs([])", lambda s: s.get_runs([])),
        ("find_hook", lambda s: s.find_hook("tok", now=T0)),
        ("list_hooks", lambda s: s.list_hooks(now=T0)),
        ("list_hooks(limit=0)", lambda s: s.list_hooks(limit=0, now=T0)),
        ("due_wakeups", lambda s: s.due_wakeups(T0)),
        ("due_wakeups(limit=0)", lambda s: s.due_wakeups(T0, limit=0)),
        ("next_wakeup", lambda s: s.next_wakeup()),
    ]
    if ctx.capabilities.global_feed:
        calls.append(("read_all", lambda s: s.read_all()))
        calls.append(("read_all(limit=0)", lambda s: s.read_all(limit=0)))
    if ctx.capabilities.retention:
        calls.append(("delete_runs", lambda s: s.delete_runs(terminal_before=T0, limit=1)))
        calls.append(("delete_runs(limit=0)", lambda s: s.delete_runs(terminal_before=T0, limit=0)))
        calls.append(
            (
                "delete_runs(run_ids=[])",
                lambda s: s.delete_runs(terminal_before=T0, limit=1, run_ids=[]),
            )
        )
    return calls


@check("lifecycle")
async def closed_store_refuses_calls(ctx: Context, store: EventStore) -> None:
    """After `close()` every method raises `StoreClosed` (never a driver error, never an answer),
    even a call with nothing to do (`get_runs([])`, a limit of 0); closing again is harmless."""
    await write(store, "r", *started(), hook("h", "tok"))
    calls = _calls(ctx)
    for _, call in calls:
        await call(store)
    await store.close()
    for name, call in calls:
        await raises(StoreClosed, call(store), f"{name} on a closed store")
    await store.close()


@check("lifecycle")
async def store_is_an_async_context_manager(ctx: Context, store: EventStore) -> None:
    """`async with store as s` gives the store itself and closes it on exit."""
    async with store as entered:
        assert entered is store
        written = await write(entered, "r", created())
        assert plain(await entered.read("r")) == plain(written)
    await raises(StoreClosed, store.head("r"), "head() after the `async with` block")
