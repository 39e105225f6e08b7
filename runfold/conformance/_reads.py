"""Checks of the reads: ranges, descending order, correlation ids, and byte-exact round trips."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import attrs
from hypothesis import given
from hypothesis import strategies as st

from runfold.conformance import strategies
from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    HOUR,
    MINUTE,
    T0,
    caught_up_feed,
    created,
    feed_after,
    hook,
    kernel_summary,
    log,
    plain,
    started,
    write,
)
from runfold.kernel import (
    EVENT_TYPES,
    AttributeChange,
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Event,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    RetryPolicy,
    RunCancelled,
    RunClaimed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunIndex,
    RunReleased,
    RunStarted,
    RunSummary,
    RunTimedOut,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepWriter,
    WaitCompleted,
    WaitCreated,
    correlation_id,
    project_run,
)
from runfold.kernel.limits import DEFAULT_LIMITS
from runfold.stores.protocol import EventStore

_SIX: list[Event] = [*started(), log("1"), log("2"), log("3"), log("4")]


async def _assert_ranges(
    store: EventStore, cases: list[tuple[int, int | None, list[int]]], descending: bool
) -> None:
    written = await write(store, "r", *_SIX)
    await write(store, "neighbour", *started(), log())
    for after, limit, expected in cases:
        got = await store.read("r", after=after, limit=limit, descending=descending)
        assert got == [written[s - 1] for s in expected], (
            f"read(after={after}, limit={limit}, descending={descending}) gave sequences "
            f"{[e.sequence for e in got]}, not {expected}"
        )


@check("reads")
async def read_ascending_ranges(ctx: Context, store: EventStore) -> None:
    """`read(after, limit)` returns the run's envelopes with `sequence > after`, oldest first, at
    most `limit` (0 means none), never another run's."""
    cases: list[tuple[int, int | None, list[int]]] = [
        (0, None, [1, 2, 3, 4, 5, 6]),
        (2, None, [3, 4, 5, 6]),
        (0, 2, [1, 2]),
        (2, 3, [3, 4, 5]),
        (5, 10, [6]),
        (6, None, []),
        (40, None, []),
        (0, 0, []),
    ]
    await _assert_ranges(store, cases, descending=False)


@check("reads")
async def read_descending_ranges(ctx: Context, store: EventStore) -> None:
    """`read(descending=True)` returns newest first: from the head when `after` is 0, else the
    envelopes with `sequence < after`; `limit` keeps the newest ones."""
    cases: list[tuple[int, int | None, list[int]]] = [
        (0, None, [6, 5, 4, 3, 2, 1]),
        (0, 2, [6, 5]),
        (4, None, [3, 2, 1]),
        (4, 2, [3, 2]),
        (2, None, [1]),
        (1, None, []),
        (40, 2, [6, 5]),
        (0, 0, []),
    ]
    await _assert_ranges(store, cases, descending=True)


@check("reads")
async def read_unknown_run(ctx: Context, store: EventStore) -> None:
    """An unknown run reads as empty everywhere (`read`, `read_by_correlation`, `head` 0,
    `get_runs` None) rather than raising; so does an unknown correlation id of a known run."""
    await write(store, "known", created(), StepCreated(step_id="s", step_name="n", input=b""))
    assert await store.read("unknown") == []
    assert await store.read("unknown", after=3, descending=True) == []
    assert await store.head("unknown") == 0
    assert await store.read_by_correlation("unknown", "s") == []
    assert await store.read_by_correlation("known", "nope") == []
    assert await store.get_runs(["unknown"]) == [None]


_S1_HISTORY: list[Event] = [
    created(),
    RunStarted(),
    StepCreated(step_id="s1", step_name="n", input=b""),
    StepCreated(step_id="s2", step_name="n", input=b""),
    StepStarted(step_id="s1", attempt=1),
    StepRetrying(step_id="s1", error=b"e"),
    StepStarted(step_id="s1", attempt=2),
    log("about s1", step_id="s1"),
    StepStarted(step_id="s2", attempt=1),
    StepCompleted(step_id="s1", output=b"o"),
]
"""Run "a": the events correlated with s1 are 3, 5, 6, 7, 8 and 10."""


@check("reads")
async def read_by_correlation_scoped_to_run(ctx: Context, store: EventStore) -> None:
    """`read_by_correlation(run, id)` returns only that run's events with that correlation id (a
    step's log lines included), in order, with the ranges of `read` (ascending and descending),
    even when another run uses the same id."""
    written = await write(store, "a", *_S1_HISTORY)
    other = await write(
        store,
        "b",
        *started(),
        StepCreated(step_id="s1", step_name="n", input=b""),
        StepStarted(step_id="s1", attempt=1),
    )
    cases: list[tuple[int, int | None, bool, list[int]]] = [
        (0, None, False, [3, 5, 6, 7, 8, 10]),
        (5, None, False, [6, 7, 8, 10]),
        (0, 2, False, [3, 5]),
        (5, 2, False, [6, 7]),
        (10, None, False, []),
        (0, None, True, [10, 8, 7, 6, 5, 3]),
        (7, None, True, [6, 5, 3]),
        (7, 2, True, [6, 5]),
        (0, 1, True, [10]),
        (3, None, True, []),
        (1, None, True, []),
        (0, 0, False, []),
        (0, 0, True, []),
    ]
    for after, limit, descending, expected in cases:
        got = await store.read_by_correlation(
            "a", "s1", after=after, limit=limit, descending=descending
        )
        assert got == [written[s - 1] for s in expected], (
            f"read_by_correlation('a', 's1', after={after}, limit={limit}, "
            f"descending={descending}) gave {[(e.run_id, e.sequence) for e in got]}"
        )
    assert await store.read_by_correlation("b", "s1") == other[2:]


@check("reads")
async def read_by_correlation_covers_every_kind(ctx: Context, store: EventStore) -> None:
    """Correlation ids cover waits, hooks, attribute writes, progress and child links as well as
    steps: each id finds exactly its events."""
    written = await write(
        store,
        "r",
        *started(),
        WaitCreated(wait_id="x", resume_at=T0 + HOUR),
        hook("h", "tok"),
        AttributesSet(changes=(AttributeChange(key="k", value="v"),), write_id="w"),
        ProgressRecorded(progress_id="p", completed=1),
        ChildLinked(reference_id="c", kind="run", operation_id="op"),
        HookReceived(hook_id="h", payload=b""),
        WaitCompleted(wait_id="x"),
    )
    for correlation, wanted in {"x": [3, 9], "h": [4, 8], "w": [5], "p": [6], "c": [7]}.items():
        got = await store.read_by_correlation("r", correlation)
        assert got == [written[s - 1] for s in wanted], f"correlation id {correlation!r}"


_EVERY_BODY: list[Event] = [
    RunCreated(
        workflow_name="wf",
        input=b"\x00in",
        workflow_version="v1",
        deployment_id="d1",
        context=b"ctx",
        attributes={"k": "v", "ü": "😀"},
        parent_run_id="parent",
        deadline=T0 + timedelta(days=1, microseconds=7),
    ),
    RunStarted(),
    RunClaimed(owner_id="worker-a", epoch=1),
    RunReleased(owner_id="worker-a", epoch=1),
    RunClaimed(owner_id="worker-b", epoch=2),
    RunClaimed(owner_id="wörker-😀", epoch=3, displaced="worker-b"),
    StepCreated(
        step_id="s1",
        step_name="n",
        input=b"i",
        retry=RetryPolicy(
            max_attempts=5,
            initial_interval=timedelta(seconds=2),
            backoff_coefficient=1.5,
            max_interval=timedelta(minutes=1),
            non_retryable_error_codes=("E1", "E2"),
        ),
    ),
    StepStarted(step_id="s1", attempt=1),
    StepRetrying(step_id="s1", error=b"e", retry_after=T0 + MINUTE),
    StepStarted(step_id="s1", attempt=2),
    AttributesSet(
        changes=(AttributeChange(key="k2", value="v2"), AttributeChange(key="k", value=None)),
        writer=StepWriter(step_id="s1", attempt=2),
        write_id="w1",
    ),
    AttributesSet(changes=(AttributeChange(key="$sys", value="y"),), allow_reserved=True),
    ProgressRecorded(progress_id="p", completed=1, total=3, message="m", details=b"\x00"),
    ChildLinked(reference_id="c", kind="run", operation_id="op", child_run_id="x", metadata=b"m"),
    LogRecorded(level="error", message="nul\x00 and 😀", step_id="s1", data=b"\xff"),
    StepCompleted(step_id="s1", output=b"o"),
    StepCreated(step_id="s2", step_name="n", input=b""),
    StepFailed(step_id="s2", error=b"f", retryable=True),
    StepCreated(step_id="s3", step_name="n", input=b""),
    StepCancelled(step_id="s3", reason="r"),
    WaitCreated(wait_id="w1", resume_at=T0 + HOUR),
    WaitCompleted(wait_id="w1"),
    HookCreated(
        hook_id="h1",
        token="tok-every",
        metadata=b"meta",
        is_webhook=True,
        retain_token_until=T0 + timedelta(days=2),
    ),
    HookReceived(hook_id="h1", payload=b"\x00p", delivery_id="d1"),
    HookDisposed(hook_id="h1"),
    HookConflict(hook_id="h2", token="tok-x", holder_run_id="other"),
]
_ENDINGS: list[list[Event]] = [
    [RunCompleted(output=b"out")],
    [RunFailed(error=b"err", error_code="E")],
    [CancelRequested(reason="stop"), RunCancelled(reason="stop")],
    [RunTimedOut(deadline=T0, reason="late")],
]


@check("reads")
async def round_trip_every_event_type(ctx: Context, store: EventStore) -> None:
    """Every event type, with every optional field set, reads back equal (through `read`,
    `read_by_correlation` and, when offered, `read_all`) in runs ending each possible way, and
    each run's summary (its non-ASCII and reserved attributes included) is the kernel's."""
    covered = {type(e) for e in _EVERY_BODY} | {type(e) for end in _ENDINGS for e in end}
    assert covered == set(EVENT_TYPES.values()), "the kit misses an event type"
    for number, ending in enumerate(_ENDINGS):
        run_id = f"r{number}"
        events = _EVERY_BODY + ending
        await write(store, run_id, *events[:7])
        await write(store, run_id, *events[7:], at=T0 + MINUTE)
        stored = await store.read(run_id)
        assert [e.event for e in stored] == events
        assert [e.sequence for e in stored] == list(range(1, len(events) + 1))
        assert [e.event for e in await store.read_by_correlation(run_id, "s1")] == [
            e for e in events if correlation_id(e) == "s1"
        ]
        [summary] = await store.get_runs([run_id])
        assert summary == await kernel_summary(store, run_id), (
            f"the summary of run {run_id!r} differs from the kernel's: {summary}"
        )
    if ctx.capabilities.global_feed:
        feed = await caught_up_feed(store)
        assert [e.event for e in feed] == [e for end in _ENDINGS for e in _EVERY_BODY + end]


_PAYLOADS: list[bytes] = [
    b"",
    b"\x00",
    b"\x00a\x00\x00b\x00",
    bytes(range(256)),
    bytes((i * 7 + i // 256) % 256 for i in range(1 << 20)),
    bytes(range(256)) * (2 * 1024 * 1024 // 256),
]
"""Empty, NUL bytes, every byte value, 1 MiB and 2 MiB (the default payload limit)."""


@check("reads")
async def round_trip_payload_bytes(ctx: Context, store: EventStore) -> None:
    """Every payload byte survives: empty payloads, NUL bytes, all 256 byte values, 1 MiB and
    2 MiB payloads read back identical in every payload field (input, context, output, error,
    delivery), through `read`, `read_by_correlation` and the feed, and fold to the same
    snapshot."""
    for number, payload in enumerate(_PAYLOADS):
        run_id = f"r{number}"
        events: list[Event] = [
            RunCreated(workflow_name="wf", input=payload, context=payload),
            RunStarted(),
            StepCreated(step_id="s1", step_name="n", input=payload),
            StepCompleted(step_id="s1", output=payload),
            hook("h", f"tok-{number}"),
            HookReceived(hook_id="h", payload=payload, delivery_id="d"),
            RunFailed(error=payload),
        ]
        appended = await write(store, run_id, *events)
        assert [e.event for e in appended] == events
        stored = await store.read(run_id)
        assert [e.event for e in stored] == events, f"a {len(payload)}-byte payload changed"
        correlated = await store.read_by_correlation(run_id, "s1")
        assert [e.event for e in correlated] == events[2:4], (
            f"a {len(payload)}-byte payload changed through read_by_correlation"
        )
        loaded = project_run(stored)
        assert loaded.input == loaded.context == loaded.error == payload
        assert loaded.steps["s1"].output == payload
        assert loaded.hooks["h"].deliveries[0].payload == payload
        if ctx.capabilities.global_feed:
            feed = await feed_after(store, (appended[0].position or 1) - 1, 7)
            assert [e.event for e in feed] == events


_RECORDED_AT = [
    T0,
    T0 + timedelta(microseconds=1),
    datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
    datetime(2000, 2, 29, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
]


@check("reads")
async def round_trip_recorded_at(ctx: Context, store: EventStore) -> None:
    """`recorded_at` reads back as the same instant to the microsecond, timezone-aware, from 1970
    to the end of year 9999, and the run's summary carries the same times."""
    for number, at in enumerate(_RECORDED_AT):
        run_id = f"r{number}"
        await write(store, run_id, created(), at=at)
        await write(store, run_id, RunStarted(), at=at)
        stored = await store.read(run_id)
        assert [e.recorded_at for e in stored] == [at, at]
        assert all(e.recorded_at.utcoffset() is not None for e in stored), "naive recorded_at"
        [summary] = await store.get_runs([run_id])
        assert summary is not None and (summary.created_at, summary.updated_at) == (at, at)


_ID_FIELDS = ("step_id", "wait_id", "hook_id", "write_id", "progress_id", "reference_id")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MAX_ID = DEFAULT_LIMITS.max_id_length


def _with_valid_ids(event: Event) -> Event:
    """`event` with its identifiers made valid ones (1 to 256 characters, no control
    character). A store may keep the correlation id in an indexed column, and the kernel never
    hands it any other; every other field keeps whatever `strategies.events()` drew."""
    changes = {}
    for name in _ID_FIELDS:
        value = getattr(event, name, None)
        if isinstance(value, str) and not (
            0 < len(value) <= _MAX_ID and not _CONTROL.search(value)
        ):
            changes[name] = "id-" + hashlib.sha256(value.encode()).hexdigest()[:16]
    if not changes:
        return event
    changed: Event = attrs.evolve(cast(Any, event), **changes)
    return changed


def _synthetic_index(run_id: str, last_sequence: int) -> RunIndex:
    """Index rows for a run of arbitrary events: the store keeps them without judging."""
    summary = RunSummary(
        run_id=run_id,
        workflow_name="wf",
        status="running",
        parent_run_id=None,
        created_at=T0,
        updated_at=T0,
        completed_at=None,
        last_sequence=last_sequence,
        attributes={},
    )
    return RunIndex(summary=summary, hooks=(), wakeups=())


@check("reads", sync=True)
def round_trip_generated_events(ctx: Context) -> None:
    """Property: batches of arbitrary events (`strategies.events()`: any text with NUL and astral
    characters, any bytes up to 2 MiB, unbounded integers, any aware time from 1970 to 9999; only
    identifiers are kept valid) read back equal through `read`, `read_by_correlation` and, when
    offered, `read_all`."""
    counter = iter(range(1 << 30))

    async def round_trip(store: EventStore, batch: list[Event]) -> None:
        run_id = f"gen-{next(counter)}"
        index = _synthetic_index(run_id, len(batch))
        appended = await store.append_if_sequence(run_id, 0, batch, index=index, recorded_at=T0)
        stored = await store.read(run_id)
        assert [e.event for e in stored] == batch
        assert plain(stored) == plain(appended)
        for event in batch:
            correlation = correlation_id(event)
            if correlation is not None:
                found = await store.read_by_correlation(run_id, correlation)
                assert event in [e.event for e in found]
        if ctx.capabilities.global_feed:
            start = (appended[0].position or 1) - 1
            feed = await feed_after(store, start, len(batch))
            assert [e.event for e in feed] == batch

    store = ctx.run(ctx.new_store())

    @ctx.effort.seeded
    @ctx.effort.settings()
    @given(st.lists(strategies.events().map(_with_valid_ids), min_size=1, max_size=4))
    def property(batch: list[Event]) -> None:
        ctx.run(round_trip(store, batch))

    property()
