"""`decide_after`: a command decided after a kernel decision, as one decision of both; and the
fold's copy-on-write of records and sets, which the engine's one decision per flush relies on."""

from __future__ import annotations

import copy

import attrs
import pytest

from runfold.kernel import (
    BatchDecision,
    CompleteStep,
    CreateHook,
    EntityConflict,
    FailStep,
    LazyStep,
    ReceiveHook,
    RetryPolicy,
    RetryStep,
    StartStep,
    StepNotFound,
    apply,
    decide,
    decide_after,
    decide_many,
    join_decisions,
    make_envelope,
    project_run,
    recheck_decision,
)
from tests.conftest import T0
from tests.handler.test_handler import CREATE, START, lazy, log


def test_decide_after_is_the_join_of_the_command_decided_alone() -> None:
    start = decide_many(None, [CREATE, START], now=T0, run_id="r")
    first = decide_many(start.snapshot, [lazy("s")], now=T0)
    after = decide_after(first, CompleteStep(step_id="s", output=b"1"))
    joined = join_decisions(
        first, decide_many(first.snapshot, [CompleteStep(step_id="s", output=b"1")], now=T0)
    )
    assert after.events == joined.events and after.snapshot == joined.snapshot
    assert after.created_steps == ("s",) and after.decided_on is start.snapshot
    assert after.now == T0
    # The kernel's own: the handler takes it as it is on the snapshot it was decided on.
    assert recheck_decision(after, start.snapshot, run_id="r") is after
    # And the snapshot is the fold of the whole history.
    history = [
        make_envelope("r", n, event, T0, None)
        for n, event in enumerate(start.events + after.events, start=1)
    ]
    assert after.snapshot == project_run(history)


def test_decide_after_a_no_op_is_the_decision_itself() -> None:
    start = decide_many(None, [CREATE, START], now=T0, run_id="r")
    first = decide_many(start.snapshot, [log("a")], now=T0)
    first = decide_after(first, attrs.evolve(log("b"), log_id="once"))
    assert decide_after(first, attrs.evolve(log("b"), log_id="once")) is first


def test_decide_after_refuses_what_the_kernel_refuses_and_hand_made_decisions() -> None:
    start = decide_many(None, [CREATE, START], now=T0, run_id="r")
    first = decide_many(start.snapshot, [lazy("s")], now=T0)
    with pytest.raises(StepNotFound) as refused:
        decide_after(first, CompleteStep(step_id="missing", output=b""))
    assert refused.value.command_index == 0
    with pytest.raises(EntityConflict):
        decide_after(first, lazy("s"))  # created by the first decision already
    with pytest.raises(ValueError, match="made by decide_many"):
        decide_after(attrs.evolve(first), log("x"))


def test_only_the_kernel_s_own_decision_is_taken_without_a_fold() -> None:
    # A decision copied or rebuilt with the same fields is not the kernel's: the
    # handler's recheck folds its events again (a new decision, the kernel's own snapshot).
    start = decide_many(None, [CREATE, START], now=T0, run_id="r")
    first = decide_many(start.snapshot, [lazy("s")], now=T0)
    assert recheck_decision(first, start.snapshot, run_id="r") is first
    copies = [
        attrs.evolve(first),
        copy.copy(first),
        BatchDecision(
            events=first.events,
            snapshot=first.snapshot,
            created_steps=first.created_steps,
            decided_on=start.snapshot,
            now=T0,
        ),
    ]
    for other in copies:
        other = attrs.evolve(other, decided_on=start.snapshot)
        rechecked = recheck_decision(other, start.snapshot, run_id="r")
        assert rechecked is not other
        assert rechecked.snapshot is not first.snapshot and rechecked.snapshot == first.snapshot
        with pytest.raises(ValueError, match="made by decide_many"):
            decide_after(other, log("x"))


def test_a_fold_never_changes_the_records_or_sets_of_the_snapshot_it_starts_from() -> None:
    start = decide_many(None, [CREATE, START], now=T0, run_id="r")
    hooked = decide_many(
        start.snapshot, [CreateHook(hook_id="h", token="t0123456789"), lazy("s")], now=T0
    ).snapshot
    assert hooked is not None
    before_hook = hooked.hooks["h"]
    before_ids = (hooked.live_step_ids, hooked.active_hook_ids)
    receive = ReceiveHook(hook_id="h", payload=b"p", delivery_id="d")
    events = (
        decide(hooked, receive, now=T0).events
        + decide(hooked, CompleteStep(step_id="s", output=b"o"), now=T0).events
    )
    envelopes = [
        make_envelope("r", hooked.last_sequence + n, event, T0, None)
        for n, event in enumerate(events, start=1)
    ]
    after = apply(hooked, envelopes)
    assert len(after.hooks["h"].deliveries) == 1 and after.steps["s"].status == "completed"
    # The older snapshot reads as it did: its hook's deliveries and its sets are its own.
    assert hooked.hooks["h"] == before_hook and hooked.hooks["h"].deliveries == ()
    assert hooked.steps["s"].status == "running"
    assert (
        (hooked.live_step_ids, hooked.active_hook_ids)
        == before_ids
        == (frozenset({"s"}), frozenset({"h"}))
    )
    assert after.live_step_ids == frozenset() and type(after.live_step_ids) is frozenset
    # A set the fold did not change is shared, not copied.
    assert after.active_hook_ids is hooked.active_hook_ids


def test_a_step_given_a_start_id_an_error_or_a_retry_time_leaves_older_snapshots_be() -> None:
    # A step's record holds `start_id`, `error` and `retry_after` only once a fold sets one: the
    # fold that does gives it a wider record of its own, and older snapshots read as they did.
    start = decide_many(None, [CREATE, START], now=T0, run_id="r")
    lazily = StartStep(
        step_id="s", lazy=LazyStep(step_name="n", input=b"", retry=RetryPolicy(max_attempts=5))
    )
    commands = [
        lazily,
        RetryStep(step_id="s", error=b"e1", retry_after=T0),
        StartStep(step_id="s", start_id="second"),
        RetryStep(step_id="s", error=b"e2"),
        StartStep(step_id="s"),  # a start without an id: the step's start id is None again
        FailStep(step_id="s", error=b"e3"),
    ]
    decisions = [start]
    for command in commands:
        decisions.append(decide_many(decisions[-1].snapshot, [command], now=T0))
    snapshots = [decision.snapshot for decision in decisions[1:]]
    states = [snap.steps["s"] for snap in snapshots if snap is not None]  # read after all folds
    assert [(s.status, s.attempt, s.start_id, s.error, s.retry_after) for s in states] == [
        ("running", 1, None, None, None),
        ("pending", 1, None, b"e1", T0),
        ("running", 2, "second", b"e1", None),
        ("pending", 2, "second", b"e2", None),
        ("running", 3, None, b"e2", None),
        ("failed", 3, None, b"e3", None),
    ]
    events = [event for decision in decisions for event in decision.events]
    history = [make_envelope("r", n, event, T0, None) for n, event in enumerate(events, start=1)]
    assert decisions[-1].snapshot == project_run(history)
    # The same start sent again is recognised by the start id its wider record holds.
    again = decide_many(decisions[3].snapshot, [StartStep(step_id="s", start_id="second")], now=T0)
    assert again.events == ()
