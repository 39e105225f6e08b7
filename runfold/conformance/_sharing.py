"""Checks of two store objects over one database, and of the optional `rewrite_index` repair.

Two processes running `CommandHandler` over one database each open a store object of their own:
the fence and the token rule must hold across them, not just inside one object's locks.
"""

from __future__ import annotations

import asyncio
from typing import cast

import attrs

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    FAR,
    HOUR,
    MINUTE,
    T0,
    caught_up_feed,
    envelopes_for,
    everything,
    holder,
    hook,
    index_after,
    log,
    raises,
    started,
    wakeup,
    write,
)
from runfold.kernel import (
    HookClaim,
    RunIndex,
    SequenceConflict,
    StoreClosed,
    TokenConflict,
    WaitCreated,
)
from runfold.stores.protocol import EventStore, IndexRewriter

# --- two store objects over one database --------------------------------------------------------


async def _same_answers(one: EventStore, two: EventStore, run_id: str) -> None:
    assert await two.read(run_id) == await one.read(run_id), f"read({run_id!r}) differs"
    assert await two.head(run_id) == await one.head(run_id), f"head({run_id!r}) differs"
    assert await two.get_runs([run_id]) == await one.get_runs([run_id]), "get_runs differs"
    assert await two.list_hooks(now=T0) == await one.list_hooks(now=T0), "list_hooks differs"
    assert await two.due_wakeups(FAR) == await one.due_wakeups(FAR), "due_wakeups differs"


@check("sharing")
async def two_stores_see_each_other(ctx: Context, store: EventStore) -> None:
    """Two store objects over one database (`share_store`) see each other's appends at once:
    events, heads, summaries, hooks, wakeups and (when offered) the feed; an append through one
    at a head the other has moved raises `SequenceConflict` with the real head, and a token held
    through one is refused through the other with `TokenConflict`, writing nothing."""
    other = await ctx.share(store)
    await write(store, "a", *started(), hook("h", "tok-a"), WaitCreated(wait_id="w", resume_at=T0))
    await _same_answers(store, other, "a")
    assert await other.find_hook("tok-a", now=T0) == holder("a", "h")
    assert await other.due_wakeups(FAR) == [wakeup("a", "wait", "w", T0)]
    await write(other, "a", log("through the other"), at=T0 + MINUTE)
    await _same_answers(store, other, "a")
    assert await store.head("a") == 5
    stale = [log("stale")]
    index = index_after(await store.read("a", limit=4), envelopes_for("a", 4, stale, T0))
    conflict = await raises(
        SequenceConflict,
        store.append_if_sequence("a", 4, stale, index=index, recorded_at=T0 + MINUTE),
        "an append at a head the other store object moved",
    )
    assert (conflict.expected, conflict.actual) == (4, 5), conflict
    before = await everything(store, ["a", "b"], ctx.capabilities)
    claim = [*started(), hook("hb", "tok-a")]
    index = index_after([], envelopes_for("b", 0, claim, T0 + MINUTE))
    refused = await raises(
        TokenConflict,
        other.append_if_sequence("b", 0, claim, index=index, recorded_at=T0 + MINUTE),
        "claiming through one store object a token held through the other",
    )
    assert (refused.holder_run_id, refused.holder_hook_id) == ("a", "h")
    assert await everything(store, ["a", "b"], ctx.capabilities) == before
    assert await everything(other, ["a", "b"], ctx.capabilities) == before
    if ctx.capabilities.global_feed:
        assert await caught_up_feed(other) == await caught_up_feed(store)


@check("sharing", requires=("concurrency",))
async def racing_across_two_stores(ctx: Context, store: EventStore) -> None:
    """Writers racing through two store objects over one database: of 8 appends at one expected
    sequence, split between the two, exactly one wins and the others get `SequenceConflict`;
    of 8 runs claiming one token, exactly one holds it and the others get `TokenConflict`."""
    stores = [store, await ctx.share(store)]
    history = await write(store, "r", *started())

    async def extend(number: int) -> object:
        events = [log(f"writer {number}")]
        index = index_after(history, envelopes_for("r", 2, events, T0))
        return await stores[number % 2].append_if_sequence(
            "r", 2, events, index=index, recorded_at=T0
        )

    outcomes = await asyncio.gather(*(extend(n) for n in range(8)), return_exceptions=True)
    winners = [o for o in outcomes if isinstance(o, list)]
    assert len(winners) == 1, f"{len(winners)} of 8 racing appends won across two stores"
    assert all(isinstance(o, list | SequenceConflict) for o in outcomes), outcomes
    assert await store.read("r") == (await stores[1].read("r")) and await store.head("r") == 3

    async def claim(number: int) -> object:
        events = [*started(), hook("h", "shared")]
        run_id = f"c{number}"
        index = index_after([], envelopes_for(run_id, 0, events, T0))
        return await stores[number % 2].append_if_sequence(
            run_id, 0, events, index=index, recorded_at=T0
        )

    outcomes = await asyncio.gather(*(claim(n) for n in range(8)), return_exceptions=True)
    won = [f"c{n}" for n, o in enumerate(outcomes) if isinstance(o, list)]
    assert len(won) == 1, f"{len(won)} runs claimed one token through two stores"
    assert all(isinstance(o, list | TokenConflict) for o in outcomes), outcomes
    for one in stores:
        assert await one.find_hook("shared", now=T0) == holder(won[0], "h")


# --- rewrite_index ------------------------------------------------------------------------------


def _rewriter(store: EventStore) -> IndexRewriter:
    assert isinstance(store, IndexRewriter), (
        f"{type(store).__name__} offers `rewrite_index` as a capability but has no such method"
    )
    return cast(IndexRewriter, store)


@check("rewrite_index")
async def rewrite_index_replaces_rows(ctx: Context, store: EventStore) -> None:
    """`rewrite_index(run_id, index, now=…)` makes the run's index rows exactly `index`,
    appending nothing: summary, hook claims and wakeups it names appear and the old ones go
    (as `runfold verify --rebuild-index` needs), and rewriting the kernel's rows puts
    everything back as it was; events and the feed never change."""
    rewrite = _rewriter(store).rewrite_index
    await write(store, "a", *started(), hook("h", "tok-a"), WaitCreated(wait_id="w", resume_at=T0))
    await write(store, "b", *started())
    before = await everything(store, ["a", "b"], ctx.capabilities)
    true = index_after(await store.read("a"), [])
    summary = attrs.evolve(true.summary, status="pending", attributes={"repaired": "no"})
    drifted = RunIndex(
        summary=summary,
        hooks=(HookClaim(token="tok-z", hook_id="hz", retained_until=None),),
        wakeups=(wakeup("a", "retry", "s", T0 + HOUR),),
    )
    await rewrite("a", drifted, now=T0)
    assert await store.get_runs(["a"]) == [summary]
    assert await store.find_hook("tok-z", now=T0) == holder("a", "hz")
    assert await store.find_hook("tok-a", now=T0) is None, "an old claim outlived the rewrite"
    assert await store.due_wakeups(FAR) == [wakeup("a", "retry", "s", T0 + HOUR)]
    assert await store.read("a") == before[0][0][0], "rewrite_index changed the events"
    await rewrite("a", true, now=T0)
    assert await everything(store, ["a", "b"], ctx.capabilities) == before


@check("rewrite_index")
async def rewrite_index_is_fenced(ctx: Context, store: EventStore) -> None:
    """`rewrite_index` is fenced like an append and writes nothing when it refuses: rows for
    another head (None on a run with events included) raise `SequenceConflict` with the real
    head; a token another run holds raises `TokenConflict` naming the holder; rows of another
    run raise `ValueError`; None for an unknown run changes nothing; a closed store raises
    `StoreClosed`."""
    rewrite = _rewriter(store).rewrite_index
    await write(store, "a", *started(), hook("h", "tok-a"))
    await write(store, "b", *started())
    before = await everything(store, ["a", "b", "unknown"], ctx.capabilities)
    history = await store.read("a")
    stale = index_after(history[:2], [])
    conflict = await raises(
        SequenceConflict, rewrite("a", stale, now=T0), "rows for head 2 of a run at head 3"
    )
    assert (conflict.run_id, conflict.expected, conflict.actual) == ("a", 2, 3), conflict
    conflict = await raises(
        SequenceConflict, rewrite("a", None, now=T0), "removing the rows of a run with events"
    )
    assert (conflict.expected, conflict.actual) == (0, 3), conflict
    b_rows = index_after(await store.read("b"), [])
    claiming = attrs.evolve(
        b_rows, hooks=(HookClaim(token="tok-a", hook_id="hb", retained_until=None),)
    )
    refused = await raises(
        TokenConflict, rewrite("b", claiming, now=T0), "rows claiming another run's token"
    )
    assert (refused.holder_run_id, refused.holder_hook_id) == ("a", "h"), refused
    await raises(ValueError, rewrite("a", b_rows, now=T0), "run b's rows rewritten as run a's")
    await rewrite("unknown", None, now=T0)
    assert await everything(store, ["a", "b", "unknown"], ctx.capabilities) == before
    await store.close()
    await raises(StoreClosed, rewrite("a", index_after(history, []), now=T0), "a closed store")
