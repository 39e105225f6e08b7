"""Checks under concurrency: racing writers and token claims, tailing and consistent readers.

Writers yield to the loop between appends (`asyncio.sleep(0)`), so even a store that never awaits
anything real is exercised with readers running between its writes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    ALL,
    MINUTE,
    T0,
    caught_up_feed,
    envelopes_for,
    hook,
    index_after,
    kernel_summary,
    log,
    plain,
    positions,
    sequences,
    started,
    write,
)
from runfold.kernel import Envelope, Event, SequenceConflict, TokenConflict
from runfold.stores.protocol import EventStore

WRITERS = 8
"""How many tasks race in the concurrency checks."""


async def _race(
    store: EventStore, run_id: str, expected: int, batches: list[list[Event]]
) -> list[list[Envelope] | BaseException]:
    """Every batch appended at `expected` at once, each with the index its own success implies."""
    history = await store.read(run_id)

    async def attempt(events: list[Event]) -> list[Envelope]:
        index = index_after(history, envelopes_for(run_id, expected, events, T0 + MINUTE))
        return await store.append_if_sequence(
            run_id, expected, events, index=index, recorded_at=T0 + MINUTE
        )

    return await asyncio.gather(*(attempt(b) for b in batches), return_exceptions=True)


def _one_winner(outcomes: list[list[Envelope] | BaseException]) -> list[Envelope]:
    winners = [o for o in outcomes if isinstance(o, list)]
    assert len(winners) == 1, f"{len(winners)} of {len(outcomes)} racing appends succeeded"
    return winners[0]


@check("concurrency")
async def racing_writers_one_wins(ctx: Context, store: EventStore) -> None:
    """N writers appending at the same expected sequence at once (creating a run, or extending
    one): exactly one succeeds; every other gets `SequenceConflict` with the winner's head; the
    run holds the winner's events once and its summary agrees with the kernel."""
    creations = [[*started(), log(f"writer {i}")] for i in range(WRITERS)]
    winner = _one_winner(await _race(store, "r", 0, creations))
    for round_number in range(3):
        head = await store.head("r")
        batches: list[list[Event]] = [
            [log(f"round {round_number} writer {i}")] * (1 + i % 2) for i in range(WRITERS)
        ]
        outcomes = await _race(store, "r", head, batches)
        winner += _one_winner(outcomes)
        for outcome in outcomes:
            if isinstance(outcome, list):
                continue
            assert isinstance(outcome, SequenceConflict), f"a loser got {outcome!r}"
            assert (outcome.run_id, outcome.expected) == ("r", head)
            assert outcome.actual == len(winner), f"conflict says head {outcome.actual}"
    assert await store.read("r") == winner
    assert sequences(winner) == list(range(1, len(winner) + 1))
    assert await store.get_runs(["r"]) == [await kernel_summary(store, "r")]


@check("concurrency")
async def writers_on_distinct_runs_all_win(ctx: Context, store: EventStore) -> None:
    """N writers appending to N different runs at once all succeed, each run holding exactly its
    own events densely numbered with a summary that agrees with the kernel; with a global feed
    every envelope appears once, at a distinct rising position."""

    async def writer(run_id: str) -> list[Envelope]:
        written = await write(store, run_id, *started())
        for n in range(3):
            await asyncio.sleep(0)
            written += await write(store, run_id, log(f"{run_id} {n}"), at=T0 + n * MINUTE)
        return written

    run_ids = [f"w{i}" for i in range(WRITERS)]
    results = await asyncio.gather(*(writer(r) for r in run_ids))
    for run_id, written in zip(run_ids, results, strict=True):
        assert await store.read(run_id) == written
        assert sequences(written) == [1, 2, 3, 4, 5]
    summaries = await store.get_runs(run_ids)
    assert summaries == [await kernel_summary(store, r) for r in run_ids]
    if ctx.capabilities.global_feed:
        feed = await caught_up_feed(store)
        positions(feed)
        assert sorted(plain(feed)) == sorted(plain(e for w in results for e in w))


@check("concurrency")
async def racing_token_claims_one_holder(ctx: Context, store: EventStore) -> None:
    """N runs claiming the same hook token at once, as new runs or existing ones: exactly one
    holds it afterwards; every other append raises `TokenConflict` naming that holder and leaves
    its run as it was."""
    for round_number, exists in enumerate((False, True)):
        token = f"shared-{round_number}"
        run_ids = [f"claim{round_number}-{i}" for i in range(WRITERS)]
        if exists:
            for run_id in run_ids:
                await write(store, run_id, *started())

        async def claim(run_id: str, token: str = token, exists: bool = exists) -> list[Envelope]:
            events: list[Event] = [hook("h", token)] if exists else [*started(), hook("h", token)]
            history = await store.read(run_id)
            index = index_after(history, envelopes_for(run_id, len(history), events, T0))
            return await store.append_if_sequence(
                run_id, len(history), events, index=index, recorded_at=T0
            )

        outcomes = await asyncio.gather(*(claim(r) for r in run_ids), return_exceptions=True)
        winners = [r for r, o in zip(run_ids, outcomes, strict=True) if isinstance(o, list)]
        assert len(winners) == 1, f"{len(winners)} runs claimed one token"
        for run_id, outcome in zip(run_ids, outcomes, strict=True):
            if run_id in winners:
                continue
            assert isinstance(outcome, TokenConflict), f"{run_id} got {outcome!r}"
            assert (outcome.holder_run_id, outcome.holder_hook_id) == (winners[0], "h")
            assert await store.head(run_id) == (2 if exists else 0)
        found = await store.find_hook(token, now=T0)
        assert found is not None and found.run_id == winners[0]


async def _concurrently(
    writers: list[Awaitable[None]], reader: Callable[[asyncio.Event], Awaitable[None]]
) -> None:
    """Run `writers` to completion while `reader(done)` runs; `done` is set once they finished."""
    done = asyncio.Event()

    async def write_all() -> None:
        try:
            await asyncio.gather(*writers)
        finally:
            done.set()

    await asyncio.gather(write_all(), reader(done))


@check("concurrency", requires=("global_feed",))
async def tailing_reader_never_skips(ctx: Context, store: EventStore) -> None:
    """A reader tailing `read_all(after_position=last seen)` while many writers append batches of
    different sizes sees every envelope exactly once, in rising positions: no position becomes
    visible before the ones below it (no event ever appears below a position already
    returned)."""
    seen: list[Envelope] = []

    async def writer(number: int) -> None:
        run_id = f"t{number}"
        await write(store, run_id, *started())
        for n in range(6):
            await asyncio.sleep(0)
            await write(store, run_id, *[log(f"{run_id} {n}")] * (1 + (n + number) % 3))

    async def tail(done: asyncio.Event) -> None:
        after = 0
        while True:
            finished = done.is_set()
            batch = await store.read_all(after_position=after, limit=5)
            if batch:
                found = positions(batch)
                assert found[0] > after, f"position {found[0]} returned after {after}"
                seen.extend(batch)
                after = found[-1]
            elif finished:
                # The writers are done; a feed that lags may still hold some back: stop only
                # once the caught-up feed has nothing after the last position seen.
                rest = [e for e in await caught_up_feed(store) if (e.position or 0) > after]
                if not rest:
                    return
            await asyncio.sleep(0)

    await _concurrently([writer(i) for i in range(6)], tail)
    feed = await caught_up_feed(store)
    missed = len(feed) - len(seen)
    assert seen == feed, f"the tailing reader missed {missed} envelope(s) of {len(feed)}"


@check("concurrency")
async def readers_never_see_partial_append(ctx: Context, store: EventStore) -> None:
    """Readers running between concurrent appends of three-event batches never see part of one:
    `head`, `read`, the summary's `last_sequence` and (when offered) each run's share of the
    feed are always whole batches, and the summary never lags the events read before it (index
    rows commit with the events)."""
    run_ids = [f"p{i}" for i in range(4)]
    batch = 3

    async def writer(run_id: str) -> None:
        await write(store, run_id, *started(), log())
        for n in range(6):
            await asyncio.sleep(0)
            await write(store, run_id, *[log(f"{n}")] * batch, at=T0 + n * MINUTE)

    async def read_whole_batches(done: asyncio.Event) -> None:
        while not done.is_set():
            for run_id in run_ids:
                head = await store.head(run_id)
                [summary] = await store.get_runs([run_id])
                events = await store.read(run_id)
                assert head % batch == 0, f"head {head} is inside a batch"
                assert sequences(events) == list(range(1, len(events) + 1))
                assert len(events) % batch == 0, f"read {len(events)} events: part of a batch"
                if summary is None:
                    assert head == 0, f"events up to {head} but no summary"
                    continue
                last = summary.last_sequence
                assert last % batch == 0, f"summary at {last}, inside a batch"
                assert last >= head, f"summary at {last} after events up to {head} were read"
                assert len(events) >= last, f"summary at {last} before its events were visible"
            if ctx.capabilities.global_feed:
                counts = Counter(e.run_id for e in await store.read_all(limit=ALL))
                assert all(c % batch == 0 for c in counts.values()), f"feed holds {counts}"
            await asyncio.sleep(0)

    await _concurrently([writer(r) for r in run_ids], read_whole_batches)
    for run_id in run_ids:
        assert await store.head(run_id) == 21
        assert await store.get_runs([run_id]) == [await kernel_summary(store, run_id)]
