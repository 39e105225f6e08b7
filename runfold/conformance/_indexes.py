"""Checks of the index rows: summaries, listings, hook tokens, wakeups, and retention.

Everything an index query answers must agree with what the kernel derives from the stored
history (`run_index(project_run(read(run)))`), whatever sequence of appends led there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from runfold.conformance import strategies
from runfold.conformance._core import Context, check
from runfold.conformance._support import (
    ALL,
    FAR,
    HOUR,
    MINUTE,
    T0,
    all_run_ids,
    caught_up_feed,
    created,
    envelopes_for,
    everything,
    holder,
    hook,
    index_after,
    kernel_summary,
    log,
    raises,
    run_state,
    started,
    wakeup,
    walk,
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
    HookDisposed,
    HookHolder,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunIndex,
    RunStarted,
    RunTimedOut,
    StepCompleted,
    StepCreated,
    StepRetrying,
    StepStarted,
    TokenConflict,
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


_ENDINGS: dict[str, list[Event]] = {
    "completed": [RunCompleted(output=b"")],
    "failed": [RunFailed(error=b"")],
    "cancelled": [RunCancelled()],
    "timed_out": [RunTimedOut(deadline=T0 + HOUR)],
}


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
    for status, ending in _ENDINGS.items():
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


# --- listing ------------------------------------------------------------------------------------


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


# --- hooks and tokens ---------------------------------------------------------------------------


@check("indexes")
async def find_hook_live_holder(ctx: Context, store: EventStore) -> None:
    """`find_hook` names the run and hook holding a live token (`retained_until` None while the
    run is live, at any `now`), None for a token nobody holds; the run's later appends keep its
    claims."""
    await write(store, "a", *started(), hook("h1", "tok-1"), hook("h2", "tok-2"))
    assert await store.find_hook("tok-1", now=T0) == holder("a", "h1")
    assert await store.find_hook("tok-2", now=T0 + timedelta(days=400)) == holder("a", "h2")
    assert await store.find_hook("tok-3", now=T0) is None
    await write(store, "a", log(), at=T0 + MINUTE)
    assert await store.find_hook("tok-1", now=T0 + MINUTE) == holder("a", "h1")


_RELEASES: dict[str, list[Event]] = {
    "disposed": [HookDisposed(hook_id="h")],
    "cancel requested": [CancelRequested()],
    **{f"run {status}": ending for status, ending in _ENDINGS.items()},
}


@check("indexes")
async def released_token_is_free(ctx: Context, store: EventStore) -> None:
    """A token is released when its hook is disposed, when cancellation is requested, and when
    its run ends without retention: `find_hook` and `list_hooks` forget it and another run can
    claim it."""
    for number, (why, release) in enumerate(_RELEASES.items()):
        token, later = f"tok-{number}", T0 + MINUTE
        await write(store, f"a{number}", *started(), hook("h", token))
        await write(store, f"a{number}", *release, at=later)
        assert await store.find_hook(token, now=later) is None, f"{why}: token still held"
        assert (await store.list_hooks(run_id=f"a{number}", now=later)).items == (), why
        await write(store, f"b{number}", *started(), hook("hb", token), at=later)
        assert await store.find_hook(token, now=later) == holder(f"b{number}", "hb"), why


@check("indexes")
async def token_conflict_across_runs(ctx: Context, store: EventStore) -> None:
    """A batch whose index claims a token another run's live (or still-retained) hook holds
    raises `TokenConflict(token, holder run, holder hook)`, with the token kept out of the
    message, and writes nothing, not even its other claims; the holder keeps the token."""
    cases: list[tuple[list[Event], datetime]] = [
        ([], T0 + MINUTE),
        ([], T0 + timedelta(days=30)),
        ([RunCompleted(output=b"")], T0 + 30 * MINUTE),
    ]
    for number, (holder_events, claim_at) in enumerate(cases):
        for claimant_exists in (False, True):
            a, b = f"a{number}{claimant_exists:d}", f"b{number}{claimant_exists:d}"
            secret = f"s3cret-{a}"
            await write(store, a, *started(), hook("ha", secret, T0 + HOUR))
            if holder_events:
                await write(store, a, *holder_events)
            if claimant_exists:
                await write(store, b, *started(), at=T0 + MINUTE)
            before = await everything(store, [a, b], ctx.capabilities, claim_at)
            history = await store.read(b)
            events: list[Event] = [log(), hook("hb1", f"free-{a}"), hook("hb2", secret)]
            if not claimant_exists:
                events = [*started(), *events]
            index = index_after(history, envelopes_for(b, len(history), events, claim_at))
            conflict = await raises(
                TokenConflict,
                store.append_if_sequence(
                    b, len(history), events, index=index, recorded_at=claim_at
                ),
                f"run {b} claiming a token run {a} holds",
            )
            found = (conflict.token, conflict.holder_run_id, conflict.holder_hook_id)
            assert found == (secret, a, "ha"), f"TokenConflict names {found[1:]}"
            assert secret not in str(conflict), "the token appears in the message"
            assert await everything(store, [a, b], ctx.capabilities, claim_at) == before
            assert await store.find_hook(f"free-{a}", now=claim_at) is None


@check("indexes")
async def retained_token_held_until_deadline(ctx: Context, store: EventStore) -> None:
    """A hook retained past its run's end holds its token (with `retained_until`) up to that
    instant, for `find_hook`, `list_hooks` and claims by other runs; one microsecond later it
    holds nothing."""
    until = T0 + HOUR
    await write(store, "a", *started(), hook("h", "tok", until))
    assert await store.find_hook("tok", now=T0) == holder("a", "h")
    await write(store, "a", RunCompleted(output=b""), at=T0 + MINUTE)
    retained = holder("a", "h", until)
    for now in (T0 + MINUTE, until - timedelta(microseconds=1)):
        assert await store.find_hook("tok", now=now) == retained, f"at {now}"
        assert (await store.list_hooks(now=now)).items == (retained,), f"at {now}"
    for now in (until, until + timedelta(microseconds=1), until + timedelta(days=1)):
        assert await store.find_hook("tok", now=now) is None, f"still held at {now}"
        assert (await store.list_hooks(now=now)).items == (), f"still listed at {now}"
    claim_at = until - timedelta(microseconds=1)
    events: list[Event] = [*started(), hook("hb", "tok")]
    index = index_after([], envelopes_for("b", 0, events, claim_at))
    await raises(
        TokenConflict,
        store.append_if_sequence("b", 0, events, index=index, recorded_at=claim_at),
        "another run claiming a token still retained",
    )


@check("indexes")
async def expired_retention_gives_way(ctx: Context, store: EventStore) -> None:
    """Once a retained hook's deadline has passed, another run claims its token and becomes the
    only holder (at any `now`); a late append to the ended run, which re-sends its expired
    claim, neither conflicts nor takes the token back."""
    until = T0 + HOUR
    await write(
        store,
        "a",
        *started(),
        StepCreated(step_id="s1", step_name="n", input=b""),
        StepStarted(step_id="s1", attempt=1),
        hook("ha", "tok", until),
    )
    await write(store, "a", RunCompleted(output=b""), at=T0 + MINUTE)
    await write(store, "b", *started(), hook("hb", "tok"), at=until + MINUTE)
    new_holder = holder("b", "hb")
    assert await store.find_hook("tok", now=until + MINUTE) == new_holder
    assert await store.find_hook("tok", now=T0 + MINUTE) == new_holder, "the old claim is back"
    late = await write(store, "a", StepCompleted(step_id="s1", output=b"late"), at=until + HOUR)
    assert [e.sequence for e in late] == [7]
    assert await store.find_hook("tok", now=until + HOUR) == new_holder
    assert (await store.list_hooks(now=until + HOUR)).items == (new_holder,)


@check("indexes")
async def list_hooks_filter_and_cursor(ctx: Context, store: EventStore) -> None:
    """`list_hooks` lists live and still-retained hooks by (run id, hook id), optionally of one
    run, and its cursor visits each exactly once; released and expired ones are left out."""
    await write(store, "r2", *started(), hook("h2", "t-2-2"), hook("h1", "t-2-1"))
    await write(store, "r1", *started(), *[hook(f"h{i}", f"t-1-{i}") for i in (3, 1, 2)])
    await write(store, "r2", hook("h3", "t-2-3"), HookDisposed(hook_id="h3"))
    await write(store, "r3", *started(), hook("h", "t-3", T0 + HOUR))
    await write(store, "r3", RunCompleted(output=b""), at=T0 + MINUTE)
    await write(store, "r4", *started(), hook("h", "t-4"))
    await write(store, "r4", RunCompleted(output=b""), at=T0 + MINUTE)
    live = [("r1", "h1"), ("r1", "h2"), ("r1", "h3"), ("r2", "h1"), ("r2", "h2")]
    holders = [holder(r, h) for r, h in live] + [holder("r3", "h", T0 + HOUR)]
    for run_id, limit in [
        (None, 100),
        (None, 1),
        (None, 4),
        (None, 6),
        ("r1", 2),
        ("r1", 3),
        ("r2", 1),
        ("r4", 5),
    ]:

        async def fetch(cursor: str | None, run_id: str | None = run_id, limit: int = limit) -> Any:
            return await store.list_hooks(
                run_id=run_id, cursor=cursor, limit=limit, now=T0 + MINUTE
            )

        expected = [h for h in holders if run_id is None or h.run_id == run_id]
        assert await walk(fetch, limit) == expected, f"list_hooks(run_id={run_id}, limit={limit})"
    assert list((await store.list_hooks(now=T0 + 2 * HOUR)).items) == holders[:-1]


# --- wakeups ------------------------------------------------------------------------------------


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


# --- retention ----------------------------------------------------------------------------------

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
