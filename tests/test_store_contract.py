"""The `EventStore` contract of `STORES.md`, checked against every backend through `store`.

Index rows are always the kernel's: `write` folds the run's stored history plus the new events
with `project_run`/`apply` and hands `run_index(...)` to `append_if_sequence`, exactly as the
handler does. Only the public protocol is used, so every backend runs the same checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from runfold import (
    EVENT_TYPES,
    AttributeChange,
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Envelope,
    Event,
    EventStore,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookHolder,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    RetryPolicy,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunIndex,
    RunStarted,
    RunSummary,
    RunTimedOut,
    SequenceConflict,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepWriter,
    StoreClosed,
    TokenConflict,
    WaitCompleted,
    WaitCreated,
    Wakeup,
    WorkflowWriter,
    apply,
    project_run,
    run_index,
)
from tests.conftest import T0

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)

# --- helpers ------------------------------------------------------------------------------------


def created(
    workflow_name: str = "wf",
    *,
    parent_run_id: str | None = None,
    deadline: datetime | None = None,
    input: bytes = b"",
) -> RunCreated:
    return RunCreated(
        workflow_name=workflow_name, input=input, parent_run_id=parent_run_id, deadline=deadline
    )


def hook(hook_id: str, token: str, retain_token_until: datetime | None = None) -> HookCreated:
    return HookCreated(hook_id=hook_id, token=token, retain_token_until=retain_token_until)


def log(message: str = "x", step_id: str | None = None) -> LogRecorded:
    return LogRecorded(level="info", message=message, step_id=step_id)


def envelopes_for(run_id: str, head: int, events: Sequence[Event], at: datetime) -> list[Envelope]:
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
    head = history[-1].sequence if history else 0
    index = index_after(history, envelopes_for(run_id, head, events, at))
    return await store.append_if_sequence(run_id, head, events, index=index, recorded_at=at)


async def kernel_summary(store: EventStore, run_id: str) -> RunSummary:
    """The summary the kernel derives from the run's stored history."""
    return run_index(project_run(await store.read(run_id))).summary


async def run_state(store: EventStore, run_ids: Sequence[str]) -> tuple[Any, ...]:
    """What the store answers about `run_ids`: events, heads, summaries, hooks, wakeups."""
    wakeups = await store.due_wakeups(T0 + timedelta(days=365), limit=10_000)
    return (
        [await store.read(run_id) for run_id in run_ids],
        [await store.head(run_id) for run_id in run_ids],
        await store.get_runs(run_ids),
        [(await store.list_hooks(run_id=run_id, now=T0)).items for run_id in run_ids],
        [w for w in wakeups if w.run_id in run_ids],
    )


async def everything(store: EventStore, run_ids: Sequence[str]) -> tuple[Any, ...]:
    """`run_state` plus the store-wide answers: to prove an append wrote nothing."""
    return (
        await run_state(store, run_ids),
        await store.list_runs(limit=10_000),
        await store.read_all(),
        await store.list_hooks(now=T0, limit=10_000),
        await store.next_wakeup(),
    )


async def all_run_ids(store: EventStore, **filters: Any) -> list[str]:
    page = await store.list_runs(limit=10_000, **filters)
    assert not page.has_more
    return [summary.run_id for summary in page.items]


def sequences(envelopes: Sequence[Envelope]) -> list[int]:
    return [envelope.sequence for envelope in envelopes]


def positions(envelopes: Sequence[Envelope]) -> list[int]:
    """The envelopes' global-feed positions, which must all be set and strictly increasing."""
    found = [envelope.position for envelope in envelopes]
    assert all(isinstance(p, int) and p > 0 for p in found), found
    chosen = [p for p in found if p is not None]
    assert all(a < b for a, b in itertools.pairwise(chosen)), chosen
    return chosen


# --- append -------------------------------------------------------------------------------------


async def test_first_append_at_zero(store: EventStore) -> None:
    event = created()
    index = index_after([], envelopes_for("r", 0, [event], T0))
    appended = await store.append_if_sequence("r", 0, [event], index=index, recorded_at=T0)
    assert [(e.run_id, e.sequence, e.event, e.recorded_at) for e in appended] == [
        ("r", 1, event, T0)
    ]
    assert await store.head("r") == 1
    assert await store.read("r") == appended


async def test_append_at_head(store: EventStore) -> None:
    await write(store, "r", created())
    later = T0 + MINUTE
    appended = await write(store, "r", RunStarted(), at=later)
    assert sequences(appended) == [2]
    assert appended[0].recorded_at == later
    assert await store.head("r") == 2
    assert [e.event for e in await store.read("r")] == [created(), RunStarted()]


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        pytest.param(2, 0, id="stale-zero-on-existing-run"),
        pytest.param(2, 1, id="stale"),
        pytest.param(2, 3, id="future-by-one"),
        pytest.param(2, 7, id="future"),
        pytest.param(2, -1, id="negative"),
        pytest.param(0, 1, id="future-on-unknown-run"),
        pytest.param(0, 5, id="far-future-on-unknown-run"),
        pytest.param(0, -1, id="negative-on-unknown-run"),
    ],
)
async def test_wrong_expected_sequence_conflicts_and_writes_nothing(
    store: EventStore, existing: int, expected: int
) -> None:
    await write(store, "other", created(), RunStarted())
    if existing:
        await write(store, "r", *[created(), RunStarted()][:existing])
    before = await everything(store, ["r", "other"])
    history = await store.read("r")
    events: list[Event] = [log()] if existing else [created()]
    index = index_after(history, envelopes_for("r", existing, events, T0))

    with pytest.raises(SequenceConflict) as caught:
        await store.append_if_sequence("r", expected, events, index=index, recorded_at=T0)

    assert (caught.value.run_id, caught.value.expected, caught.value.actual) == (
        "r",
        expected,
        existing,
    )
    assert await everything(store, ["r", "other"]) == before


@pytest.mark.parametrize("existing", [0, 2])
async def test_empty_batch_is_a_value_error(store: EventStore, existing: int) -> None:
    if existing:
        await write(store, "r", created(), RunStarted())
    else:
        await write(store, "elsewhere", created())
    before = await everything(store, ["r"])
    index = run_index(project_run(await store.read("r" if existing else "elsewhere")))
    with pytest.raises(ValueError):
        await store.append_if_sequence(
            "r" if existing else "elsewhere", existing or 1, [], index=index, recorded_at=T0
        )
    assert await everything(store, ["r"]) == before


async def test_batch_gets_dense_sequences_one_recorded_at_and_rising_positions(
    store: EventStore,
) -> None:
    first = [created(), RunStarted(), StepCreated(step_id="s", step_name="n", input=b"")]
    second = [StepStarted(step_id="s", attempt=1), log("a", "s"), log("b")]
    at1, at2 = T0, T0 + MINUTE

    one = await write(store, "r", *first, at=at1)
    await write(store, "noise", created(), at=at1)
    two = await write(store, "r", *second, at=at2)

    assert sequences(one) == [1, 2, 3] and sequences(two) == [4, 5, 6]
    assert [e.event for e in one + two] == first + second
    assert {e.run_id for e in one + two} == {"r"}
    assert [e.recorded_at for e in one + two] == [at1] * 3 + [at2] * 3
    assert len(positions(one + two)) == 6
    assert await store.read("r") == one + two


# --- reads --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "limit", "descending", "expected"),
    [
        (0, None, False, [1, 2, 3, 4, 5, 6]),
        (2, None, False, [3, 4, 5, 6]),
        (0, 2, False, [1, 2]),
        (2, 3, False, [3, 4, 5]),
        (5, 10, False, [6]),
        (6, None, False, []),
        (40, None, False, []),
        (0, 0, False, []),
        (0, None, True, [6, 5, 4, 3, 2, 1]),
        (0, 2, True, [6, 5]),
        (4, None, True, [3, 2, 1]),
        (4, 2, True, [3, 2]),
        (1, None, True, []),
        (40, 2, True, [6, 5]),
    ],
)
async def test_read_ranges(
    store: EventStore, after: int, limit: int | None, descending: bool, expected: list[int]
) -> None:
    events = [created(), RunStarted(), log("1"), log("2"), log("3"), log("4")]
    written = await write(store, "r", *events)
    await write(store, "neighbour", created(), RunStarted(), log())

    got = await store.read("r", after=after, limit=limit, descending=descending)

    assert sequences(got) == expected
    assert got == [written[s - 1] for s in expected]


async def test_unknown_run_reads_empty(store: EventStore) -> None:
    await write(store, "known", created(), StepCreated(step_id="s", step_name="n", input=b""))
    assert await store.read("unknown") == []
    assert await store.read("unknown", after=3, descending=True) == []
    assert await store.head("unknown") == 0
    assert await store.read_by_correlation("unknown", "s") == []
    assert await store.read_by_correlation("known", "nope") == []
    assert await store.get_runs(["unknown"]) == [None]


async def test_head_follows_appends(store: EventStore) -> None:
    assert await store.head("r") == 0
    await write(store, "r", created())
    assert await store.head("r") == 1
    await write(store, "r", RunStarted(), log(), log())
    assert await store.head("r") == 4
    await write(store, "other", created())
    assert await store.head("r") == 4


STEP = StepCreated(step_id="s1", step_name="n", input=b"")
S1_HISTORY: list[Event] = [
    created(),  # 1
    RunStarted(),  # 2
    STEP,  # 3
    StepCreated(step_id="s2", step_name="n", input=b""),  # 4
    StepStarted(step_id="s1", attempt=1),  # 5
    StepRetrying(step_id="s1", error=b"e"),  # 6
    StepStarted(step_id="s1", attempt=2),  # 7
    log("about s1", step_id="s1"),  # 8
    StepStarted(step_id="s2", attempt=1),  # 9
    StepCompleted(step_id="s1", output=b"o"),  # 10
]


@pytest.mark.parametrize(
    ("after", "limit", "descending", "expected"),
    [
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
    ],
)
async def test_read_by_correlation_is_scoped_to_one_run(
    store: EventStore, after: int, limit: int | None, descending: bool, expected: list[int]
) -> None:
    written = await write(store, "a", *S1_HISTORY)
    other = await write(
        store, "b", created(), RunStarted(), STEP, StepStarted(step_id="s1", attempt=1)
    )

    got = await store.read_by_correlation(
        "a", "s1", after=after, limit=limit, descending=descending
    )

    assert got == [written[s - 1] for s in expected]
    assert await store.read_by_correlation("b", "s1") == other[2:]


async def test_correlation_covers_waits_hooks_attribute_writes_progress_and_children(
    store: EventStore,
) -> None:
    written = await write(
        store,
        "r",
        created(),
        RunStarted(),
        WaitCreated(wait_id="x", resume_at=T0 + HOUR),
        hook("h", "tok"),
        AttributesSet(changes=(AttributeChange(key="k", value="v"),), write_id="w"),
        ProgressRecorded(progress_id="p", completed=1),
        ChildLinked(reference_id="c", kind="run", operation_id="op"),
        HookReceived(hook_id="h", payload=b""),
        WaitCompleted(wait_id="x"),
    )
    expected = {"x": [3, 9], "h": [4, 8], "w": [5], "p": [6], "c": [7]}
    for correlation, wanted in expected.items():
        got = await store.read_by_correlation("r", correlation)
        assert got == [written[s - 1] for s in wanted], correlation


PAYLOADS = [
    pytest.param(b"", id="empty"),
    pytest.param(b"\x00", id="nul"),
    pytest.param(b"\x00a\x00\x00b\x00", id="embedded-nuls"),
    pytest.param(bytes(range(256)), id="every-byte"),
    pytest.param(bytes((i * 7 + i // 256) % 256 for i in range(1 << 20)), id="one-mib"),
]


@pytest.mark.parametrize("payload", PAYLOADS)
async def test_payload_bytes_round_trip(store: EventStore, payload: bytes) -> None:
    events: list[Event] = [
        RunCreated(workflow_name="wf", input=payload, context=payload),
        RunStarted(),
        STEP,
        StepCompleted(step_id="s1", output=payload),
        hook("h", "tok"),
        HookReceived(hook_id="h", payload=payload, delivery_id="d"),
        RunFailed(error=payload),
    ]
    appended = await write(store, "r", *events)

    assert [e.event for e in appended] == events
    assert [e.event for e in await store.read("r")] == events
    assert [e.event for e in await store.read_all()] == events
    assert [e.event for e in await store.read_by_correlation("r", "s1")] == events[2:4]
    loaded = project_run(await store.read("r"))
    assert loaded.input == loaded.context == loaded.error == payload
    assert loaded.steps["s1"].output == payload
    assert loaded.hooks["h"].deliveries[0].payload == payload


EVERY_EVENT_BODY: list[Event] = [
    RunCreated(
        workflow_name="wf",
        input=b"\x00in",
        workflow_version="v1",
        deployment_id="d1",
        context=b"ctx",
        attributes={"k": "v", "$sys": "x"},
        parent_run_id="parent",
        deadline=T0 + timedelta(days=1),
    ),
    RunStarted(),
    ProgressRecorded(progress_id="p1", completed=1, total=3, message="m", details=b"d"),
    ChildLinked(
        reference_id="c1", kind="run", operation_id="op", child_run_id="child", metadata=b"m"
    ),
    LogRecorded(level="warning", message="hi", data=b"x"),
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
    AttributesSet(
        changes=(AttributeChange(key="$sys", value="y"),),
        writer=WorkflowWriter(),
        allow_reserved=True,
    ),
    LogRecorded(level="error", message="step log", step_id="s1"),
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
ENDINGS: list[list[Event]] = [
    [RunCompleted(output=b"out")],
    [RunFailed(error=b"err", error_code="E")],
    [CancelRequested(reason="stop"), RunCancelled(reason="stop")],
    [RunTimedOut(deadline=T0, reason="late")],
]


@pytest.mark.parametrize("ending", ENDINGS, ids=lambda e: e[-1].event_type)
async def test_every_event_type_round_trips(store: EventStore, ending: list[Event]) -> None:
    covered = {type(e) for e in EVERY_EVENT_BODY} | {type(e) for end in ENDINGS for e in end}
    assert covered == set(EVENT_TYPES.values())
    events = EVERY_EVENT_BODY + ending

    await write(store, "r", *events[:7])
    await write(store, "r", *events[7:])

    stored = await store.read("r")
    assert [e.event for e in stored] == events
    assert sequences(stored) == list(range(1, len(events) + 1))
    assert await store.get_runs(["r"]) == [await kernel_summary(store, "r")]


# --- runs: summaries, listing, get_runs ---------------------------------------------------------


async def test_summary_agrees_with_the_kernel_after_every_append(store: EventStore) -> None:
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
    assert (final.created_at, final.updated_at, final.completed_at) == (
        T0,
        T0 + 4 * MINUTE,
        T0 + 4 * MINUTE,
    )
    assert (final.last_sequence, final.parent_run_id, dict(final.attributes)) == (
        5,
        "p",
        {"k": "v"},
    )


async def make_listing_runs(store: EventStore) -> None:
    """p (parent, running, T0-1m); a1 (alpha, running, T0); a2 (alpha, completed, child of p,
    T0+1m); b1 (beta, running, child of p, T0+2m); b2 (beta, failed, T0+3m)."""
    await write(store, "p", created("parent"), RunStarted(), at=T0 - MINUTE)
    await write(store, "a1", created("alpha"), RunStarted(), at=T0)
    await write(store, "a2", created("alpha", parent_run_id="p"), at=T0 + MINUTE)
    await write(store, "b1", created("beta", parent_run_id="p"), RunStarted(), at=T0 + 2 * MINUTE)
    await write(store, "b2", created("beta"), at=T0 + 3 * MINUTE)
    await write(store, "a2", RunStarted(), RunCompleted(output=b""), at=T0 + 10 * MINUTE)
    await write(store, "b2", RunFailed(error=b""), at=T0 + 11 * MINUTE)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
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
    ],
)
async def test_list_runs_filters_combine(
    store: EventStore, filters: dict[str, Any], expected: list[str]
) -> None:
    await make_listing_runs(store)
    page = await store.list_runs(**filters)
    assert [s.run_id for s in page.items] == expected
    assert (page.cursor, page.has_more) == (None, False)
    assert list(page.items) == [await kernel_summary(store, run_id) for run_id in expected]


async def test_list_runs_on_an_empty_store(store: EventStore) -> None:
    page = await store.list_runs()
    assert (page.items, page.cursor, page.has_more) == ((), None, False)


async def make_many_runs(store: EventStore, count: int) -> list[str]:
    """`count` runs, four per `created_at` (ties broken by run id), alternating workflows,
    written out of order; returns their ids newest first."""
    order = sorted(range(count), key=lambda i: (i * 7) % count)
    for i in order:
        workflow = "even" if i % 2 == 0 else "odd"
        await write(store, f"run-{i:03d}", created(workflow), at=T0 + (i // 4) * MINUTE)
    return [f"run-{i:03d}" for i in sorted(range(count), key=lambda i: (i // 4, i), reverse=True)]


@pytest.mark.parametrize(
    ("filters", "limit"),
    [
        ({}, 1),
        ({}, 3),
        ({}, 5),
        ({}, 23),
        ({}, 50),
        ({"workflow_name": "even"}, 2),
        ({"workflow_name": "odd", "created_before": T0 + 4 * MINUTE}, 3),
    ],
)
async def test_list_runs_pagination_visits_every_run_exactly_once(
    store: EventStore, filters: dict[str, Any], limit: int
) -> None:
    newest_first = await make_many_runs(store, 23)
    expected = [
        run_id for run_id in newest_first if run_id in set(await all_run_ids(store, **filters))
    ]
    assert expected and await all_run_ids(store, **filters) == expected

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = await store.list_runs(cursor=cursor, limit=limit, **filters)
        pages += 1
        assert len(page.items) <= limit
        seen.extend(s.run_id for s in page.items)
        assert page.has_more == (len(seen) < len(expected))
        if not page.has_more:
            assert page.cursor is None
            break
        assert page.cursor is not None and len(page.items) == limit
        cursor = page.cursor
        assert pages <= len(expected)

    assert seen == expected
    assert pages == max(1, -(-len(expected) // limit))


async def test_list_runs_cursor_is_stable_when_newer_runs_arrive(store: EventStore) -> None:
    newest_first = await make_many_runs(store, 8)
    first = await store.list_runs(limit=3)
    await write(store, "zz-newest", created(), at=T0 + HOUR)
    await write(store, "run-000", RunStarted(), at=T0 + HOUR)  # an update does not move a run
    rest = await store.list_runs(cursor=first.cursor, limit=100)
    assert [s.run_id for s in first.items + rest.items] == newest_first
    assert [s.run_id for s in (await store.list_runs(limit=1)).items] == ["zz-newest"]


async def test_list_runs_default_limit_is_twenty(store: EventStore) -> None:
    newest_first = await make_many_runs(store, 21)
    page = await store.list_runs()
    assert [s.run_id for s in page.items] == newest_first[:20]
    assert page.has_more


async def test_get_runs_keeps_order_duplicates_and_unknowns(store: EventStore) -> None:
    await make_listing_runs(store)
    a1, b2 = await kernel_summary(store, "a1"), await kernel_summary(store, "b2")
    assert await store.get_runs(["b2", "zz", "a1", "b2"]) == [b2, None, a1, b2]
    assert await store.get_runs([]) == []
    assert await store.get_runs(["x", "y"]) == [None, None]


# --- hooks and tokens ---------------------------------------------------------------------------


async def test_find_hook_returns_the_live_holder(store: EventStore) -> None:
    await write(store, "a", created(), RunStarted(), hook("h1", "tok-1"), hook("h2", "tok-2"))
    assert await store.find_hook("tok-1", now=T0) == HookHolder(
        run_id="a", hook_id="h1", retained_until=None
    )
    assert await store.find_hook("tok-2", now=T0 + timedelta(days=400)) == HookHolder(
        run_id="a", hook_id="h2", retained_until=None
    )
    assert await store.find_hook("tok-3", now=T0) is None
    # The run's own further appends keep its claims.
    await write(store, "a", log(), at=T0 + MINUTE)
    assert (await store.find_hook("tok-1", now=T0)) is not None


RELEASES: list[Any] = [
    pytest.param([HookDisposed(hook_id="h")], id="disposed"),
    pytest.param([RunCompleted(output=b"")], id="run-completed"),
    pytest.param([RunFailed(error=b"")], id="run-failed"),
    pytest.param([CancelRequested()], id="cancel-requested"),
    pytest.param([CancelRequested(), RunCancelled()], id="run-cancelled"),
    pytest.param([RunTimedOut(deadline=T0)], id="run-timed-out"),
]


@pytest.mark.parametrize("release", RELEASES)
async def test_released_token_is_free(store: EventStore, release: list[Event]) -> None:
    await write(store, "a", created(), RunStarted(), hook("h", "tok"))
    await write(store, "a", *release, at=T0 + MINUTE)

    assert await store.find_hook("tok", now=T0 + MINUTE) is None
    assert (await store.list_hooks(now=T0 + MINUTE)).items == ()
    await write(store, "b", created(), RunStarted(), hook("hb", "tok"), at=T0 + 2 * MINUTE)
    assert await store.find_hook("tok", now=T0 + 2 * MINUTE) == HookHolder(
        run_id="b", hook_id="hb", retained_until=None
    )


async def test_retained_hook_holds_its_token_until_retained_until(store: EventStore) -> None:
    until = T0 + HOUR
    await write(store, "a", created(), RunStarted(), hook("h", "tok", until))
    live = HookHolder(run_id="a", hook_id="h", retained_until=None)
    assert await store.find_hook("tok", now=T0) == live
    await write(store, "a", RunCompleted(output=b""), at=T0 + MINUTE)

    retained = HookHolder(run_id="a", hook_id="h", retained_until=until)
    for now in (T0 + MINUTE, until - timedelta(microseconds=1)):
        assert await store.find_hook("tok", now=now) == retained
        assert (await store.list_hooks(now=now)).items == (retained,)
    for now in (until + timedelta(microseconds=1), until + timedelta(days=1)):
        assert await store.find_hook("tok", now=now) is None
        assert (await store.list_hooks(now=now)).items == ()


@pytest.mark.parametrize(
    ("holder_events", "claim_at"),
    [
        pytest.param([], T0 + MINUTE, id="live-holder"),
        pytest.param([], T0 + timedelta(days=30), id="live-holder-long-after"),
        pytest.param([RunCompleted(output=b"")], T0 + 30 * MINUTE, id="retained-holder"),
    ],
)
@pytest.mark.parametrize("claimant_exists", [False, True])
async def test_token_conflict_across_runs_writes_nothing(
    store: EventStore, holder_events: list[Event], claim_at: datetime, claimant_exists: bool
) -> None:
    await write(store, "a", created(), RunStarted(), hook("ha", "s3cret", T0 + HOUR))
    if holder_events:
        await write(store, "a", *holder_events)
    if claimant_exists:
        await write(store, "b", created(), RunStarted(), at=T0 + MINUTE)
    before = await everything(store, ["a", "b"])
    history = await store.read("b")
    head = len(history)
    events: list[Event] = [log(), hook("hb1", "free"), hook("hb2", "s3cret")]
    if not claimant_exists:
        events = [created(), RunStarted(), *events]
    index = index_after(history, envelopes_for("b", head, events, claim_at))

    with pytest.raises(TokenConflict) as caught:
        await store.append_if_sequence("b", head, events, index=index, recorded_at=claim_at)

    assert (caught.value.token, caught.value.holder_run_id, caught.value.holder_hook_id) == (
        "s3cret",
        "a",
        "ha",
    )
    assert "s3cret" not in str(caught.value)
    assert await everything(store, ["a", "b"]) == before
    assert await store.find_hook("free", now=claim_at) is None


async def test_expired_retained_holder_gives_way(store: EventStore) -> None:
    until = T0 + HOUR
    await write(store, "a", created(), RunStarted(), hook("ha", "tok", until))
    await write(store, "a", RunCompleted(output=b""), at=T0 + MINUTE)

    await write(store, "b", created(), RunStarted(), hook("hb", "tok"), at=until + MINUTE)

    holder = HookHolder(run_id="b", hook_id="hb", retained_until=None)
    assert await store.find_hook("tok", now=until + MINUTE) == holder
    assert await store.find_hook("tok", now=T0 + MINUTE) == holder  # the old claim is gone
    assert (await store.list_hooks(now=until + MINUTE)).items == (holder,)


async def test_a_run_whose_retention_expired_can_still_append(store: EventStore) -> None:
    """A late step outcome on an ended run re-sends the run's (expired) claim in its index: an
    expired claim holds nothing, so it neither conflicts with nor displaces the new holder."""
    until = T0 + HOUR
    await write(
        store,
        "a",
        created(),
        RunStarted(),
        STEP,
        StepStarted(step_id="s1", attempt=1),
        hook("ha", "tok", until),
    )
    await write(store, "a", RunCompleted(output=b""), at=T0 + MINUTE)
    await write(store, "b", created(), RunStarted(), hook("hb", "tok"), at=until + MINUTE)

    late = await write(store, "a", StepCompleted(step_id="s1", output=b"late"), at=until + HOUR)

    assert sequences(late) == [7]
    holder = HookHolder(run_id="b", hook_id="hb", retained_until=None)
    assert await store.find_hook("tok", now=until + HOUR) == holder
    assert (await store.list_hooks(now=until + HOUR)).items == (holder,)


async def make_hook_runs(store: EventStore) -> list[HookHolder]:
    """r1 holds h1..h3, r2 holds h1 and h2 (h3 disposed), r3 retains h until T0+1h, r4 ended and
    released its hook. Returns the holders live at T0 + 1 minute, by (run_id, hook_id)."""
    await write(store, "r2", created(), RunStarted(), hook("h2", "t-2-2"), hook("h1", "t-2-1"))
    await write(
        store, "r1", created(), RunStarted(), *[hook(f"h{i}", f"t-1-{i}") for i in (3, 1, 2)]
    )
    await write(store, "r2", hook("h3", "t-2-3"), HookDisposed(hook_id="h3"))
    await write(store, "r3", created(), RunStarted(), hook("h", "t-3", T0 + HOUR))
    await write(store, "r3", RunCompleted(output=b""), at=T0 + MINUTE)
    await write(store, "r4", created(), RunStarted(), hook("h", "t-4"))
    await write(store, "r4", RunCompleted(output=b""), at=T0 + MINUTE)
    live = [("r1", "h1"), ("r1", "h2"), ("r1", "h3"), ("r2", "h1"), ("r2", "h2")]
    return [HookHolder(run_id=r, hook_id=h, retained_until=None) for r, h in live] + [
        HookHolder(run_id="r3", hook_id="h", retained_until=T0 + HOUR)
    ]


@pytest.mark.parametrize(
    ("run_id", "limit"),
    [(None, 100), (None, 1), (None, 4), (None, 6), ("r1", 2), ("r1", 3), ("r2", 1), ("r4", 5)],
)
async def test_list_hooks_filter_and_cursor(
    store: EventStore, run_id: str | None, limit: int
) -> None:
    holders = await make_hook_runs(store)
    expected = [h for h in holders if run_id is None or h.run_id == run_id]
    now = T0 + MINUTE

    seen: list[HookHolder] = []
    cursor: str | None = None
    while True:
        page = await store.list_hooks(run_id=run_id, cursor=cursor, limit=limit, now=now)
        assert len(page.items) <= limit
        seen.extend(page.items)
        assert page.has_more == (len(seen) < len(expected))
        if not page.has_more:
            assert page.cursor is None
            break
        assert page.cursor is not None
        cursor = page.cursor

    assert seen == expected


async def test_list_hooks_drops_expired_retention(store: EventStore) -> None:
    holders = await make_hook_runs(store)
    page = await store.list_hooks(now=T0 + 2 * HOUR)
    assert list(page.items) == [h for h in holders if h.run_id != "r3"]


# --- wakeups ------------------------------------------------------------------------------------


def wakeup(run_id: str, kind: Any, subject_id: str, due_at: datetime) -> Wakeup:
    return Wakeup(run_id=run_id, kind=kind, subject_id=subject_id, due_at=due_at)


async def make_wakeup_runs(store: EventStore) -> list[Wakeup]:
    """Wakeups of live runs (oldest first); plus ended runs and finished work that have none."""
    await write(
        store,
        "w",
        created(),
        RunStarted(),
        WaitCreated(wait_id="w1", resume_at=T0 + 10 * MINUTE),
        WaitCreated(wait_id="w2", resume_at=T0 + 5 * MINUTE),
        WaitCreated(wait_id="done", resume_at=T0 + MINUTE),
        WaitCompleted(wait_id="done"),
    )
    await write(
        store,
        "r",
        created(),
        RunStarted(),
        STEP,
        StepStarted(step_id="s1", attempt=1),
        StepRetrying(step_id="s1", error=b"", retry_after=T0 + 7 * MINUTE),
        StepCreated(step_id="s2", step_name="n", input=b""),
        StepStarted(step_id="s2", attempt=1),
        StepRetrying(step_id="s2", error=b"", retry_after=T0 + 2 * MINUTE),
        StepStarted(step_id="s2", attempt=2),  # restarted: no longer a wakeup
    )
    await write(store, "d", created(deadline=T0 + 6 * MINUTE))
    await write(
        store,
        "ended",
        created(deadline=T0 + MINUTE),
        RunStarted(),
        WaitCreated(wait_id="w", resume_at=T0 + MINUTE),
        RunCompleted(output=b""),
    )
    return [
        wakeup("w", "wait", "w2", T0 + 5 * MINUTE),
        wakeup("d", "deadline", "d", T0 + 6 * MINUTE),
        wakeup("r", "retry", "s1", T0 + 7 * MINUTE),
        wakeup("w", "wait", "w1", T0 + 10 * MINUTE),
    ]


@pytest.mark.parametrize(
    ("now", "limit", "count"),
    [
        (T0, 100, 0),
        (T0 + 5 * MINUTE - timedelta(microseconds=1), 100, 0),
        (T0 + 5 * MINUTE, 100, 1),
        (T0 + 6 * MINUTE, 100, 2),
        (T0 + 9 * MINUTE, 100, 3),
        (T0 + HOUR, 100, 4),
        (T0 + HOUR, 2, 2),
        (T0 + HOUR, 0, 0),
    ],
)
async def test_due_wakeups_oldest_first(
    store: EventStore, now: datetime, limit: int, count: int
) -> None:
    expected = await make_wakeup_runs(store)
    assert await store.due_wakeups(now, limit=limit) == expected[:count]
    assert await store.next_wakeup() == expected[0]


async def test_due_wakeups_break_ties_by_run_kind_subject(store: EventStore) -> None:
    at = T0 + MINUTE
    await write(store, "r-b", created(), RunStarted(), WaitCreated(wait_id="w", resume_at=at))
    await write(
        store,
        "r-a",
        created(deadline=at),
        RunStarted(),
        WaitCreated(wait_id="y", resume_at=at),
        WaitCreated(wait_id="x", resume_at=at),
    )
    assert await store.due_wakeups(at) == [
        wakeup("r-a", "deadline", "r-a", at),
        wakeup("r-a", "wait", "x", at),
        wakeup("r-a", "wait", "y", at),
        wakeup("r-b", "wait", "w", at),
    ]


async def test_wakeups_vanish_when_their_run_ends(store: EventStore) -> None:
    assert await store.next_wakeup() is None
    await write(
        store,
        "c",
        created(deadline=T0 + HOUR),
        RunStarted(),
        WaitCreated(wait_id="w", resume_at=T0 + MINUTE),
    )
    await write(
        store, "live", created(), RunStarted(), WaitCreated(wait_id="w", resume_at=T0 + HOUR)
    )
    assert await store.next_wakeup() == wakeup("c", "wait", "w", T0 + MINUTE)
    assert len(await store.due_wakeups(T0 + HOUR)) == 3

    await write(store, "c", RunCompleted(output=b""), at=T0 + 2 * MINUTE)

    assert await store.next_wakeup() == wakeup("live", "wait", "w", T0 + HOUR)
    assert await store.due_wakeups(T0 + HOUR) == [wakeup("live", "wait", "w", T0 + HOUR)]
    await write(store, "live", WaitCompleted(wait_id="w"))
    assert await store.next_wakeup() is None
    assert await store.due_wakeups(T0 + timedelta(days=1)) == []


# --- the global feed ----------------------------------------------------------------------------


async def make_feed(store: EventStore) -> list[Envelope]:
    written: list[Envelope] = []
    for i, run_id in enumerate(["c", "a", "b", "a", "c", "b", "a"]):
        history = await store.read(run_id)
        batch: list[Event] = [created(), RunStarted()]
        if history:
            batch = [log() for _ in range(1 + i % 2)]
        written += await write(store, run_id, *batch, at=T0 + i * MINUTE)
    return written


async def test_read_all_returns_every_envelope_in_position_order(store: EventStore) -> None:
    written = await make_feed(store)
    feed = await store.read_all()
    assert feed == written
    assert len(positions(feed)) == len(written)
    for run_id in "abc":
        assert [e for e in feed if e.run_id == run_id] == await store.read(run_id)


@pytest.mark.parametrize("limit", [1, 2, 5, 1000])
async def test_read_all_pages_by_position(store: EventStore, limit: int) -> None:
    written = await make_feed(store)
    seen: list[Envelope] = []
    after = 0
    while batch := await store.read_all(after_position=after, limit=limit):
        assert len(batch) <= limit
        seen += batch
        last = batch[-1].position
        assert last is not None
        after = last
    assert seen == written


async def test_read_all_after_position(store: EventStore) -> None:
    written = await make_feed(store)
    middle = written[4].position
    last = written[-1].position
    assert middle is not None and last is not None
    assert await store.read_all(after_position=middle) == written[5:]
    assert await store.read_all(after_position=middle, limit=2) == written[5:7]
    assert await store.read_all(after_position=last) == []
    assert await store.read_all(limit=0) == []


# --- retention ----------------------------------------------------------------------------------


CUTOFF = T0 + HOUR


async def make_retention_runs(store: EventStore) -> dict[str, bool]:
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
        await write(store, run_id, created(), RunStarted(), log())
        await write(store, run_id, *ending, at=at)
    await write(store, "live", created(deadline=T0 + HOUR), RunStarted())
    await write(store, "cancelling", created(), RunStarted(), CancelRequested())
    for run_id, until in [("retained", CUTOFF + HOUR), ("retention-over", CUTOFF - MINUTE)]:
        await write(store, run_id, created(), RunStarted(), hook("h", f"tok-{run_id}", until))
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


async def test_delete_runs_removes_only_terminal_runs_ended_before_the_cutoff(
    store: EventStore,
) -> None:
    deletable = await make_retention_runs(store)
    doomed = sorted(r for r, d in deletable.items() if d)
    kept = sorted(r for r, d in deletable.items() if not d)
    kept_state = await run_state(store, kept)
    kept_feed = [e for e in await store.read_all() if e.run_id in kept]

    assert await store.delete_runs(terminal_before=CUTOFF, limit=100) == len(doomed)

    for run_id in doomed:
        assert await store.read(run_id) == []
        assert await store.head(run_id) == 0
        assert await store.read_by_correlation(run_id, "h") == []
    assert await store.get_runs(doomed) == [None] * len(doomed)
    assert sorted(await all_run_ids(store)) == kept
    assert await store.read_all() == kept_feed
    assert await store.find_hook("tok-retention-over", now=T0) is None
    assert await store.find_hook("tok-retained", now=CUTOFF) is not None
    assert await run_state(store, kept) == kept_state
    assert await store.delete_runs(terminal_before=CUTOFF, limit=100) == 0


async def test_delete_runs_honours_limit(store: EventStore) -> None:
    deletable = await make_retention_runs(store)
    total = sum(deletable.values())
    counts = [await store.delete_runs(terminal_before=CUTOFF, limit=2) for _ in range(4)]
    assert counts == [2, 2, total - 4, 0]
    assert sorted(await all_run_ids(store)) == sorted(r for r, d in deletable.items() if not d)


async def test_deleted_run_id_and_token_can_be_reused(store: EventStore) -> None:
    await write(store, "r", created(), RunStarted(), hook("h", "tok", T0 + MINUTE))
    await write(store, "r", RunCompleted(output=b""))
    assert await store.delete_runs(terminal_before=CUTOFF, limit=10) == 1

    again = await write(store, "r", created("second"), at=CUTOFF)
    await write(store, "other", created(), RunStarted(), hook("h", "tok"), at=CUTOFF)

    assert sequences(again) == [1]
    assert [e.event for e in await store.read("r")] == [created("second")]
    assert await store.get_runs(["r"]) == [await kernel_summary(store, "r")]
    assert await store.find_hook("tok", now=CUTOFF) == HookHolder(
        run_id="other", hook_id="h", retained_until=None
    )


# --- lifecycle ----------------------------------------------------------------------------------

CALLS: list[Any] = [
    pytest.param(lambda s: write(s, "new", created()), id="append"),
    pytest.param(lambda s: s.read("r"), id="read"),
    pytest.param(lambda s: s.head("r"), id="head"),
    pytest.param(lambda s: s.read_by_correlation("r", "s"), id="read_by_correlation"),
    pytest.param(lambda s: s.list_runs(), id="list_runs"),
    pytest.param(lambda s: s.get_runs(["r"]), id="get_runs"),
    pytest.param(lambda s: s.find_hook("tok", now=T0), id="find_hook"),
    pytest.param(lambda s: s.list_hooks(now=T0), id="list_hooks"),
    pytest.param(lambda s: s.due_wakeups(T0), id="due_wakeups"),
    pytest.param(lambda s: s.next_wakeup(), id="next_wakeup"),
    pytest.param(lambda s: s.read_all(), id="read_all"),
    pytest.param(lambda s: s.delete_runs(terminal_before=T0, limit=1), id="delete_runs"),
]


@pytest.mark.parametrize("call", CALLS)
async def test_calls_after_close_raise_store_closed(
    store: EventStore, call: Callable[[EventStore], Awaitable[object]]
) -> None:
    await write(store, "r", created(), RunStarted(), hook("h", "tok"))
    await call(store)  # works while open
    await store.close()
    with pytest.raises(StoreClosed):
        await call(store)
    await store.close()  # closing twice is harmless


async def test_store_is_an_async_context_manager(store: EventStore) -> None:
    async with store as entered:
        assert entered is store
        await write(entered, "r", created())
        assert await entered.head("r") == 1
    with pytest.raises(StoreClosed):
        await store.head("r")
