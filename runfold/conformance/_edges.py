"""Checks at the edges of the contract, where plausible stores go wrong by one: exact page ends,
the retention cutoff to the microsecond, clocks that step back, U+0000 in text, and times given
with an offset."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    ALL,
    FAR,
    HOUR,
    MINUTE,
    T0,
    all_run_ids,
    caught_up_feed,
    created,
    envelopes_for,
    holder,
    hook,
    index_after,
    kernel_summary,
    log,
    positions,
    raises,
    started,
    walk,
    write,
)
from runfold.kernel import (
    AttributeChange,
    AttributesSet,
    CancelRequested,
    Event,
    HookDisposed,
    ProgressRecorded,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepRetrying,
    StepStarted,
    TokenConflict,
    WaitCompleted,
    WaitCreated,
)
from runfold.stores.protocol import EventStore

MICROSECOND = timedelta(microseconds=1)

# --- pages --------------------------------------------------------------------------------------


async def _assert_pages(fetch: Any, total: int, what: str) -> None:
    """Every page size from 1 to past `total` walks the listing (`walk` checks that a page after
    `has_more` has items); a page of exactly `total` says there is no more."""
    for limit in range(1, total + 2):
        assert len(await walk(fetch(limit), limit)) == total, f"{what}, limit {limit}"
    if total:
        page = await fetch(total)(None)
        found = (len(page.items), page.cursor, page.has_more)
        assert found == (total, None, False), f"{what}: an exactly full last page gave {found}"


@check("indexes")
async def pages_end_exactly(ctx: Context, store: EventStore) -> None:
    """`has_more` is true only when the next page has items: an exactly full last page of
    `list_runs` or `list_hooks` (filtered or not) says `has_more=False` with no cursor, for
    every page size; `limit=0` returns no items, no cursor and `has_more=False` (no page can
    follow one without a cursor); a cursor whose later items went away (hooks disposed, runs
    deleted by retention when offered) gives an empty last page without `has_more`."""
    for number in range(6):
        workflow = "even" if number % 2 == 0 else "odd"
        await write(store, f"r{number}", created(workflow), RunStarted(), at=T0 + number * MINUTE)
    await write(store, "hooks", *started(), *[hook(f"h{i}", f"tok-{i}") for i in range(4)])
    listings: list[tuple[dict[str, Any], int]] = [
        ({}, 7),
        ({"workflow_name": "even"}, 3),
        ({"status": "pending"}, 0),
    ]
    for filters, total in listings:

        def runs(limit: int, filters: dict[str, Any] = filters) -> Any:
            return lambda cursor: store.list_runs(cursor=cursor, limit=limit, **filters)

        await _assert_pages(runs, total, f"list_runs({filters})")
        no_runs = await store.list_runs(limit=0, **filters)
        found: tuple[Any, ...] = (no_runs.items, no_runs.cursor, no_runs.has_more)
        assert found == ((), None, False), f"list_runs({filters}, limit=0) gave {found}"
    for run_id, total in [(None, 4), ("hooks", 4), ("r0", 0)]:

        def hooks(limit: int, run_id: str | None = run_id) -> Any:
            return lambda cursor: store.list_hooks(
                run_id=run_id, cursor=cursor, limit=limit, now=T0
            )

        await _assert_pages(hooks, total, f"list_hooks(run_id={run_id})")
        no_hooks = await store.list_hooks(run_id=run_id, limit=0, now=T0)
        found = (no_hooks.items, no_hooks.cursor, no_hooks.has_more)
        assert found == ((), None, False), f"list_hooks(run_id={run_id}, limit=0): {found}"
    first = await store.list_hooks(limit=2, now=T0)
    await write(store, "hooks", HookDisposed(hook_id="h2"), HookDisposed(hook_id="h3"))
    rest = await store.list_hooks(cursor=first.cursor, limit=2, now=T0)
    found = (rest.items, rest.cursor, rest.has_more)
    assert found == ((), None, False), f"list_hooks after a cursor at the end gave {found}"
    if ctx.capabilities.retention:
        newest = await store.list_runs(limit=5)  # r5 … r1, then r0 and hooks (both at T0)
        for run_id in ("r0", "hooks"):
            await write(store, run_id, RunCompleted(output=b""))
        assert await store.delete_runs(terminal_before=FAR, limit=10) == 2
        rest_runs = await store.list_runs(cursor=newest.cursor, limit=5)
        found = (rest_runs.items, rest_runs.cursor, rest_runs.has_more)
        assert found == ((), None, False), f"list_runs after a cursor at the end gave {found}"


# --- retention ----------------------------------------------------------------------------------


@check("retention")
async def delete_runs_at_the_cutoff(ctx: Context, store: EventStore) -> None:
    """The retention cutoff is exact to the microsecond: `delete_runs(terminal_before=t)`
    deletes a run that ended 1 µs before `t` but not one that ended at `t`, and deletes a run
    whose hook retains its token until exactly `t` (it holds nothing at `t`) but not one
    retaining it 1 µs longer, whose token stays held."""
    cutoff = T0 + HOUR
    runs: dict[str, tuple[datetime, datetime | None, bool]] = {
        "ended-just-before": (cutoff - MICROSECOND, None, True),
        "ended-at-cutoff": (cutoff, None, False),
        "retained-to-cutoff": (T0 + MINUTE, cutoff, True),
        "retained-past-cutoff": (T0 + MINUTE, cutoff + MICROSECOND, False),
    }
    for run_id, (ended, until, _) in runs.items():
        events: list[Event] = [*started()]
        if until is not None:
            events.append(hook("h", f"tok-{run_id}", until))
        await write(store, run_id, *events)
        await write(store, run_id, RunCompleted(output=b""), at=ended)
    deleted = await store.delete_runs(terminal_before=cutoff, limit=100)
    kept = sorted(run_id for run_id, (_, _, doomed) in runs.items() if not doomed)
    assert (deleted, sorted(await all_run_ids(store))) == (2, kept), (
        f"delete_runs(terminal_before={cutoff}) deleted {deleted}, kept "
        f"{sorted(await all_run_ids(store))}, not 2 and {kept}"
    )
    held = await store.find_hook("tok-retained-past-cutoff", now=cutoff)
    assert held == holder("retained-past-cutoff", "h", cutoff + MICROSECOND), held
    assert await store.find_hook("tok-retained-to-cutoff", now=cutoff) is None


# --- clocks that step back -----------------------------------------------------------------------

_STEPPING_BACK: list[tuple[datetime, list[Event]]] = [
    (T0 + 2 * HOUR, [*started(), StepCreated(step_id="s1", step_name="n", input=b"")]),
    (
        T0,
        [
            StepStarted(step_id="s1", attempt=1),
            WaitCreated(wait_id="w", resume_at=T0 + 3 * HOUR),
            log("first", step_id="s1"),
        ],
    ),
    (T0 + HOUR, [StepRetrying(step_id="s1", error=b"e")]),
    (T0 - HOUR, [StepStarted(step_id="s1", attempt=2), log("second", step_id="s1")]),
    (T0 + 30 * MINUTE, [StepCompleted(step_id="s1", output=b"o"), WaitCompleted(wait_id="w")]),
]
"""One run's appends, stamped by a clock that steps back and forth: sequences 1 … 11, the ones
correlated with s1 being 3, 4, 6, 7, 8, 9 and 10."""


@check("reads")
async def clock_stepping_back_keeps_sequence_order(ctx: Context, store: EventStore) -> None:
    """A run whose appends are stamped by a clock that steps back (a later append recorded
    earlier) reads in sequence order everywhere, never in `recorded_at` order: `read` both ways,
    `read_by_correlation` with the ranges of `read`, and the feed (positions rising with the
    sequences); every envelope keeps its own `recorded_at`, and the summary is the kernel's."""
    written = []
    for at, events in _STEPPING_BACK:
        written += await write(store, "r", *events, at=at)
    assert [e.sequence for e in written] == list(range(1, 12))
    assert await store.read("r") == written, "read is not in sequence order"
    assert await store.read("r", descending=True) == written[::-1], "descending read"
    assert await store.read("r", after=5, limit=3) == written[5:8]
    s1 = [3, 4, 6, 7, 8, 9, 10]
    for after, limit, descending, expected in [
        (0, None, False, s1),
        (0, None, True, s1[::-1]),
        (4, 3, False, [6, 7, 8]),
        (9, 2, True, [8, 7]),
    ]:
        got = await store.read_by_correlation(
            "r", "s1", after=after, limit=limit, descending=descending
        )
        assert [e.sequence for e in got] == expected, (
            f"read_by_correlation('r', 's1', after={after}, limit={limit}, "
            f"descending={descending}) gave sequences {[e.sequence for e in got]}"
        )
        assert got == [written[s - 1] for s in expected]
    if ctx.capabilities.global_feed:
        feed = [e for e in await caught_up_feed(store) if e.run_id == "r"]
        assert feed == written, "the feed is not in append order"
        positions(feed)
    assert await store.get_runs(["r"]) == [await kernel_summary(store, "r")]


# --- U+0000 -------------------------------------------------------------------------------------


@check("indexes")
async def nul_in_every_text_field(ctx: Context, store: EventStore) -> None:
    """U+0000 is an ordinary character wherever the kernel allows one: in attribute keys and
    values (at creation and by `attributes_set`), hook tokens, and free text of events (log and
    progress messages, cancellation reasons), it reads back exactly; summaries are the kernel's
    (keys differing only after a U+0000 are two keys); tokens differing only after a U+0000 are
    two tokens for `find_hook`, `list_hooks` and `TokenConflict`."""
    attributes = {"k\x00": "v\x00", "\x00": "\x00\x00", "k\x00a": "a", "k\x00b": "b"}
    events: list[Event] = [
        RunCreated(workflow_name="wf", input=b"", attributes=attributes),
        RunStarted(),
        AttributesSet(changes=(AttributeChange(key="k\x00c", value="\x00c\x00"),)),
        log("nul\x00message"),
        ProgressRecorded(progress_id="p", completed=1, message="m\x00"),
        hook("h", "tok\x00a"),
    ]
    written = await write(store, "a", *events)
    await write(store, "b", *started(), hook("h", "tok\x00b"))
    await write(store, "c", *started(), CancelRequested(reason="why\x00"))
    await write(store, "c", RunCancelled(reason="why\x00"), at=T0 + MINUTE)
    assert await store.read("a") == written, "events with U+0000 in their text changed"
    for run_id in "abc":
        expected = await kernel_summary(store, run_id)
        assert await store.get_runs([run_id]) == [expected], f"the summary of {run_id!r}"
    [summary] = await store.get_runs(["a"])
    assert summary is not None and len(summary.attributes) == 5, summary
    listed = {s.run_id: s for s in (await store.list_runs(limit=ALL)).items}
    assert listed["a"] == summary
    assert await store.find_hook("tok\x00a", now=T0) == holder("a", "h")
    assert await store.find_hook("tok\x00b", now=T0) == holder("b", "h")
    assert await store.find_hook("tok", now=T0) is None
    assert (await store.list_hooks(now=T0)).items == (holder("a", "h"), holder("b", "h"))
    claim: list[Event] = [*started(), hook("h", "tok\x00a")]
    index = index_after([], envelopes_for("d", 0, claim, T0))
    conflict = await raises(
        TokenConflict,
        store.append_if_sequence("d", 0, claim, index=index, recorded_at=T0),
        "claiming a token with U+0000 another run holds",
    )
    assert (conflict.holder_run_id, conflict.holder_hook_id) == ("a", "h")


# --- time zones ---------------------------------------------------------------------------------

_EAST = timezone(timedelta(hours=5, minutes=30))
_WEST = timezone(timedelta(hours=-8))


def _not_utc(times: Iterable[datetime | None]) -> list[datetime]:
    return [t for t in times if t is not None and t.utcoffset() != timedelta(0)]


@check("reads")
async def times_read_back_in_utc(ctx: Context, store: EventStore) -> None:
    """Times are stored as instants and read back in UTC, whatever offset they were given with:
    `recorded_at` of every read envelope, a summary's created, updated and completed times, a
    retained hook's `retained_until`, and wakeups' `due_at` all have a zero UTC offset and the
    same instant as given."""
    at = T0.astimezone(_EAST)
    await write(
        store,
        "live",
        created(deadline=(T0 + 2 * HOUR).astimezone(_WEST)),
        RunStarted(),
        WaitCreated(wait_id="w", resume_at=(T0 + HOUR).astimezone(_EAST)),
        at=at,
    )
    await write(store, "ended", *started(), hook("h", "tok", (T0 + HOUR).astimezone(_WEST)), at=at)
    await write(store, "ended", RunCompleted(output=b""), at=(T0 + MINUTE).astimezone(_WEST))
    envelopes = [*await store.read("live"), *await store.read("ended")]
    envelopes += await store.read_by_correlation("live", "w")
    if ctx.capabilities.global_feed:
        envelopes += await caught_up_feed(store)
    assert {e.recorded_at for e in envelopes} == {T0, T0 + MINUTE}
    assert not _not_utc(e.recorded_at for e in envelopes), "recorded_at read back with an offset"
    summaries = [s for s in await store.get_runs(["live", "ended"]) if s is not None]
    summaries += (await store.list_runs(limit=ALL)).items
    assert summaries[:2] == [await kernel_summary(store, r) for r in ("live", "ended")]
    times = [t for s in summaries for t in (s.created_at, s.updated_at, s.completed_at)]
    assert not _not_utc(times), f"summary times read back with an offset: {_not_utc(times)}"
    held = [await store.find_hook("tok", now=T0 + MINUTE)]
    held += (await store.list_hooks(now=T0 + MINUTE)).items
    assert held == [holder("ended", "h", T0 + HOUR)] * 2
    assert not _not_utc(h.retained_until for h in held if h is not None), "retained_until"
    wakeups = [*await store.due_wakeups(FAR), await store.next_wakeup()]
    assert [w.due_at for w in wakeups if w is not None] == [T0 + HOUR, T0 + 2 * HOUR, T0 + HOUR]
    assert not _not_utc(w.due_at for w in wakeups if w is not None), "due_at with an offset"
