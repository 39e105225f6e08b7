"""Checks of the global feed (`read_all`): position order, paging, and positions never reused."""

from __future__ import annotations

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    ALL,
    MINUTE,
    T0,
    caught_up_feed,
    created,
    log,
    plain,
    positions,
    started,
    write,
)
from runfold.kernel import Envelope, Event, RunCompleted
from runfold.stores.protocol import EventStore


async def _feed(store: EventStore) -> list[Envelope]:
    """Seven appends of one or two events to runs c, a, b in turn; returns what was appended."""
    written: list[Envelope] = []
    for i, run_id in enumerate(["c", "a", "b", "a", "c", "b", "a"]):
        batch: list[Event] = list(started())
        if await store.head(run_id):
            batch = [log() for _ in range(1 + i % 2)]
        written += await write(store, run_id, *batch, at=T0 + i * MINUTE)
    return written


@check("global_feed")
async def read_all_in_position_order(ctx: Context, store: EventStore) -> None:
    """`read_all` returns every envelope of every run once, in append order, with the positions
    `append_if_sequence` returned, strictly rising; each run's envelopes appear in sequence
    order and equal its `read`."""
    written = await _feed(store)
    await caught_up_feed(store)
    feed = await store.read_all()
    assert feed == written, "read_all differs from what the appends returned"
    positions(feed)
    for run_id in "abc":
        assert [e for e in feed if e.run_id == run_id] == await store.read(run_id)


@check("global_feed")
async def read_all_pages_by_position(ctx: Context, store: EventStore) -> None:
    """`read_all(after_position, limit)` returns the envelopes after that position, at most
    `limit` (0: none), so following the last position of each page visits the whole feed once,
    whatever the page size."""
    written = await _feed(store)
    await caught_up_feed(store)
    for limit in (1, 2, 5, 1000):
        seen: list[Envelope] = []
        after = 0
        while batch := await store.read_all(after_position=after, limit=limit):
            assert len(batch) <= limit
            seen += batch
            after = positions(batch)[-1]
            assert len(seen) <= len(written), f"paging by {limit} repeats envelopes"
        assert seen == written, f"paging by {limit} visited {plain(seen)}"
    middle, last = positions(written)[4], positions(written)[-1]
    assert await store.read_all(after_position=middle) == written[5:]
    assert await store.read_all(after_position=middle, limit=2) == written[5:7]
    assert await store.read_all(after_position=last) == []
    assert await store.read_all(limit=0) == []


@check("global_feed", requires=("retention",))
async def feed_never_reuses_a_position(ctx: Context, store: EventStore) -> None:
    """A position once returned is never given to another event, even after retention deleted
    the events holding the highest positions: a tailing reader waiting after that position still
    sees every later append."""
    await write(store, "kept", *started())
    await write(store, "ended", *started())
    done = await write(store, "ended", RunCompleted(output=b""), at=T0 + MINUTE)
    high = positions(done)[-1]
    assert await store.delete_runs(terminal_before=T0 + 2 * MINUTE, limit=10) == 1
    fresh = await write(store, "fresh", created(), at=T0 + 2 * MINUTE)
    assert positions(fresh)[0] > high, (
        f"position {positions(fresh)[0]} was handed out again after retention (it had reached "
        f"{high}): a reader tailing after {high} never sees the new event"
    )
    await caught_up_feed(store)
    assert await store.read_all(after_position=high, limit=ALL) == fresh
