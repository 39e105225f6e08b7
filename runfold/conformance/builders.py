"""Event builders, kernel-indexed writes and views of a store's state, shared by the checks.

Index rows are always the kernel's: `write` folds the run's stored history plus the new events
and hands `run_index(...)` to `append_if_sequence`, exactly as `CommandHandler` does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from runfold.conformance._core import Capabilities
from runfold.kernel import (
    Envelope,
    Event,
    HookCreated,
    HookHolder,
    LogRecorded,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunIndex,
    RunStarted,
    RunSummary,
    RunTimedOut,
    Wakeup,
    apply,
    project_run,
    run_index,
)
from runfold.stores.protocol import EventStore

__all__ = [
    "ALL",
    "FAR",
    "FEED_PATIENCE",
    "HOUR",
    "MINUTE",
    "T0",
    "all_run_ids",
    "caught_up_feed",
    "created",
    "envelopes_for",
    "everything",
    "feed_after",
    "holder",
    "hook",
    "index_after",
    "kernel_summary",
    "log",
    "plain",
    "positions",
    "raises",
    "run_state",
    "sequences",
    "settle",
    "started",
    "wakeup",
    "walk",
    "write",
]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""The time the hand-written checks start at."""
MINUTE = timedelta(minutes=1)
"""One minute, the step most checks move the clock by."""
HOUR = timedelta(hours=1)
"""One hour."""
FAR = T0 + timedelta(days=3650)
"""Later than anything a check writes: `due_wakeups(FAR)` lists every wakeup."""
ALL = 1_000_000
"""A page size larger than any check's data: one page holds everything."""


def created(
    workflow_name: str = "wf",
    *,
    parent_run_id: str | None = None,
    deadline: datetime | None = None,
    input: bytes = b"",
) -> RunCreated:
    """A `run_created` event."""
    return RunCreated(
        workflow_name=workflow_name, input=input, parent_run_id=parent_run_id, deadline=deadline
    )


def started() -> tuple[Event, ...]:
    """The two events of a created and started run."""
    return (created(), RunStarted())


def hook(hook_id: str, token: str, retain_token_until: datetime | None = None) -> HookCreated:
    """A `hook_created` event."""
    return HookCreated(hook_id=hook_id, token=token, retain_token_until=retain_token_until)


def log(message: str = "x", step_id: str | None = None) -> LogRecorded:
    """A `log_recorded` event."""
    return LogRecorded(level="info", message=message, step_id=step_id)


RUN_ENDINGS: dict[str, list[Event]] = {
    "completed": [RunCompleted(output=b"")],
    "failed": [RunFailed(error=b"")],
    "cancelled": [RunCancelled()],
    "timed_out": [RunTimedOut(deadline=T0 + HOUR)],
}
"""The events that end a started run, by the terminal status they give it."""


def envelopes_for(run_id: str, head: int, events: Sequence[Event], at: datetime) -> list[Envelope]:
    """`events` as the envelopes they become when appended after `head`."""
    return [
        Envelope(run_id=run_id, sequence=head + offset, event=event, recorded_at=at)
        for offset, event in enumerate(events, start=1)
    ]


def index_after(history: Sequence[Envelope], new: Sequence[Envelope]) -> RunIndex:
    """The index rows the kernel derives for `history + new`."""
    if history:
        return run_index(apply(project_run(history), new))
    return run_index(project_run(new))


async def write(
    store: EventStore, run_id: str, *events: Event, at: datetime = T0
) -> list[Envelope]:
    """Append `events` at the run's head with the kernel's index rows."""
    history = await store.read(run_id)
    head = len(history)
    index = index_after(history, envelopes_for(run_id, head, events, at))
    return await store.append_if_sequence(run_id, head, events, index=index, recorded_at=at)


async def kernel_summary(store: EventStore, run_id: str) -> RunSummary | None:
    """The summary the kernel derives from the run's stored history (None: no history)."""
    history = await store.read(run_id)
    return run_index(project_run(history)).summary if history else None


def plain(envelopes: Iterable[Envelope]) -> list[tuple[str, int, Event, datetime]]:
    """Envelopes without their positions (which are the store's own business)."""
    return [(e.run_id, e.sequence, e.event, e.recorded_at) for e in envelopes]


def sequences(envelopes: Iterable[Envelope]) -> list[int]:
    """The envelopes' sequences."""
    return [e.sequence for e in envelopes]


def positions(envelopes: Sequence[Envelope]) -> list[int]:
    """The envelopes' feed positions, asserting each is set and they strictly increase."""
    found = [e.position for e in envelopes]
    chosen = [p for p in found if isinstance(p, int) and not isinstance(p, bool) and p > 0]
    assert len(chosen) == len(found), f"positions not all set: {found}"
    assert all(a < b for a, b in itertools.pairwise(chosen)), f"positions not rising: {chosen}"
    return chosen


async def run_state(store: EventStore, run_ids: Sequence[str], now: datetime = T0) -> Any:
    """What the store answers about `run_ids`: events, heads, summaries, hooks, wakeups."""
    wakeups = await store.due_wakeups(FAR, limit=ALL)
    return (
        [await store.read(run_id) for run_id in run_ids],
        [await store.head(run_id) for run_id in run_ids],
        await store.get_runs(run_ids),
        [(await store.list_hooks(run_id=run_id, now=now, limit=ALL)).items for run_id in run_ids],
        [w for w in wakeups if w.run_id in run_ids],
    )


async def everything(
    store: EventStore, run_ids: Sequence[str], capabilities: Capabilities, now: datetime = T0
) -> Any:
    """`run_state` plus the store-wide answers (the feed when offered): proof nothing changed."""
    return (
        await run_state(store, run_ids, now),
        await store.list_runs(limit=ALL),
        await caught_up_feed(store) if capabilities.global_feed else None,
        await store.list_hooks(now=now, limit=ALL),
        await store.next_wakeup(),
    )


FEED_PATIENCE = 10.0
"""Seconds `caught_up_feed` waits for the feed to show what the runs hold."""


async def caught_up_feed(store: EventStore, *, patience: float = FEED_PATIENCE) -> list[Envelope]:
    """The whole feed (`read_all`) once it holds as many envelopes as the store's runs do.

    A feed may lag a moment behind the runs (PostgresStore serves only transactions older than
    every one still running on the server, and waits just `feed_wait` for them): comparing two
    readings taken straight after writes would assume no transaction anywhere stays open that
    long. This waits, up to `patience` seconds, until the feed has caught up with every run's
    head; a store whose feed never does is then judged on what it returned.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        listed = await store.list_runs(limit=ALL)
        held = sum([await store.head(summary.run_id) for summary in listed.items])
        feed = await store.read_all(limit=ALL)
        if len(feed) >= held or loop.time() >= deadline:
            return feed
        await asyncio.sleep(0.01)


async def feed_after(
    store: EventStore, after_position: int, count: int, *, patience: float = FEED_PATIENCE
) -> list[Envelope]:
    """The feed's next `count` envelopes after `after_position`, waiting while it lags.

    `read_all(after_position=…, limit=count)` once it returns `count` envelopes (or after
    `patience` seconds): the envelopes just appended, however long the feed lags behind them
    (see `caught_up_feed`).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        feed = await store.read_all(after_position=after_position, limit=count)
        if len(feed) >= count or loop.time() >= deadline:
            return feed
        await asyncio.sleep(0.01)


async def all_run_ids(store: EventStore, **filters: Any) -> list[str]:
    """Every run id `list_runs` lists with `filters`, in one page."""
    page = await store.list_runs(limit=ALL, **filters)
    assert not page.has_more, "a page as large as every run says it has more"
    return [summary.run_id for summary in page.items]


async def walk(
    fetch: Callable[[str | None], Awaitable[Any]], limit: int, bound: int = 10_000
) -> list[Any]:
    """Every item of a cursor-paged listing, asserting the page laws on the way.

    At most `limit` items a page, full pages while `has_more`, a cursor exactly when
    `has_more`, and a page with items after every page that said `has_more`.
    """
    seen: list[Any] = []
    cursor: str | None = None
    for _ in range(bound):
        page = await fetch(cursor)
        assert len(page.items) <= limit, f"a page of {len(page.items)} items for limit {limit}"
        if cursor is not None:
            assert page.items, f"has_more promised more, then a page of none (limit {limit})"
        seen.extend(page.items)
        if not page.has_more:
            assert page.cursor is None, "the last page carries a cursor"
            return seen
        assert page.cursor is not None, "has_more without a cursor"
        assert len(page.items) == limit, "a page short of its limit says it has more"
        cursor = page.cursor
    raise AssertionError(f"pagination did not end after {bound} pages")


def holder(run_id: str, hook_id: str, retained_until: datetime | None = None) -> HookHolder:
    """A `HookHolder`."""
    return HookHolder(run_id=run_id, hook_id=hook_id, retained_until=retained_until)


def wakeup(run_id: str, kind: Any, subject_id: str, due_at: datetime) -> Wakeup:
    """A `Wakeup`."""
    return Wakeup(run_id=run_id, kind=kind, subject_id=subject_id, due_at=due_at)


async def raises(error: type[E], call: Awaitable[Any], what: str) -> E:
    """The `error` that awaiting `call` raises.

    `AssertionError` naming `what` if it returns instead (any other error propagates).
    """
    try:
        await call
    except error as exc:
        return exc
    raise AssertionError(f"{what}: no {error.__name__} was raised")


async def settle(probe: Callable[[], Awaitable[T]], *, pause: float = 0.02, rounds: int = 200) -> T:
    """`probe()`'s answer once it stops changing.

    Work a cancelled caller left in flight (a write a store shields from cancellation, say) is
    allowed to finish before outcomes are judged.
    """
    last = await probe()
    for _ in range(rounds):
        await asyncio.sleep(pause)
        current = await probe()
        if current == last:
            return current
        last = current
    raise AssertionError("the store kept changing with no writer running")
