"""Checks of hook tokens, the one cross-run rule: who holds a token, until when, who may claim it.

`find_hook` and `list_hooks` name a token's live or still-retained holder; a token is released
when its hook is disposed, when cancellation is requested, or when its run ends without
retention, and is free from the instant retention ends; a claim on a held token raises
`TokenConflict` and writes nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    HOUR,
    MINUTE,
    RUN_ENDINGS,
    T0,
    envelopes_for,
    everything,
    holder,
    hook,
    index_after,
    log,
    raises,
    started,
    walk,
    write,
)
from runfold.kernel import (
    CancelRequested,
    Event,
    HookDisposed,
    RunCompleted,
    StepCompleted,
    StepCreated,
    StepStarted,
    TokenConflict,
)
from runfold.stores.protocol import EventStore


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
    **{f"run {status}": ending for status, ending in RUN_ENDINGS.items()},
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
