"""Property tests for the kernel's laws (docs/concepts.md, "The laws"; the events and rules of
docs/reference/events-and-commands.md).

Determinism, the split law of `apply`, persistence of snapshots across branches, the closure law
`decide ∘ apply`, "decide raises only rejections", the history laws `project_run` enforces, and
agreement of `run_index` and the snapshot's read-only mappings with the events they came from.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, MutableMapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar, cast

import attrs
import pytest
from hypothesis import example, given, seed, settings
from hypothesis import strategies as st

from runfold.conformance import strategies
from runfold.conformance.strategies import (
    DEFAULT_RUN_ID,
    FOREIGN_RUN_ID,
    HOOK_IDS,
    INVALID_HISTORY_KINDS,
    InvalidHistory,
    commands,
    histories,
    invalid_histories,
    snapshots,
    valid_histories,
)
from runfold.kernel import (
    SPEC_VERSION,
    AttributesSet,
    Cancellation,
    CancelRequested,
    ChildLinked,
    Command,
    CompleteStep,
    CreateHook,
    CreateRun,
    CreateStep,
    CreateWait,
    Decision,
    Delivery,
    DisposeHook,
    Envelope,
    Event,
    FailStep,
    HistoryError,
    HistoryLimitExceeded,
    HookClaim,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookHolder,
    HookReceived,
    HookState,
    InvalidCommand,
    Limits,
    LogRecorded,
    Ownership,
    ProgressRecorded,
    ReceiveHook,
    RecordLog,
    RecordProgress,
    Rejection,
    RetryPolicy,
    RetryStep,
    RunCancelled,
    RunClaimed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunIndex,
    RunNotSupported,
    RunReleased,
    RunStarted,
    RunTimedOut,
    SetAttributes,
    Snapshot,
    StartRun,
    StartStep,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepState,
    TerminalState,
    TimeOutRun,
    TooEarly,
    WaitCompleted,
    WaitCreated,
    WaitState,
    apply,
    decide,
    decode_event,
    encode_event,
    project_run,
    run_index,
)
from runfold.kernel import commands as command_module

T = TypeVar("T")

TERMINAL = ("completed", "failed", "cancelled", "timed_out")
LIVE = ("pending", "running", "cancelling")
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)

holders = st.none() | st.builds(
    HookHolder,
    run_id=st.sampled_from((DEFAULT_RUN_ID, FOREIGN_RUN_ID)),
    hook_id=st.sampled_from(HOOK_IDS),
    retained_until=st.none(),
)
"""What a store could answer for a hook token: nobody, this run, or another run."""

clock_steps = st.sampled_from(
    (timedelta(0), timedelta(seconds=1), timedelta(hours=1), timedelta(days=2), timedelta(days=31))
)
"""How far after a history's last event a command is decided."""


# --- helpers ------------------------------------------------------------------------------------


def envelopes(run_id: str, after: int, events: Sequence[Event], at: datetime) -> list[Envelope]:
    """`events` as the envelopes that follow sequence `after`."""
    return [
        Envelope(run_id=run_id, sequence=after + i, event=event, recorded_at=at)
        for i, event in enumerate(events, start=1)
    ]


def observe(snap: Snapshot) -> dict[str, Any]:
    """Everything observable about a snapshot, as plain values independent of its lineage.

    Mappings are copied into dicts (and their key order kept), so a later change to a shared
    structure cannot hide behind lazy reads; derived views and the index rows are included.
    """
    seen: dict[str, Any] = {}
    for field in attrs.fields(Snapshot):
        value = getattr(snap, field.name)
        if isinstance(value, Mapping):
            seen[field.name] = dict(value)
            seen[field.name + ":order"] = list(value)
        else:
            seen[field.name] = value
    seen["is_terminal"] = snap.is_terminal
    seen["is_live"] = snap.is_live
    seen["is_suspended"] = snap.is_suspended
    seen["open_waits"] = snap.open_waits()
    seen["active_hooks"] = snap.active_hooks()
    seen["wakeups"] = snap.wakeups()
    seen["due_retries"] = (snap.due_retries(snap.updated_at), snap.due_retries(FAR_FUTURE))
    seen["index"] = run_index(snap)
    return seen


def outcome(snap: Snapshot | None, command: Command, **kwargs: Any) -> tuple[Any, ...]:
    """What `decide` did: the decision, or the rejection's class, message, code, status, run."""
    try:
        return ("decided", decide(snap, command, **kwargs))
    except Rejection as exc:
        return ("rejected", type(exc), str(exc), exc.code, exc.status, exc.run_id)


def attempt(snap: Snapshot | None, command: Command, **kwargs: Any) -> Decision | Rejection:
    """`decide`'s decision, or the rejection it raised."""
    try:
        return decide(snap, command, **kwargs)
    except Rejection as exc:
        return exc


def prefixes(history: Sequence[Envelope]) -> list[Snapshot]:
    """`project_run(history[:k])` for k = 1 … len(history), built incrementally."""
    snaps = [project_run(history[:1])]
    for env in history[1:]:
        snaps.append(apply(snaps[-1], [env]))
    return snaps


# --- determinism --------------------------------------------------------------------------------


@given(valid_histories())
def test_project_run_is_deterministic(history: list[Envelope]) -> None:
    first, second = project_run(history), project_run(list(history))
    assert first == second
    assert observe(first) == observe(second)
    assert first.last_sequence == len(history)


@given(
    valid_histories(),
    st.booleans(),
    commands(),
    clock_steps,
    holders,
)
def test_decide_is_deterministic_and_pure(
    history: list[Envelope],
    no_history: bool,
    command: Command,
    step: timedelta,
    holder: HookHolder | None,
) -> None:
    snap = None if no_history else project_run(history)
    before = None if snap is None else observe(snap)
    now = history[-1].recorded_at + step
    first = outcome(snap, command, now=now, token_holder=holder, run_id=DEFAULT_RUN_ID)
    second = outcome(snap, command, now=now, token_holder=holder, run_id=DEFAULT_RUN_ID)
    assert first == second
    if snap is not None:
        assert observe(snap) == before, "decide changed the snapshot it was given"
    if first[0] == "decided":
        decision: Decision = first[1]
        assert decision.idempotent == (not decision.events)


# --- the split law and persistence --------------------------------------------------------------


@given(valid_histories())
def test_apply_split_law_at_every_cut(history: list[Envelope]) -> None:
    whole = observe(project_run(history))
    for k in range(1, len(history) + 1):
        older = project_run(history[:k])
        assert observe(apply(older, history[k:])) == whole, f"split at {k}"
    assert observe(apply(project_run(history), [])) == whole


@given(valid_histories(), st.data())
def test_apply_over_chained_chunks(history: list[Envelope], data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(1, len(history)), max_size=6, unique=True).map(sorted))
    cuts = [*cuts, len(history)]
    snap = project_run(history[: cuts[0]])
    for start, end in itertools.pairwise(cuts):
        snap = apply(snap, history[start:end])
        assert observe(snap) == observe(project_run(history[:end])), f"chunk {start}:{end}"
    assert observe(snap) == observe(project_run(history))


@given(valid_histories())
def test_folds_going_on_one_from_another_change_no_snapshot_before(
    history: list[Envelope],
) -> None:
    # Each apply goes on from the snapshot the one before froze, with that fold's own builder
    # (the spare): what it changes next must never show in a snapshot already published.
    snaps = [project_run(history[:1])]
    seen = [observe(snaps[0])]
    for env in history[1:]:
        snaps.append(apply(snaps[-1], [env]))
        seen.append(observe(snaps[-1]))
    for k, (snap, was) in enumerate(zip(snaps, seen, strict=True), start=1):
        assert observe(snap) == was, f"the snapshot at {k} changed"
    assert observe(snaps[-1]) == observe(project_run(history))


@given(valid_histories(), valid_histories())
def test_folds_of_runs_taking_turns_change_no_snapshot_before(
    first: list[Envelope], second: list[Envelope]
) -> None:
    # Two runs folded an event at a time in turns, as an engine drives many runs at once: a
    # fold finds the spare builder holding the other run's snapshot and starts one of its own,
    # and no published snapshot of either changes.
    lines = [[project_run(first[:1])], [project_run(second[:1])]]
    seen = [[observe(lines[0][0])], [observe(lines[1][0])]]
    for k in range(1, max(len(first), len(second))):
        for history, snaps, was in zip((first, second), lines, seen, strict=True):
            if k < len(history):
                snaps.append(apply(snaps[-1], [history[k]]))
                was.append(observe(snaps[-1]))
    for snaps, was in zip(lines, seen, strict=True):
        assert [observe(snap) for snap in snaps] == was
    assert observe(lines[0][-1]) == observe(project_run(first))
    assert observe(lines[1][-1]) == observe(project_run(second))


@given(valid_histories(), st.data())
def test_branches_from_one_snapshot_are_independent(
    history: list[Envelope], data: st.DataObject
) -> None:
    n = len(history)
    k = data.draw(st.integers(1, n), label="cut")
    j = data.draw(st.integers(k, n), label="second branch end")
    older = project_run(history[:k])
    older_seen = observe(older)

    # Branch 1: the real continuation. Branch 2: part of it. Branch 3: a different future.
    first = apply(older, history[k:])
    second = apply(older, history[k:j])
    now = history[k - 1].recorded_at + data.draw(clock_steps)
    alternative: list[Envelope] = []
    for command in data.draw(st.lists(commands(), min_size=1, max_size=4), label="commands"):
        try:
            decided = decide(older, command, now=now)
        except Rejection:
            continue
        if decided.events:
            alternative = envelopes(older.run_id, k, decided.events, now)
            break
    third = apply(older, alternative)

    # A failed apply from the same snapshot must not disturb anything either.
    broken = envelopes(older.run_id, k + 1, [RunStarted()], now)
    with pytest.raises(HistoryError):
        apply(older, broken)

    # Move the first lineage further on, then check every branch again.
    fourth = apply(first, [])
    if first.is_live:
        extra = decide(first, StartRun(), now=history[-1].recorded_at).events or (
            LogRecorded(level="info", message="more"),
        )
        fourth = apply(first, envelopes(first.run_id, n, extra, history[-1].recorded_at))
        assert observe(fourth) == observe(
            project_run(history + envelopes(first.run_id, n, extra, history[-1].recorded_at))
        )

    assert observe(older) == older_seen, "the older snapshot changed"
    assert observe(first) == observe(project_run(history))
    assert observe(second) == observe(project_run(history[:j]))
    assert observe(third) == observe(project_run(history[:k] + alternative))
    assert observe(apply(older, history[k:])) == observe(project_run(history))


# --- the closure law ----------------------------------------------------------------------------


def check_closure(
    history: list[Envelope],
    snap: Snapshot | None,
    command: Command,
    now: datetime,
    holder: HookHolder | None,
) -> Decision | None:
    """Decide `command` on `snap` (the projection of `history`); if it is accepted, the history
    with the decided events must project, to what `apply` gives, and the events must survive
    the wire format."""
    try:
        decision = decide(snap, command, now=now, token_holder=holder, run_id=DEFAULT_RUN_ID)
    except Rejection:
        return None
    assert decision.idempotent == (not decision.events)
    if not decision.events:
        return decision
    new = envelopes(DEFAULT_RUN_ID, len(history), decision.events, now)
    projected = project_run(history + new)  # must not raise: the closure law
    if snap is not None:
        assert observe(apply(snap, new)) == observe(projected)
    for event in decision.events:
        assert decode_event(*encode_event(event)) == event
    return decision


@given(
    valid_histories(),
    st.lists(commands(), min_size=1, max_size=3),
    st.lists(holders, min_size=3, max_size=3),
    clock_steps,
)
def test_closure_on_every_reachable_snapshot(
    history: list[Envelope],
    batch: list[Command],
    holder_choices: list[HookHolder | None],
    step: timedelta,
) -> None:
    for k, snap in enumerate(prefixes(history), start=1):
        now = history[k - 1].recorded_at + step
        for command, holder in zip(batch, holder_choices, strict=False):
            check_closure(history[:k], snap, command, now, holder)


@given(commands(), holders)
def test_closure_from_no_history(command: Command, holder: HookHolder | None) -> None:
    decision = check_closure([], None, command, strategies.START, holder)
    if decision is not None and decision.events:
        assert isinstance(decision.events[0], RunCreated)
        assert isinstance(command, CreateRun | StartRun)


# --- decide raises only rejections --------------------------------------------------------------

any_now = st.sampled_from(
    [
        *[clock_steps.map(strategies.START.__add__)] * 6,
        st.datetimes(
            timezones=st.sampled_from(
                (UTC, timezone(timedelta(hours=14)), timezone(timedelta(hours=-12)))
            )
        ),
        st.sampled_from((datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))),
        st.datetimes(),  # naive: refused
        st.sampled_from((None, 0, "2026-01-01T00:00:00Z")),  # not a datetime: refused
    ]
).flatmap(lambda strategy: strategy)
"""Clock readings: mostly plausible ones, sometimes anything (aware, at the ends of the range,
naive, not a datetime)."""


COMMAND_CLASSES: list[type[Command]] = sorted(
    (
        cls
        for cls in (getattr(command_module, name) for name in command_module.__all__)
        if isinstance(cls, type) and issubclass(cls, Command) and cls is not Command
    ),
    key=lambda cls: cls.__name__,
)
"""Every command class (docs/reference/events-and-commands.md, "Commands")."""

per_class = settings(max_examples=max(settings().max_examples // 3, 10))
"""Properties run once per command class get a share of the profile's examples each."""


@pytest.mark.parametrize("command_class", COMMAND_CLASSES, ids=lambda cls: cls.__name__)
@per_class
@given(st.none() | snapshots(max_commands=20), any_now, holders, st.data())
def test_decide_raises_only_rejections(
    command_class: type[Command],
    snap: Snapshot | None,
    now: Any,
    holder: HookHolder | None,
    data: st.DataObject,
) -> None:
    """Whatever the command's fields hold (wrong types included) and whatever `now` is."""
    command = data.draw(commands(malformed=True, types=[command_class]), label="command")
    result = attempt(snap, command, now=now, token_holder=holder, run_id=DEFAULT_RUN_ID)
    if isinstance(result, Decision):
        assert all(isinstance(event, Event) for event in result.events)
        return
    assert result.code and isinstance(result.code, str)
    assert 400 <= result.status < 500
    assert str(result)
    assert result.run_id == (DEFAULT_RUN_ID if snap is None else snap.run_id)
    if isinstance(result, TerminalState):
        assert "terminal state" in str(result) or "cancelling run ends" in str(result)
    if isinstance(result, TooEarly):
        assert result.retry_after > now


def broken(instance: T, **fields: Any) -> T:
    """`instance` with `fields` set past the type hints and converters, as a caller ignoring them
    (or a deserializer) would hand it over."""
    for name, value in fields.items():
        object.__setattr__(instance, name, value)
    return instance


MALFORMED = [
    broken(CreateRun(workflow_name="wf", input=b""), attributes=True),
    broken(CreateRun(workflow_name="wf", input=b""), attributes=[("k", "v")]),
    broken(CreateRun(workflow_name="wf", input=b""), attributes={1: "v"}),
    broken(CreateRun(workflow_name="wf", input=b""), input="text"),
    broken(CreateRun(workflow_name="wf", input=b""), deadline=datetime(2026, 1, 1)),
    broken(StartRun(), create=broken(CreateRun(workflow_name="wf", input=b""), attributes=0)),
    broken(StartRun(), create="wf"),
    broken(SetAttributes(changes=()), changes=5),
    broken(SetAttributes(changes=()), changes=None),
    broken(SetAttributes(changes=()), changes=("k",)),
    broken(SetAttributes(changes=()), writer="workflow"),
    broken(SetAttributes(changes={"k": "v"}), allow_reserved=1),
    broken(RecordLog(level="info", message="m"), level=[]),
    broken(RecordLog(level="info", message="m"), message=b"m"),
    broken(RecordProgress(progress_id="p", completed=1), completed=True),
    broken(RecordProgress(progress_id="p", completed=1), total=2.0),
    broken(StartStep(step_id="s0"), lazy={"step_name": "x"}),
    broken(CreateStep(step_id="s0", step_name="n", input=b""), retry={"max_attempts": 2}),
    broken(
        CreateStep(step_id="s0", step_name="n", input=b""),
        retry=broken(RetryPolicy(), max_attempts="3"),
    ),
    broken(
        CreateStep(step_id="s0", step_name="n", input=b""),
        retry=broken(RetryPolicy(), non_retryable_error_codes=None),
    ),
    broken(CompleteStep(step_id="s0", output=b""), step_id=["s0"]),
    broken(FailStep(step_id="s0", error=b""), retryable="yes"),
    broken(RetryStep(step_id="s0", error=b""), retry_after="soon"),
    broken(CreateWait(wait_id="w0", resume_at=strategies.START), resume_at=0),
    broken(CreateHook(hook_id="h0", token="t"), token=None),
    broken(CreateHook(hook_id="h0", token="t"), retain_token_until=datetime(2026, 1, 2)),
    broken(ReceiveHook(hook_id="h0", payload=b""), delivery_id=7),
    broken(DisposeHook(hook_id="h0"), hook_id=None),
    broken(TimeOutRun(deadline=strategies.START), deadline=None),
]
"""Commands with one field of the wrong type, one per kind of check `decide` must not crash in."""


@pytest.mark.parametrize("command", MALFORMED, ids=lambda c: type(c).__name__)
@settings(max_examples=10)  # the fields are checked before any rule: a few snapshots suffice
@given(st.none() | snapshots(max_commands=10))
def test_malformed_commands_are_invalid(command: Command, snap: Snapshot | None) -> None:
    with pytest.raises(InvalidCommand):
        decide(snap, command, now=strategies.START, run_id=DEFAULT_RUN_ID)


ends_of_time = st.sampled_from(
    (
        datetime.min.replace(tzinfo=UTC),
        datetime.max.replace(tzinfo=UTC),
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-12))),
        datetime.min.replace(tzinfo=timezone(timedelta(hours=14))),
    )
)


@example(
    snap=None,
    command=CreateHook(hook_id="h0", token="tok-0", retain_token_until=strategies.START),
    now=datetime.max.replace(tzinfo=UTC),
)
@example(
    snap=None,
    command=StartRun(
        create=CreateRun(
            workflow_name="wf",
            input=b"",
            deadline=datetime.max.replace(tzinfo=timezone(timedelta(hours=-8))),
        )
    ),
    now=strategies.START,
)
@given(
    st.none() | snapshots(), commands(), ends_of_time | clock_steps.map(strategies.START.__add__)
)
def test_decide_at_the_ends_of_time(snap: Snapshot | None, command: Command, now: datetime) -> None:
    """Clock readings and command times at the ends of the datetime range: still only
    rejections, and every accepted event survives the wire format (its UTC instant exists)."""
    try:
        decision = decide(snap, command, now=now, run_id=DEFAULT_RUN_ID)
    except Rejection:
        return
    for event in decision.events:
        assert decode_event(*encode_event(event)) == event


@given(snapshots(), commands())
def test_runs_of_a_newer_spec_are_refused(snap: Snapshot, command: Command) -> None:
    newer = attrs.evolve(snap, spec_version=SPEC_VERSION + 1)
    with pytest.raises(RunNotSupported) as raised:
        decide(newer, command, now=strategies.START)
    assert f"requires spec version {SPEC_VERSION + 1}" in str(raised.value)
    assert f"runfold supports {SPEC_VERSION}" in str(raised.value)


@given(valid_histories(max_commands=10))
def test_histories_of_a_newer_spec_are_refused(history: list[Envelope]) -> None:
    created = history[0].event
    assert isinstance(created, RunCreated)
    newer = attrs.evolve(history[0], event=attrs.evolve(created, spec_version=SPEC_VERSION + 1))
    with pytest.raises(RunNotSupported):
        project_run([newer, *history[1:]])


@given(valid_histories(), commands(), st.integers(0, 2), clock_steps)
def test_history_limit(
    history: list[Envelope], command: Command, room: int, step: timedelta
) -> None:
    """A tight `max_events_per_run` changes a decision only by refusing what would pass it (a
    command that ends the run may always add one more event)."""
    snap = project_run(history)
    now = history[-1].recorded_at + step
    limits = Limits(max_events_per_run=snap.last_sequence + room)
    free = outcome(snap, command, now=now)
    tight = outcome(snap, command, now=now, limits=limits)
    if free[0] == "rejected":
        assert tight == free
        return
    events = free[1].events
    allowed = limits.max_events_per_run + (1 if command.ends_run else 0)
    if snap.last_sequence + len(events) <= allowed:
        assert tight == free
    else:
        assert tight[0] == "rejected"
        assert tight[1] is HistoryLimitExceeded


# --- the history laws ---------------------------------------------------------------------------


@settings(max_examples=max(settings().max_examples // 2, 10))
@given(invalid_histories())
def test_invalid_histories_name_the_offending_sequence(bad: InvalidHistory) -> None:
    with pytest.raises(HistoryError) as raised:
        project_run(bad.history)
    assert raised.value.sequence == bad.sequence, (bad.kind, raised.value)
    assert raised.value.run_id == bad.run_id
    assert f"sequence {bad.sequence}" in str(raised.value)
    # Catching a cached snapshot up over the defect names the same sequence.
    for k in range(1, bad.sequence):
        with pytest.raises(HistoryError) as caught_up:
            apply(project_run(bad.history[:k]), bad.history[k:])
        assert caught_up.value.sequence == bad.sequence, (bad.kind, k, caught_up.value)


@pytest.mark.parametrize("kind", INVALID_HISTORY_KINDS)
def test_invalid_histories_reach_every_kind(kind: Any) -> None:
    seen: set[str] = set()

    @settings(max_examples=20)
    @given(invalid_histories(kinds=(kind,)))
    def collect(bad: InvalidHistory) -> None:
        seen.add(bad.kind)
        with pytest.raises(HistoryError):
            project_run(bad.history)

    collect()
    assert kind in seen


def test_empty_history() -> None:
    with pytest.raises(HistoryError) as raised:
        project_run([])
    assert (raised.value.run_id, raised.value.sequence) == (None, 0)


@given(histories())
def test_histories_project_or_raise_history_error(history: list[Envelope]) -> None:
    try:
        snap: Snapshot | HistoryError = project_run(history)
    except HistoryError as exc:
        snap = exc
    if isinstance(snap, HistoryError):
        assert 0 <= snap.sequence <= len(history) + 1
    else:
        assert snap.last_sequence == len(history)


# --- run_index ----------------------------------------------------------------------------------


@given(snapshots())
def test_run_index_agrees_with_the_snapshot(snap: Snapshot) -> None:
    index = run_index(snap)
    summary = index.summary
    assert summary.run_id == snap.run_id
    assert summary.workflow_name == snap.workflow_name
    assert summary.status == snap.status
    assert summary.parent_run_id == snap.parent_run_id
    assert summary.created_at == snap.created_at
    assert summary.updated_at == snap.updated_at
    assert summary.completed_at == snap.completed_at
    assert summary.last_sequence == snap.last_sequence
    assert dict(summary.attributes) == dict(snap.attributes)

    active = [hook for hook in snap.hooks.values() if hook.status == "active"]
    claims = {(c.token, c.hook_id, c.retained_until) for c in index.hooks}
    if snap.status in LIVE:
        assert claims == {(h.token, h.hook_id, None) for h in active}
    else:
        assert claims == {
            (h.token, h.hook_id, h.retain_token_until)
            for h in active
            if h.retain_token_until is not None
        }
    assert len({c.token for c in index.hooks}) == len(index.hooks), "a token claimed twice"

    expected: list[tuple[str, str, datetime]] = []
    if snap.status in LIVE:
        expected += [
            ("wait", w.wait_id, w.resume_at) for w in snap.waits.values() if w.status == "waiting"
        ]
        expected += [
            ("retry", s.step_id, s.retry_after)
            for s in snap.steps.values()
            if s.status == "pending" and s.retry_after is not None
        ]
        if snap.deadline is not None:
            expected.append(("deadline", snap.run_id, snap.deadline))
        if snap.ready_at is not None:  # input for the fleet (the naive replay checks the time)
            expected.append(("ready", snap.run_id, snap.ready_at))
    found = [(w.kind, w.subject_id, w.due_at) for w in index.wakeups]
    assert sorted(found, key=repr) == sorted(expected, key=repr)
    assert all(w.run_id == snap.run_id for w in index.wakeups)
    assert [w.due_at for w in index.wakeups] == sorted(w.due_at for w in index.wakeups)
    assert run_index(snap) == index


@given(snapshots(), st.integers(min_value=-2, max_value=2))
def test_claims_at_are_the_claims_whose_retention_has_not_passed(snap: Snapshot, days: int) -> None:
    index = run_index(snap)
    moment = snap.updated_at + timedelta(days=days)
    expected = [c for c in index.hooks if c.retained_until is None or c.retained_until > moment]
    assert list(index.claims_at(moment)) == expected
    assert all(c.holds_at(moment) for c in expected)


def test_claims_at_keeps_the_last_claim_of_a_token_and_drops_expired_ones() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    created = RunCreated(workflow_name="wf", input=b"")
    first_event = Envelope(run_id="r", sequence=1, event=created, recorded_at=at)
    summary = run_index(project_run([first_event])).summary
    first = HookClaim(token="t", hook_id="first", retained_until=None)
    last = HookClaim(token="t", hook_id="last", retained_until=at + timedelta(seconds=1))
    expired = HookClaim(token="u", hook_id="gone", retained_until=at)
    index = RunIndex(summary=summary, hooks=(first, expired, last), wakeups=())
    assert index.claims_at(at) == (last,)
    assert index.claims_at(at + timedelta(seconds=1)) == (first,)
    assert index.claims_at(at - timedelta(seconds=1)) == (last, expired)


# --- the snapshot's mappings --------------------------------------------------------------------


def model(history: Sequence[Envelope]) -> dict[str, Any]:
    """A second, naive reducer written from the events' reference (docs/reference/
    events-and-commands.md), to compare `project_run` with."""
    created = history[0].event
    assert isinstance(created, RunCreated)
    run: dict[str, Any] = {
        "status": "pending",
        "started_at": None,
        "completed_at": None,
        "output": None,
        "error": None,
        "error_code": None,
        "cancellation": None,
        "log_count": 0,
        "last_sequence": len(history),
        "created_at": history[0].recorded_at,
        "updated_at": history[-1].recorded_at,
        "workflow_name": created.workflow_name,
        "input": created.input,
        "deadline": created.deadline,
        "parent_run_id": created.parent_run_id,
        "owner": None,
        "owner_epoch": 0,
        "ready_at": None,
    }
    attributes = dict(created.attributes)

    def note_input(at: datetime) -> None:  # outside input for the fleet, once released
        if run["owner"] is None and run["owner_epoch"] > 0 and run["ready_at"] is None:
            run["ready_at"] = at

    steps: dict[str, StepState] = {}
    waits: dict[str, WaitState] = {}
    hooks: dict[str, HookState] = {}
    progress: dict[str, ProgressRecorded] = {}
    children: dict[str, ChildLinked] = {}
    write_ids: dict[str, int] = {}
    log_ids: dict[str, int] = {}
    for env in history[1:]:
        ev, at = env.event, env.recorded_at
        if isinstance(ev, RunStarted):
            run.update(status="running", started_at=at)
        elif isinstance(ev, RunCompleted):
            run.update(status="completed", output=ev.output, completed_at=at)
        elif isinstance(ev, RunFailed):
            run.update(status="failed", error=ev.error, error_code=ev.error_code, completed_at=at)
        elif isinstance(ev, RunCancelled):
            run.update(status="cancelled", completed_at=at)
        elif isinstance(ev, RunTimedOut):
            run.update(status="timed_out", completed_at=at)
        elif isinstance(ev, CancelRequested):
            run["status"] = "cancelling"
            run["cancellation"] = Cancellation(
                reason=ev.reason, requested_at=at, sequence=env.sequence
            )
            note_input(at)
            for key, step in steps.items():
                if step.status in ("pending", "running"):
                    steps[key] = attrs.evolve(
                        step, status="cancelled", completed_at=at, updated_at=at
                    )
            for key, wait in waits.items():
                if wait.status == "waiting":
                    waits[key] = attrs.evolve(wait, status="cancelled", completed_at=at)
            for key, hook in hooks.items():
                if hook.status == "active":
                    hooks[key] = attrs.evolve(hook, status="cancelled")
        elif isinstance(ev, AttributesSet):
            for change in ev.changes:
                if change.value is None:
                    attributes.pop(change.key, None)
                else:
                    attributes[change.key] = change.value
            if ev.write_id is not None:
                write_ids[ev.write_id] = env.sequence
        elif isinstance(ev, ProgressRecorded):
            progress[ev.progress_id] = ev
        elif isinstance(ev, ChildLinked):
            children[ev.reference_id] = ev
        elif isinstance(ev, LogRecorded):
            run["log_count"] += 1
            if ev.log_id is not None:
                log_ids[ev.log_id] = env.sequence
        elif isinstance(ev, StepCreated):
            steps[ev.step_id] = StepState(
                step_id=ev.step_id,
                step_name=ev.step_name,
                status="pending",
                input=ev.input,
                retry=ev.retry,
                attempt=0,
                output=None,
                error=None,
                retry_after=None,
                created_at=at,
                started_at=None,
                completed_at=None,
                updated_at=at,
            )
        elif isinstance(ev, StepStarted):
            step = steps[ev.step_id]
            steps[ev.step_id] = attrs.evolve(
                step,
                status="running",
                attempt=ev.attempt,
                retry=ev.retry if ev.retry is not None else step.retry,  # a changed policy
                started_at=step.started_at or at,
                retry_after=None,
                updated_at=at,
                start_id=ev.start_id,  # the start that began the latest attempt
            )
        elif isinstance(ev, StepCompleted | StepFailed | StepCancelled):
            step = steps[ev.step_id]
            if isinstance(ev, StepCompleted):
                step = attrs.evolve(step, status="completed", output=ev.output)
            elif isinstance(ev, StepFailed):
                step = attrs.evolve(step, status="failed", error=ev.error)
            else:
                step = attrs.evolve(step, status="cancelled")
            steps[ev.step_id] = attrs.evolve(step, completed_at=at, updated_at=at)
        elif isinstance(ev, StepRetrying):
            steps[ev.step_id] = attrs.evolve(
                steps[ev.step_id],
                status="pending",
                error=ev.error,
                retry_after=ev.retry_after,
                updated_at=at,
            )
        elif isinstance(ev, WaitCreated):
            waits[ev.wait_id] = WaitState(
                wait_id=ev.wait_id,
                status="waiting",
                resume_at=ev.resume_at,
                created_at=at,
                completed_at=None,
            )
        elif isinstance(ev, WaitCompleted):
            waits[ev.wait_id] = attrs.evolve(waits[ev.wait_id], status="completed", completed_at=at)
        elif isinstance(ev, HookCreated):
            hooks[ev.hook_id] = HookState(
                hook_id=ev.hook_id,
                token=ev.token,
                status="active",
                metadata=ev.metadata,
                is_webhook=ev.is_webhook,
                retain_token_until=ev.retain_token_until,
                created_at=at,
                deliveries=(),
            )
        elif isinstance(ev, HookReceived):
            hook = hooks[ev.hook_id]
            delivery = Delivery(
                sequence=env.sequence,
                delivery_id=ev.delivery_id,
                payload=ev.payload,
                received_at=at,
            )
            hooks[ev.hook_id] = attrs.evolve(hook, deliveries=(*hook.deliveries, delivery))
            note_input(at)
        elif isinstance(ev, HookDisposed):
            hooks[ev.hook_id] = attrs.evolve(hooks[ev.hook_id], status="disposed")
        elif isinstance(ev, RunClaimed):
            run["owner"] = Ownership(owner_id=ev.owner_id, epoch=ev.epoch, claimed_at=at)
            run["owner_epoch"] = ev.epoch
            run["ready_at"] = None
        elif isinstance(ev, RunReleased):
            run["owner"] = None
        else:
            assert isinstance(ev, HookConflict), ev
    return {
        "run": run,
        "attributes": attributes,
        "steps": steps,
        "waits": waits,
        "hooks": hooks,
        "progress": progress,
        "children": children,
        "attribute_write_ids": write_ids,
        "log_ids": log_ids,
    }


def check_read_only(mapping: Mapping[str, Any]) -> None:
    """`mapping` is a consistent mapping that refuses every write."""
    assert isinstance(mapping, Mapping)
    assert not isinstance(mapping, MutableMapping)
    writable: Any = mapping
    with pytest.raises(TypeError):
        writable["new-key"] = "value"
    for key in list(mapping)[:1]:
        with pytest.raises(TypeError):
            del writable[key]
    for name in ("pop", "update", "clear", "setdefault", "popitem"):
        assert not hasattr(mapping, name), name
    keys = list(mapping)
    assert len(keys) == len(mapping) == len(set(keys))
    assert list(mapping.keys()) == keys
    assert list(mapping.items()) == [(key, mapping[key]) for key in keys]
    assert list(mapping.values()) == [mapping[key] for key in keys]
    assert all(key in mapping for key in keys)
    assert "no such key" not in mapping
    assert 1 not in cast(Mapping[Any, Any], mapping)
    assert mapping.get("no such key") is None
    with pytest.raises(KeyError):
        mapping["no such key"]


@given(valid_histories())
def test_snapshot_agrees_with_a_naive_replay(history: list[Envelope]) -> None:
    snap = project_run(history)
    expected = model(history)
    for name, value in expected["run"].items():
        assert getattr(snap, name) == value, name
    for name in ("attributes", "steps", "waits", "hooks", "progress", "children"):
        assert dict(getattr(snap, name)) == expected[name], name
        assert list(getattr(snap, name)) == list(expected[name]), f"{name} order"
    assert dict(snap.attribute_write_ids) == expected["attribute_write_ids"]
    assert dict(snap.log_ids) == expected["log_ids"]


@given(valid_histories())
def test_snapshot_mappings_are_read_only_and_consistent(history: list[Envelope]) -> None:
    snap = project_run(history)
    for mapping in (
        snap.attributes,
        snap.steps,
        snap.waits,
        snap.hooks,
        snap.progress,
        snap.children,
        snap.attribute_write_ids,
        snap.log_ids,
    ):
        check_read_only(mapping)
    assert all(key == state.step_id for key, state in snap.steps.items())
    assert all(key == state.wait_id for key, state in snap.waits.items())
    assert all(key == state.hook_id for key, state in snap.hooks.items())
    assert all(key == event.progress_id for key, event in snap.progress.items())
    assert all(key == event.reference_id for key, event in snap.children.items())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        snap.status = "completed"  # type: ignore[misc]
    for step in snap.steps.values():
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            step.status = "completed"  # type: ignore[misc]

    # Derived views agree with the states.
    assert snap.is_terminal == (snap.status in TERMINAL)
    assert snap.is_live == (snap.status in LIVE)
    waiting = tuple(w for w in snap.waits.values() if w.status == "waiting")
    active = tuple(h for h in snap.hooks.values() if h.status == "active")
    retrying = [s for s in snap.steps.values() if s.status == "pending" and s.retry_after]
    assert snap.open_waits() == waiting
    assert snap.active_hooks() == active
    for now in (snap.updated_at, FAR_FUTURE):
        due = sorted(
            (s for s in retrying if s.retry_after is not None and s.retry_after <= now),
            key=lambda s: (s.retry_after, s.step_id),
        )
        assert list(snap.due_retries(now)) == due
    assert snap.is_suspended == (
        snap.status in ("running", "cancelling") and bool(waiting or active or retrying)
    )
    if not snap.is_live:
        assert snap.wakeups() == ()
    if snap.status == "cancelling":
        assert snap.cancellation is not None
        assert snap.cancellation.sequence <= snap.last_sequence


# --- the strategies themselves ------------------------------------------------------------------


def features(history: list[Envelope]) -> set[str]:
    """What is interesting about a valid history and the states it passes through."""
    found: set[str] = set()
    ended = False
    for env, snap in zip(history, prefixes(history), strict=True):
        found.add(env.event.event_type)
        if ended:
            found.add(f"late:{env.event.event_type}")
        ended = snap.is_terminal
        found.add(f"status:{snap.status}")
        if snap.is_suspended:
            found.add("suspended")
        if any(w.kind == "retry" for w in snap.wakeups()):
            found.add("retry wakeup")
    snap = project_run(history)
    if any(step.attempt >= 2 for step in snap.steps.values()):
        found.add("step attempt 2")
    if any(len(hook.deliveries) >= 2 for hook in snap.hooks.values()):
        found.add("several deliveries")
    if any(hook.retain_token_until is not None for hook in snap.hooks.values()):
        found.add("retaining hook")
    if any(s.status == "cancelled" for s in snap.steps.values()):
        found.add("cancelled step")
    if any(w.status == "cancelled" for w in snap.waits.values()):
        found.add("cancelled wait")
    return found


def wanted_features() -> set[str]:
    """What the guided histories must reach between them."""
    return {f"status:{status}" for status in (*LIVE, *TERMINAL)} | {
        "step_retrying",
        "step attempt 2",
        "step_cancelled",
        "cancel_requested",
        "cancelled step",
        "cancelled wait",
        "late:step_completed",
        "late:step_failed",
        "late:hook_disposed",
        "hook_received",
        "several deliveries",
        "hook_conflict",
        "retaining hook",
        "wait_completed",
        "attributes_set",
        "progress_recorded",
        "child_linked",
        "log_recorded",
        "suspended",
        "retry wakeup",
        "run_claimed",
        "run_released",
    }


def test_valid_histories_reach_interesting_states() -> None:
    seen: set[str] = set()

    # Rounds of their own seeded settings, whatever profile or state other tests left: the
    # features are rare by design, and this asks for all of them within 1,000 examples.
    for round_seed in range(5):

        @seed(round_seed)
        @settings(max_examples=200, derandomize=False, database=None)
        @given(valid_histories())
        def collect(history: list[Envelope]) -> None:
            seen.update(features(history))

        collect()
        if wanted_features() <= seen:
            break
    wanted = wanted_features()
    assert wanted <= seen, sorted(wanted - seen)


def test_commands_cover_every_command_class() -> None:
    assert len(COMMAND_CLASSES) == 24
    seen: set[type[Command]] = set()
    for command_class in COMMAND_CLASSES:

        @settings(max_examples=3)
        @given(commands(types=[command_class]))
        def collect(command: Command) -> None:
            seen.add(type(command))

        collect()
    assert seen == set(COMMAND_CLASSES)
    with pytest.raises(ValueError, match="no strategy"):
        commands(types=[Command])


@pytest.mark.parametrize(
    "make",
    [
        commands,
        lambda: commands(malformed=True),
        strategies.events,
        snapshots,
        valid_histories,
        histories,
        invalid_histories,
    ],
    ids=["commands", "malformed commands", "events", "snapshots", "valid", "any", "invalid"],
)
def test_strategy_reprs_stay_readable(make: Any) -> None:
    # Hypothesis prints strategies in its reports, and warns (an error here) about any single
    # repr past 30 kB: large literals or repeated weighted options would bloat them.
    assert len(repr(make())) < 100_000
