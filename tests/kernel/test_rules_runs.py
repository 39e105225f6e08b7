"""Examples of the run-command rules of `RULES.md` and of the rules that hold for every command.

Every test goes through `CommandHandler` over the `store` fixture, except the few that call the
pure `decide` directly on a hand-built snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runfold import CommandHandler, EventStore, Snapshot
from runfold.commands import (
    CancelRun,
    CancelStep,
    Command,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateStep,
    CreateWait,
    DisposeHook,
    FailRun,
    FailStep,
    LazyStep,
    LinkChild,
    ReceiveHook,
    RecordLog,
    RecordProgress,
    RequestCancel,
    RetryStep,
    SetAttributes,
    StartRun,
    StartStep,
    TimeOutRun,
)
from runfold.errors import (
    EntityConflict,
    HistoryLimitExceeded,
    InvalidAttributes,
    InvalidCommand,
    NonDeterministic,
    RunExpired,
    RunNotFound,
    RunNotSupported,
    TerminalState,
)
from runfold.events import (
    AttributeChange,
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Envelope,
    LogRecorded,
    ProgressRecorded,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    RunTimedOut,
    StepWriter,
    WorkflowWriter,
)
from runfold.kernel import SPEC_VERSION, Cancellation, Limits, decide, project_run, run_index
from tests.conftest import T0, Clock
from tests.support.rules_helpers import (
    CANCEL_REASON,
    LIVE,
    RUN,
    TERMINAL,
    assert_rejected,
    create,
    kinds,
    run_in_status,
    run_with,
)

LATER = timedelta(minutes=5)

# --- CreateRun ----------------------------------------------------------------------------------


async def test_create_run_records_run_created_and_a_pending_run(
    handler: CommandHandler, clock: Clock
) -> None:
    command = create(
        input=b"payload",
        workflow_version="v3",
        deployment_id="dep-1",
        context=b"ctx",
        attributes={"team": "core", "$origin": "api"},
        allow_reserved=True,
        parent_run_id="parent",
        deadline=T0 + timedelta(hours=1),
    )
    outcome = await handler.execute(RUN, command)

    assert kinds(outcome) == ["run_created"]
    [envelope] = outcome.appended
    assert (envelope.run_id, envelope.sequence, envelope.recorded_at) == (RUN, 1, T0)
    assert envelope.event == RunCreated(
        workflow_name="wf",
        input=b"payload",
        workflow_version="v3",
        deployment_id="dep-1",
        context=b"ctx",
        attributes={"team": "core", "$origin": "api"},
        parent_run_id="parent",
        deadline=T0 + timedelta(hours=1),
        spec_version=SPEC_VERSION,
    )
    snap = outcome.snapshot
    assert snap.status == "pending"
    assert (snap.workflow_name, snap.workflow_version, snap.deployment_id) == ("wf", "v3", "dep-1")
    assert (snap.input, snap.context, snap.parent_run_id) == (b"payload", b"ctx", "parent")
    assert dict(snap.attributes) == {"team": "core", "$origin": "api"}
    assert snap.deadline == T0 + timedelta(hours=1)
    assert (snap.created_at, snap.updated_at, snap.started_at, snap.completed_at) == (
        T0,
        T0,
        None,
        None,
    )
    assert (snap.spec_version, snap.last_sequence) == (SPEC_VERSION, 1)
    assert await handler.snapshot(RUN) == snap


async def test_create_run_with_minimal_fields_uses_the_defaults(handler: CommandHandler) -> None:
    outcome = await handler.execute(RUN, create(input=b""))

    assert outcome.appended[0].event == RunCreated(workflow_name="wf", input=b"")
    snap = outcome.snapshot
    assert (snap.workflow_version, snap.deployment_id, snap.context, snap.parent_run_id) == (
        None,
        None,
        None,
        None,
    )
    assert (dict(snap.attributes), snap.deadline, snap.cancellation) == ({}, None, None)
    assert (dict(snap.steps), dict(snap.waits), dict(snap.hooks), snap.log_count) == ({}, {}, {}, 0)


@pytest.mark.parametrize("status", LIVE + TERMINAL)
async def test_create_run_on_an_existing_run_is_an_entity_conflict(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    await assert_rejected(handler, create(), EntityConflict, f"run {RUN!r} already exists")


async def test_create_run_after_a_resilient_start_is_an_entity_conflict(
    handler: CommandHandler,
) -> None:
    await handler.execute(RUN, StartRun(create=create()))
    await assert_rejected(handler, create(), EntityConflict, "already exists")
    assert (await handler.snapshot(RUN)).status == "running"


# --- StartRun -----------------------------------------------------------------------------------


async def test_start_run_starts_a_pending_run(handler: CommandHandler, clock: Clock) -> None:
    await run_in_status(handler, "pending")
    clock.advance(LATER)

    outcome = await handler.execute(RUN, StartRun())

    assert kinds(outcome) == ["run_started"]
    assert outcome.appended[0].event == RunStarted()
    assert outcome.appended[0].sequence == 2
    assert outcome.snapshot.status == "running"
    assert outcome.snapshot.started_at == T0 + LATER
    assert outcome.snapshot.created_at == T0


@pytest.mark.parametrize("status", ["running", "cancelling"])
async def test_start_run_on_a_started_run_is_a_no_op(handler: CommandHandler, status: str) -> None:
    before = await run_in_status(handler, status)

    outcome = await handler.execute(RUN, StartRun(create=create()))

    assert outcome.appended == ()
    assert outcome.snapshot.status == status
    assert outcome.snapshot.last_sequence == before.last_sequence
    assert await handler.store.head(RUN) == before.last_sequence


@pytest.mark.parametrize("status", TERMINAL)
async def test_start_run_on_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    await assert_rejected(
        handler, StartRun(), RunExpired, "already in terminal state", repr(status)
    )


async def test_start_run_without_history_creates_and_starts_it(handler: CommandHandler) -> None:
    outcome = await handler.execute(RUN, StartRun(create=create(deployment_id="d1")))

    assert kinds(outcome) == ["run_created", "run_started"]
    assert [e.sequence for e in outcome.appended] == [1, 2]
    assert outcome.appended[0].event == RunCreated(
        workflow_name="wf", input=b"in", deployment_id="d1"
    )
    assert outcome.snapshot.status == "running"
    assert outcome.snapshot.started_at == T0


async def test_start_run_without_history_or_create_is_run_not_found(
    handler: CommandHandler,
) -> None:
    await assert_rejected(handler, StartRun(), RunNotFound, f"run {RUN!r} not found")
    assert await handler.history(RUN) == []


# --- the commands that end a run ----------------------------------------------------------------


@attrs.frozen
class Ending:
    command: Command
    event: Any
    status: str
    fields: Mapping[str, object]


ENDING_CASES = {
    "complete": Ending(
        CompleteRun(output=b"out"), RunCompleted(output=b"out"), "completed", {"output": b"out"}
    ),
    "fail": Ending(
        FailRun(error=b"err", error_code="E_X"),
        RunFailed(error=b"err", error_code="E_X"),
        "failed",
        {"error": b"err", "error_code": "E_X"},
    ),
    "cancel": Ending(CancelRun(reason="why"), RunCancelled(reason="why"), "cancelled", {}),
    "time_out": Ending(
        TimeOutRun(deadline=T0 + LATER, reason="late"),
        RunTimedOut(deadline=T0 + LATER, reason="late"),
        "timed_out",
        {},
    ),
}


@pytest.mark.parametrize(
    ("case", "status"),
    [
        (case, status)
        for case in ENDING_CASES
        for status in LIVE
        if not (case == "complete" and status == "cancelling")
    ],
)
async def test_a_live_run_ends(
    handler: CommandHandler, clock: Clock, case: str, status: str
) -> None:
    ending = ENDING_CASES[case]
    before = await run_in_status(handler, status)
    clock.advance(LATER)

    outcome = await handler.execute(RUN, ending.command)

    assert kinds(outcome) == [ending.event.event_type]
    [envelope] = outcome.appended
    assert envelope.event == ending.event
    assert (envelope.sequence, envelope.recorded_at) == (before.last_sequence + 1, T0 + LATER)
    snap = outcome.snapshot
    assert snap.status == ending.status
    assert snap.is_terminal
    assert snap.completed_at == T0 + LATER
    for name, value in ending.fields.items():
        assert getattr(snap, name) == value
    assert (await handler.snapshot(RUN)).status == ending.status


async def test_complete_run_on_a_cancelling_run_is_refused(handler: CommandHandler) -> None:
    await run_in_status(handler, "cancelling")
    await assert_rejected(
        handler,
        CompleteRun(output=b"out"),
        TerminalState,
        "a cancelling run ends as cancelled, failed or timed out",
    )
    assert (await handler.snapshot(RUN)).status == "cancelling"


# Each run command that needs a live run, with the phrase its TerminalState message starts with.
NEEDS_LIVE_RUN: dict[str, tuple[Command, str]] = {
    "CompleteRun": (CompleteRun(output=b"out"), "cannot transition run"),
    "FailRun": (FailRun(error=b"err"), "cannot transition run"),
    "CancelRun": (CancelRun(reason="why"), "cannot transition run"),
    "TimeOutRun": (TimeOutRun(deadline=T0), "cannot transition run"),
    "RequestCancel": (RequestCancel(reason="why"), "cannot request cancellation of run"),
    "SetAttributes": (SetAttributes(changes={"k": "v"}), "cannot set attributes on run"),
    "RecordProgress": (RecordProgress(progress_id="p1", completed=1), "run"),
    "LinkChild": (LinkChild(reference_id="c1", kind="run", operation_id="op"), "run"),
    "RecordLog": (RecordLog(level="info", message="hello"), "run"),
}

# RequestCancel and CancelRun on a cancelled run are no-ops, not refusals.
_CANCELLED_NO_OPS = ("RequestCancel", "CancelRun")


@pytest.mark.parametrize(
    ("name", "status"),
    [
        (name, status)
        for name in NEEDS_LIVE_RUN
        for status in TERMINAL
        if not (status == "cancelled" and name in _CANCELLED_NO_OPS)
        and not (status == "timed_out" and name == "TimeOutRun")
    ],
)
async def test_run_commands_on_an_ended_run_are_terminal_state(
    handler: CommandHandler, name: str, status: str
) -> None:
    command, phrase = NEEDS_LIVE_RUN[name]
    await run_in_status(handler, status)
    await assert_rejected(
        handler, command, TerminalState, phrase, f"in terminal state {status!r}", repr(RUN)
    )


@pytest.mark.parametrize("command", [CancelRun(reason="again"), CancelRun(), RequestCancel()])
async def test_cancelling_a_cancelled_run_again_is_a_no_op(
    handler: CommandHandler, command: Command
) -> None:
    before = await run_in_status(handler, "cancelled")

    outcome = await handler.execute(RUN, command)

    assert outcome.appended == ()
    assert outcome.snapshot.status == "cancelled"
    assert await handler.store.head(RUN) == before.last_sequence


# --- RequestCancel ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["pending", "running"])
async def test_request_cancel_makes_the_run_cancelling_and_cancels_its_open_work(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(
        handler,
        status,
        CreateStep(step_id="idle", step_name="s", input=b""),
        StartStep(step_id="busy", lazy=LazyStep(step_name="s", input=b"")),
        StartStep(step_id="done", lazy=LazyStep(step_name="s", input=b"")),
        CompleteStep(step_id="done", output=b"ok"),
        CreateWait(wait_id="w1", resume_at=T0 + timedelta(days=1)),
        CreateHook(hook_id="h1", token="tok-1"),
    )
    clock.advance(LATER)

    outcome = await handler.execute(RUN, RequestCancel(reason="user asked"))

    assert kinds(outcome) == ["cancel_requested"]
    [envelope] = outcome.appended
    assert envelope.event == CancelRequested(reason="user asked")
    snap = outcome.snapshot
    assert snap.status == "cancelling"
    assert snap.is_live and not snap.is_terminal
    assert snap.cancellation == Cancellation(
        reason="user asked", requested_at=T0 + LATER, sequence=envelope.sequence
    )
    assert {k: s.status for k, s in snap.steps.items()} == {
        "idle": "cancelled",
        "busy": "cancelled",
        "done": "completed",
    }
    assert snap.waits["w1"].status == "cancelled"
    assert snap.hooks["h1"].status == "cancelled"
    assert snap.open_waits() == () and snap.active_hooks() == ()


@pytest.mark.parametrize("reason", [CANCEL_REASON, None])
async def test_request_cancel_again_with_the_same_reason_is_a_no_op(
    handler: CommandHandler, reason: str | None
) -> None:
    await run_in_status(handler, "running")
    first = await handler.execute(RUN, RequestCancel(reason=reason))

    outcome = await handler.execute(RUN, RequestCancel(reason=reason))

    assert outcome.appended == ()
    assert outcome.snapshot.cancellation == first.snapshot.cancellation
    assert await handler.store.head(RUN) == first.snapshot.last_sequence


@pytest.mark.parametrize("reason", ["another reason", None])
async def test_request_cancel_with_another_reason_is_an_entity_conflict(
    handler: CommandHandler, reason: str | None
) -> None:
    await run_in_status(handler, "cancelling")  # cancelling for CANCEL_REASON
    await assert_rejected(
        handler, RequestCancel(reason=reason), EntityConflict, "already cancelling"
    )
    snap = await handler.snapshot(RUN)
    assert snap.cancellation is not None and snap.cancellation.reason == CANCEL_REASON


# --- SetAttributes ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", LIVE)
async def test_set_attributes_merges_changes(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(handler, status, SetAttributes(changes={"a": "1", "b": "2"}))
    changes = (
        AttributeChange(key="b", value=None),
        AttributeChange(key="c", value="3"),
        AttributeChange(key="absent", value=None),
    )
    writer = StepWriter(step_id="s1", attempt=2)

    outcome = await handler.execute(
        RUN, SetAttributes(changes=changes, writer=writer, write_id="w-1")
    )

    assert kinds(outcome) == ["attributes_set"]
    [envelope] = outcome.appended
    assert envelope.event == AttributesSet(changes=changes, writer=writer, write_id="w-1")
    snap = outcome.snapshot
    assert dict(snap.attributes) == {"a": "1", "c": "3"}
    assert dict(snap.attribute_write_ids) == {"w-1": envelope.sequence}
    assert snap.status == status


async def test_set_attributes_merges_with_the_initial_attributes(handler: CommandHandler) -> None:
    await handler.execute(RUN, create(attributes={"x": "1", "y": "2"}))

    outcome = await handler.execute(RUN, SetAttributes(changes={"y": "20", "z": "3"}))

    assert outcome.appended[0].event == AttributesSet(
        changes=(AttributeChange(key="y", value="20"), AttributeChange(key="z", value="3")),
        writer=WorkflowWriter(),
    )
    assert dict(outcome.snapshot.attributes) == {"x": "1", "y": "20", "z": "3"}


@pytest.mark.parametrize("status", ["running", "completed"])
@pytest.mark.parametrize("changes", [{"k": "v"}, {"other": "x"}])
async def test_set_attributes_with_a_seen_write_id_is_a_no_op_the_first_write_stands(
    handler: CommandHandler, changes: dict[str, str], status: str
) -> None:
    await run_with(handler, status, SetAttributes(changes={"k": "v"}, write_id="w-1"))
    before = await handler.history(RUN)

    outcome = await handler.execute(RUN, SetAttributes(changes=changes, write_id="w-1"))

    assert outcome.appended == ()
    assert await handler.history(RUN) == before
    assert dict((await handler.snapshot(RUN)).attributes) == {"k": "v"}


async def test_set_attributes_without_a_write_id_already_in_effect_is_a_no_op(
    handler: CommandHandler,
) -> None:
    await run_with(handler, "running", SetAttributes(changes={"k": "v", "gone": None}))
    before = await handler.history(RUN)

    same = await handler.execute(RUN, SetAttributes(changes={"k": "v", "gone": None}))
    other = await handler.execute(RUN, SetAttributes(changes={"k": "v", "new": "1"}))

    assert same.appended == ()
    assert await handler.history(RUN) == [*before, *other.appended]
    assert kinds(other) == ["attributes_set"]


def _many(count: int, prefix: str = "k") -> dict[str, str | None]:
    return {f"{prefix}{i}": "v" for i in range(count)}


# Attribute batches RULES.md refuses, with the fragments their messages must name.
INVALID_ATTRIBUTES: dict[str, tuple[tuple[AttributeChange, ...], tuple[str, ...]]] = {
    "empty key": ((AttributeChange(key="", value="v"),), ("attribute key",)),
    "key too long": (
        (AttributeChange(key="k" * 257, value="v"),),
        ("length 257 exceeds limit 256",),
    ),
    "repeated key": (
        (AttributeChange(key="k", value="1"), AttributeChange(key="k", value="2")),
        ("'k'", "repeats"),
    ),
    "value too long": (
        (AttributeChange(key="k", value="é" * 128 + "x"),),
        ("'k'", "byte length 257 exceeds limit 256"),
    ),
    "reserved prefix": ((AttributeChange(key="$k", value="v"),), ("'$k'", "reserved prefix")),
    "too many keys": (
        tuple(AttributeChange(key=k, value=v) for k, v in _many(65).items()),
        ("65", "exceeds limit 64"),
    ),
}


@pytest.mark.parametrize("case", INVALID_ATTRIBUTES)
async def test_set_attributes_breaking_a_rule_is_invalid_attributes(
    handler: CommandHandler, case: str
) -> None:
    changes, fragments = INVALID_ATTRIBUTES[case]
    await run_in_status(handler, "running")

    await assert_rejected(handler, SetAttributes(changes=changes), InvalidAttributes, *fragments)
    assert dict((await handler.snapshot(RUN)).attributes) == {}


@pytest.mark.parametrize("case", INVALID_ATTRIBUTES)
@pytest.mark.parametrize("situation", ["terminal run", "seen write id"])
async def test_invalid_attributes_are_refused_before_anything_else(
    handler: CommandHandler, case: str, situation: str
) -> None:
    changes, fragments = INVALID_ATTRIBUTES[case]
    setup = SetAttributes(changes={"k0": "v"}, write_id="w-1")
    await run_with(handler, "completed" if situation == "terminal run" else "running", setup)

    await assert_rejected(
        handler, SetAttributes(changes=changes, write_id="w-1"), InvalidAttributes, *fragments
    )


@pytest.mark.parametrize("case", [c for c in INVALID_ATTRIBUTES if c != "repeated key"])
async def test_create_run_validates_attributes_like_set_attributes(
    handler: CommandHandler, case: str
) -> None:
    changes, fragments = INVALID_ATTRIBUTES[case]
    attributes = {change.key: change.value for change in changes}

    await assert_rejected(handler, create(attributes=attributes), InvalidAttributes, *fragments)
    assert await handler.history(RUN) == []


async def test_attribute_limits_are_inclusive(handler: CommandHandler) -> None:
    at_limit = {"k" * 256: "é" * 128, **_many(63)}
    outcome = await handler.execute(RUN, create(attributes=at_limit))
    assert len(outcome.snapshot.attributes) == 64

    more = await handler.execute(RUN, SetAttributes(changes={"k0": "x" * 256}))

    assert kinds(more) == ["attributes_set"]
    assert more.snapshot.attributes["k0"] == "x" * 256
    assert len(more.snapshot.attributes) == 64


@pytest.mark.parametrize("command", [create(attributes={"$sys": "1"}, allow_reserved=True)])
async def test_reserved_keys_are_accepted_when_allowed(
    handler: CommandHandler, command: Command
) -> None:
    await handler.execute(RUN, command)

    outcome = await handler.execute(
        RUN, SetAttributes(changes={"$sys": "2", "$new": "3"}, allow_reserved=True)
    )

    assert outcome.appended[0].event == AttributesSet(
        changes=(AttributeChange(key="$sys", value="2"), AttributeChange(key="$new", value="3")),
        allow_reserved=True,
    )
    assert dict(outcome.snapshot.attributes) == {"$sys": "2", "$new": "3"}


async def test_a_removal_in_the_same_batch_frees_room(handler: CommandHandler) -> None:
    await handler.execute(RUN, create(attributes=_many(64)))

    outcome = await handler.execute(RUN, SetAttributes(changes={"k0": None, "new": "v"}))

    assert "new" in outcome.snapshot.attributes and "k0" not in outcome.snapshot.attributes
    assert len(outcome.snapshot.attributes) == 64


async def test_removing_an_absent_key_does_not_free_room(handler: CommandHandler) -> None:
    await handler.execute(RUN, create(attributes=_many(64)))

    await assert_rejected(
        handler,
        SetAttributes(changes={"absent": None, "new": "v"}),
        InvalidAttributes,
        "65",
        "exceeds limit 64",
    )
    assert len((await handler.snapshot(RUN)).attributes) == 64


# --- RecordProgress and LinkChild: recorded once per id -----------------------------------------


@attrs.frozen
class Once:
    make: Callable[[int], Command]
    event: Callable[[int], Any]
    view: Callable[[Snapshot], Mapping[str, Any]]
    key: str


ONCE_CASES = {
    "progress": Once(
        make=lambda n: RecordProgress(
            progress_id="p1", completed=n, total=10, message="half", details=b"d"
        ),
        event=lambda n: ProgressRecorded(
            progress_id="p1", completed=n, total=10, message="half", details=b"d"
        ),
        view=lambda snap: snap.progress,
        key="p1",
    ),
    "child": Once(
        make=lambda n: LinkChild(
            reference_id="c1", kind="run", operation_id=f"op{n}", child_run_id="kid", metadata=b"m"
        ),
        event=lambda n: ChildLinked(
            reference_id="c1", kind="run", operation_id=f"op{n}", child_run_id="kid", metadata=b"m"
        ),
        view=lambda snap: snap.children,
        key="c1",
    ),
}


@pytest.mark.parametrize("status", LIVE)
@pytest.mark.parametrize("case", ONCE_CASES)
async def test_record_once_on_a_live_run(handler: CommandHandler, case: str, status: str) -> None:
    once = ONCE_CASES[case]
    await run_in_status(handler, status)

    outcome = await handler.execute(RUN, once.make(5))

    assert [e.event for e in outcome.appended] == [once.event(5)]
    assert once.view(outcome.snapshot)[once.key] == once.event(5)


@pytest.mark.parametrize("case", ONCE_CASES)
async def test_record_once_again_with_the_same_content_is_a_no_op(
    handler: CommandHandler, case: str
) -> None:
    once = ONCE_CASES[case]
    await run_with(handler, "running", once.make(5))
    head = await handler.store.head(RUN)

    outcome = await handler.execute(RUN, once.make(5))

    assert outcome.appended == ()
    assert once.view(outcome.snapshot)[once.key] == once.event(5)
    assert await handler.store.head(RUN) == head


@pytest.mark.parametrize("case", ONCE_CASES)
async def test_record_once_again_with_other_content_is_non_deterministic(
    handler: CommandHandler, case: str
) -> None:
    once = ONCE_CASES[case]
    await run_with(handler, "running", once.make(5))

    await assert_rejected(
        handler, once.make(6), NonDeterministic, repr(once.key), "with other content"
    )
    assert once.view(await handler.snapshot(RUN))[once.key] == once.event(5)


async def test_progress_is_kept_by_id_in_order(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    for progress_id in ("p2", "p1", "p3"):
        await handler.execute(RUN, RecordProgress(progress_id=progress_id, completed=1))

    snap = await handler.snapshot(RUN)

    assert list(snap.progress) == ["p2", "p1", "p3"]
    assert snap.progress["p1"] == ProgressRecorded(progress_id="p1", completed=1)


@pytest.mark.parametrize(("completed", "total"), [(0, 0), (0, -1), (5, 3)])
async def test_record_progress_with_an_impossible_total_is_invalid(
    handler: CommandHandler, completed: int, total: int
) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(
        handler,
        RecordProgress(progress_id="p1", completed=completed, total=total),
        InvalidCommand,
        "'p1'",
        "total must be positive and at least completed",
    )


async def test_record_progress_may_reach_its_total(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")

    outcome = await handler.execute(RUN, RecordProgress(progress_id="p1", completed=3, total=3))

    assert kinds(outcome) == ["progress_recorded"]


# --- RecordLog ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", LIVE)
async def test_record_log_on_a_live_run(handler: CommandHandler, status: str) -> None:
    await run_in_status(handler, status)
    first = RecordLog(level="warning", message="careful", step_id="s1", data=b"{}")

    outcome = await handler.execute(RUN, first)
    again = await handler.execute(RUN, RecordLog(level="info", message="careful"))

    assert outcome.appended[0].event == LogRecorded(
        level="warning", message="careful", step_id="s1", data=b"{}", log_id=first.log_id
    )
    assert kinds(again) == ["log_recorded"]  # two commands are two lines
    assert (outcome.snapshot.log_count, again.snapshot.log_count) == (1, 2)


async def test_a_named_log_line_is_recorded_once_even_after_the_run_ended(
    handler: CommandHandler,
) -> None:
    await run_in_status(handler, "running")
    line = RecordLog(level="info", message="charged", log_id="charge-1")

    first = await handler.execute(RUN, line)
    again = await handler.execute(RUN, line)  # a retry whose reply was lost
    other = await handler.execute(RUN, attrs.evolve(line, message="changed"))
    await handler.execute(RUN, CompleteRun(output=b""))
    late = await handler.execute(RUN, line)

    assert first.appended[0].event == LogRecorded(
        level="info", message="charged", log_id="charge-1"
    )
    assert (again.appended, other.appended, late.appended) == ((), (), ())  # no-ops
    assert again.snapshot.log_count == 1
    assert dict(late.snapshot.log_ids) == {"charge-1": first.appended[0].sequence}
    await assert_rejected(
        handler, RecordLog(level="info", message="new", log_id="l-2"), TerminalState, "terminal"
    )
    await assert_rejected(
        handler, RecordLog(level="info", message="m", log_id=""), InvalidCommand, "log_id"
    )


async def test_record_log_with_an_unknown_level_is_invalid(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(
        handler,
        RecordLog(level="debug", message="m"),  # type: ignore[arg-type]
        InvalidCommand,
        "log level",
    )


# --- rules that hold for every command ----------------------------------------------------------

# One command of every kind (some of them malformed: the spec-version check comes first).
EVERY_COMMAND: list[Command] = [
    create(),
    StartRun(),
    CompleteRun(output=b""),
    FailRun(error=b""),
    RequestCancel(),
    CancelRun(),
    TimeOutRun(deadline=T0),
    SetAttributes(changes={"$bad": "v"}),
    RecordProgress(progress_id="p", completed=1),
    LinkChild(reference_id="c", kind="k", operation_id="o"),
    RecordLog(level="info", message="m"),
    CreateStep(step_id="", step_name="s", input=b""),
    StartStep(step_id="s"),
    CompleteStep(step_id="s", output=b""),
    FailStep(step_id="s", error=b""),
    RetryStep(step_id="s", error=b""),
    CancelStep(step_id="s"),
    CreateWait(wait_id="w", resume_at=T0),
    CompleteWait(wait_id="w"),
    CreateHook(hook_id="h", token="t", retain_token_until=T0 + timedelta(days=365)),
    ReceiveHook(hook_id="h", payload=b""),
    DisposeHook(hook_id="h"),
]


def _command_id(command: Command) -> str:
    return type(command).__name__


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=_command_id)
async def test_decide_refuses_a_run_of_a_newer_spec_first(
    handler: CommandHandler, command: Command
) -> None:
    snap = await run_in_status(handler, "running")
    newer = attrs.evolve(snap, spec_version=SPEC_VERSION + 1)

    with pytest.raises(RunNotSupported) as info:
        decide(newer, command, now=T0)

    assert (info.value.code, info.value.status, info.value.run_id) == (
        "run_not_supported",
        409,
        RUN,
    )
    assert f"requires spec version {SPEC_VERSION + 1}, runfold supports {SPEC_VERSION}" in str(
        info.value
    )


async def _store_newer_spec_run(store: EventStore) -> None:
    current = RunCreated(workflow_name="wf", input=b"")
    index = run_index(
        project_run([Envelope(run_id=RUN, sequence=1, event=current, recorded_at=T0)])
    )
    newer = attrs.evolve(current, spec_version=SPEC_VERSION + 1)
    await store.append_if_sequence(RUN, 0, [newer], index=index, recorded_at=T0)


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=_command_id)
async def test_a_stored_run_of_a_newer_spec_is_not_supported(
    handler: CommandHandler, store: EventStore, command: Command
) -> None:
    await _store_newer_spec_run(store)

    await assert_rejected(
        handler,
        command,
        RunNotSupported,
        f"requires spec version {SPEC_VERSION + 1}, runfold supports {SPEC_VERSION}",
    )
    assert await store.head(RUN) == 1


async def test_reading_a_run_of_a_newer_spec_is_not_supported(
    handler: CommandHandler, store: EventStore
) -> None:
    await _store_newer_spec_run(store)

    with pytest.raises(RunNotSupported, match="requires spec version"):
        await handler.snapshot(RUN)


# Every command field that holds an identifier, as a function of the id.
ID_FIELDS: dict[str, Callable[[str], Command]] = {
    "CreateStep.step_id": lambda i: CreateStep(step_id=i, step_name="s", input=b""),
    "StartStep.step_id": lambda i: StartStep(step_id=i),
    "CompleteStep.step_id": lambda i: CompleteStep(step_id=i, output=b""),
    "FailStep.step_id": lambda i: FailStep(step_id=i, error=b""),
    "RetryStep.step_id": lambda i: RetryStep(step_id=i, error=b""),
    "CancelStep.step_id": lambda i: CancelStep(step_id=i),
    "CreateWait.wait_id": lambda i: CreateWait(wait_id=i, resume_at=T0),
    "CompleteWait.wait_id": lambda i: CompleteWait(wait_id=i),
    "CreateHook.hook_id": lambda i: CreateHook(hook_id=i, token="tok"),
    "ReceiveHook.hook_id": lambda i: ReceiveHook(hook_id=i, payload=b""),
    "ReceiveHook.delivery_id": lambda i: ReceiveHook(hook_id="h", payload=b"", delivery_id=i),
    "DisposeHook.hook_id": lambda i: DisposeHook(hook_id=i),
    "SetAttributes.write_id": lambda i: SetAttributes(changes={"k": "v"}, write_id=i),
    "RecordProgress.progress_id": lambda i: RecordProgress(progress_id=i, completed=0),
    "LinkChild.reference_id": lambda i: LinkChild(reference_id=i, kind="run", operation_id="o"),
}

BAD_IDS = {
    "empty": ("", "must not be empty"),
    "too long": ("x" * 257, "is 257 characters, over the 256 limit"),
    "control character": ("bad\nid", "contains a control character"),
}


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("field", ID_FIELDS)
async def test_a_bad_identifier_is_refused_first(
    handler: CommandHandler, field: str, bad: str
) -> None:
    value, fragment = BAD_IDS[bad]
    await run_in_status(handler, "completed")  # any other rule would refuse these too

    await assert_rejected(
        handler, ID_FIELDS[field](value), InvalidCommand, field.split(".")[1], fragment
    )


@pytest.mark.parametrize(
    "field",
    [
        "CreateStep.step_id",
        "CreateWait.wait_id",
        "CreateHook.hook_id",
        "SetAttributes.write_id",
        "RecordProgress.progress_id",
        "LinkChild.reference_id",
    ],
)
async def test_an_identifier_of_256_characters_is_accepted(
    handler: CommandHandler, field: str
) -> None:
    await run_in_status(handler, "running")

    outcome = await handler.execute(RUN, ID_FIELDS[field]("i" * 256))

    assert len(outcome.appended) == 1


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("command", [create(), StartRun(create=create()), StartStep(step_id="s")])
async def test_a_bad_run_id_is_refused(handler: CommandHandler, bad: str, command: Command) -> None:
    value, fragment = BAD_IDS[bad]
    await assert_rejected(handler, command, InvalidCommand, "run_id", fragment, run_id=value)
    assert await handler.history(value) == []


async def test_a_run_id_of_256_characters_is_accepted(handler: CommandHandler) -> None:
    run_id = "r" * 256

    outcome = await handler.execute(run_id, create())

    assert outcome.snapshot.run_id == run_id
    assert await handler.store.head(run_id) == 1


# Every payload field, as a function of the payload.
PAYLOAD_FIELDS: dict[str, Callable[[bytes], Command]] = {
    "input": lambda p: create(input=p),
    "context": lambda p: create(context=p),
    "output": lambda p: CompleteRun(output=p),
    "error": lambda p: FailRun(error=p),
    "details": lambda p: RecordProgress(progress_id="p", completed=0, details=p),
    "metadata": lambda p: LinkChild(reference_id="c", kind="k", operation_id="o", metadata=p),
    "data": lambda p: RecordLog(level="info", message="m", data=p),
    "CreateStep.input": lambda p: CreateStep(step_id="s", step_name="n", input=p),
    "LazyStep.input": lambda p: StartStep(step_id="s", lazy=LazyStep(step_name="n", input=p)),
    "CompleteStep.output": lambda p: CompleteStep(step_id="s", output=p),
    "FailStep.error": lambda p: FailStep(step_id="s", error=p),
    "RetryStep.error": lambda p: RetryStep(step_id="s", error=p),
    "CreateHook.metadata": lambda p: CreateHook(hook_id="h", token="t", metadata=p),
    "ReceiveHook.payload": lambda p: ReceiveHook(hook_id="h", payload=p),
}


@pytest.fixture
def small_payloads(store: EventStore, clock: Clock) -> CommandHandler:
    """A handler whose payloads may hold at most 8 bytes."""
    return CommandHandler(store, clock=clock, limits=Limits(max_payload_bytes=8))


@pytest.mark.parametrize("field", PAYLOAD_FIELDS)
async def test_a_payload_over_the_limit_is_invalid(
    small_payloads: CommandHandler, field: str
) -> None:
    await run_in_status(small_payloads, "running")

    await assert_rejected(
        small_payloads,
        PAYLOAD_FIELDS[field](b"123456789"),
        InvalidCommand,
        field.split(".")[-1],
        "is 9 bytes, over the 8 limit",
    )


async def test_a_payload_at_the_limit_is_accepted(small_payloads: CommandHandler) -> None:
    await run_in_status(small_payloads, "running")

    outcome = await small_payloads.execute(RUN, CompleteRun(output=b"12345678"))

    assert outcome.snapshot.output == b"12345678"


async def test_the_default_payload_limit_is_two_mebibytes(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    limit = 2 * 1024 * 1024

    await assert_rejected(
        handler,
        ReceiveHook(hook_id="h", payload=b"x" * (limit + 1)),
        InvalidCommand,
        f"is {limit + 1} bytes, over the {limit} limit",
    )
    outcome = await handler.execute(RUN, CompleteRun(output=b"x" * limit))
    assert outcome.snapshot.output == b"x" * limit


@pytest.fixture
def small_history(store: EventStore, clock: Clock) -> CommandHandler:
    """A handler whose runs may hold at most 4 events."""
    return CommandHandler(store, clock=clock, limits=Limits(max_events_per_run=4))


async def _full_run(handler: CommandHandler) -> None:
    """A running run holding exactly its 4 allowed events."""
    await run_with(
        handler,
        "running",
        RecordLog(level="info", message="3"),
        RecordLog(level="info", message="4"),
    )
    assert await handler.store.head(RUN) == 4


@pytest.mark.parametrize(
    "command",
    [
        RecordLog(level="info", message="5"),
        RequestCancel(),
        SetAttributes(changes={"k": "v"}),
        CreateStep(step_id="s", step_name="n", input=b""),
    ],
    ids=_command_id,
)
async def test_a_command_past_the_event_limit_is_refused(
    small_history: CommandHandler, command: Command
) -> None:
    await _full_run(small_history)

    await assert_rejected(small_history, command, HistoryLimitExceeded, "limit of 4")


@pytest.mark.parametrize("case", ENDING_CASES)
async def test_a_full_run_may_still_end(small_history: CommandHandler, case: str) -> None:
    ending = ENDING_CASES[case]
    await _full_run(small_history)

    outcome = await small_history.execute(RUN, ending.command)

    assert outcome.appended[0].sequence == 5
    assert outcome.snapshot.status == ending.status


async def test_a_decision_of_several_events_must_fit_entirely(store: EventStore) -> None:
    one_event = CommandHandler(store, limits=Limits(max_events_per_run=1))

    await assert_rejected(one_event, StartRun(create=create()), HistoryLimitExceeded, "limit of 1")
    outcome = await one_event.execute(RUN, create())
    assert kinds(outcome) == ["run_created"]


async def test_a_lazy_start_at_the_limit_is_refused_whole(small_history: CommandHandler) -> None:
    await run_with(small_history, "running", RecordLog(level="info", message="3"))

    await assert_rejected(
        small_history,
        StartStep(step_id="s", lazy=LazyStep(step_name="n", input=b"")),
        HistoryLimitExceeded,
        "limit of 4",
    )
    assert "s" not in (await small_history.snapshot(RUN)).steps


async def test_decide_is_pure(handler: CommandHandler) -> None:
    snap = await run_in_status(handler, "running")
    command = StartStep(step_id="s", lazy=LazyStep(step_name="n", input=b"i"))

    first = decide(snap, command, now=T0)
    second = decide(snap, command, now=T0)

    assert first == second
    assert len(first.events) == 2 and not first.idempotent
    assert snap == await handler.snapshot(RUN)
    assert "s" not in snap.steps


async def test_decide_reports_a_no_op_as_idempotent(handler: CommandHandler) -> None:
    snap = await run_in_status(handler, "running")

    decision = decide(snap, StartRun(), now=T0)

    assert decision.events == () and decision.idempotent


async def test_a_malformed_command_is_invalid_not_a_crash(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")

    await assert_rejected(
        handler,
        CompleteRun(output="not bytes"),  # type: ignore[arg-type]
        InvalidCommand,
        "output must be bytes",
    )
