"""Examples of the step-command rules of `RULES.md`, through `CommandHandler` and the store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runfold import CommandHandler, Snapshot
from runfold.commands import (
    CancelRun,
    CancelStep,
    Command,
    CompleteStep,
    CreateStep,
    FailStep,
    LazyStep,
    RequestCancel,
    RetryStep,
    StartStep,
)
from runfold.errors import (
    AttemptsExhausted,
    EntityConflict,
    HistoryError,
    InvalidCommand,
    NonDeterministic,
    RunExpired,
    StepNotFound,
    TerminalState,
    TooEarly,
)
from runfold.events import (
    DEFAULT_RETRY,
    Envelope,
    RetryPolicy,
    RunCreated,
    RunStarted,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
)
from runfold.kernel import WakeupDue, project_run
from tests.conftest import T0, Clock
from tests.support.rules_helpers import (
    ALL_STATUSES,
    LIVE,
    RUN,
    TERMINAL,
    assert_rejected,
    kinds,
    run_in_status,
    run_with,
)

STEP = "s1"
LATER = timedelta(seconds=30)
POLICY = RetryPolicy(max_attempts=3, initial_interval=timedelta(seconds=2))

DEFINE = CreateStep(step_id=STEP, step_name="charge", input=b"card", retry=POLICY)
LAZY = LazyStep(step_name="charge", input=b"card", retry=POLICY)
START = StartStep(step_id=STEP)

# The commands that bring step STEP into each status on a live run.
STEP_SETUP: dict[str, tuple[Command, ...]] = {
    "pending": (DEFINE,),
    "running": (DEFINE, START),
    "completed": (DEFINE, START, CompleteStep(step_id=STEP, output=b"ok")),
    "failed": (DEFINE, START, FailStep(step_id=STEP, error=b"no")),
    "cancelled": (DEFINE, CancelStep(step_id=STEP, reason="skip")),
}
STEP_TERMINAL = ("completed", "failed", "cancelled")


async def run_with_step(handler: CommandHandler, run_status: str, step_status: str) -> Snapshot:
    """A run in `run_status` whose step STEP is in `step_status` (set while the run was live)."""
    snap = await run_with(handler, run_status, *STEP_SETUP[step_status])
    assert snap.steps[STEP].status == step_status
    return snap


# --- CreateStep ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", LIVE)
async def test_create_step_on_a_live_run(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_in_status(handler, status)
    clock.advance(LATER)

    outcome = await handler.execute(RUN, DEFINE)

    assert [e.event for e in outcome.appended] == [
        StepCreated(step_id=STEP, step_name="charge", input=b"card", retry=POLICY)
    ]
    step = outcome.snapshot.steps[STEP]
    assert (step.step_id, step.step_name, step.input, step.retry) == (
        STEP,
        "charge",
        b"card",
        POLICY,
    )
    assert (step.status, step.attempt, step.output, step.error, step.retry_after) == (
        "pending",
        0,
        None,
        None,
        None,
    )
    assert (step.created_at, step.updated_at, step.started_at, step.completed_at) == (
        T0 + LATER,
        T0 + LATER,
        None,
        None,
    )
    assert outcome.snapshot.status == status


@pytest.mark.parametrize("status", TERMINAL)
async def test_create_step_on_an_ended_run_is_terminal_state(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    await assert_rejected(
        handler,
        DEFINE,
        TerminalState,
        "cannot create new entities on run",
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("step_status", ["pending", "running", "completed"])
async def test_create_step_again_is_an_entity_conflict(
    handler: CommandHandler, step_status: str
) -> None:
    await run_with_step(handler, "running", step_status)
    await assert_rejected(handler, DEFINE, EntityConflict, repr(STEP), "already exists")


@pytest.mark.parametrize("retry", [None, RetryPolicy()])
async def test_create_step_again_with_another_retry_policy_is_the_same_step(
    handler: CommandHandler, retry: RetryPolicy | None
) -> None:
    """A step's identity is its name and input: a deploy that changed the policy is no conflict."""
    await run_with_step(handler, "running", "pending")
    await assert_rejected(
        handler, attrs.evolve(DEFINE, retry=retry), EntityConflict, repr(STEP), "already exists"
    )
    assert (await handler.snapshot(RUN)).steps[STEP].retry == POLICY


@pytest.mark.parametrize("changes", [{"step_name": "refund"}, {"input": b"other"}])
async def test_create_step_again_with_another_definition_is_non_deterministic(
    handler: CommandHandler, changes: dict[str, Any]
) -> None:
    await run_with_step(handler, "running", "pending")
    await assert_rejected(
        handler,
        attrs.evolve(DEFINE, **changes),
        NonDeterministic,
        repr(STEP),
        "another definition",
    )


# --- StartStep ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", LIVE)
async def test_lazy_start_creates_and_starts_an_unknown_step(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    before = await run_in_status(handler, status)
    clock.advance(LATER)

    outcome = await handler.execute(RUN, StartStep(step_id=STEP, lazy=LAZY))

    assert outcome.created_step
    assert [e.event for e in outcome.appended] == [
        StepCreated(step_id=STEP, step_name="charge", input=b"card", retry=POLICY),
        StepStarted(step_id=STEP, attempt=1),
    ]
    assert [e.sequence for e in outcome.appended] == [
        before.last_sequence + 1,
        before.last_sequence + 2,
    ]
    step = outcome.snapshot.steps[STEP]
    assert (step.status, step.attempt, step.started_at) == ("running", 1, T0 + LATER)


async def test_start_of_a_pending_step_is_attempt_one(
    handler: CommandHandler, clock: Clock
) -> None:
    await run_with_step(handler, "running", "pending")
    clock.advance(LATER)

    outcome = await handler.execute(RUN, START)

    assert not outcome.created_step
    assert [e.event for e in outcome.appended] == [StepStarted(step_id=STEP, attempt=1)]
    step = outcome.snapshot.steps[STEP]
    assert (step.status, step.attempt, step.started_at, step.updated_at) == (
        "running",
        1,
        T0 + LATER,
        T0 + LATER,
    )


async def test_start_of_an_unknown_step_without_lazy_is_step_not_found(
    handler: CommandHandler,
) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(handler, START, StepNotFound, repr(STEP), "not found")


@pytest.mark.parametrize("step_status", ["pending", "running", "completed"])
async def test_lazy_start_of_a_known_step_lost_the_race(
    handler: CommandHandler, step_status: str
) -> None:
    before = await run_with_step(handler, "running", step_status)

    await assert_rejected(
        handler,
        StartStep(step_id=STEP, lazy=LAZY),
        EntityConflict,
        repr(STEP),
        "another caller created it first",
    )
    assert (await handler.snapshot(RUN)).steps[STEP] == before.steps[STEP]


async def test_concurrent_lazy_starts_have_exactly_one_winner(
    handler: CommandHandler, clock: Clock
) -> None:
    await run_in_status(handler, "running")
    rival = CommandHandler(handler.store, clock=clock)
    await rival.snapshot(RUN)  # both handlers now hold the same cached snapshot

    results = await asyncio.gather(
        handler.execute(RUN, StartStep(step_id=STEP, lazy=LAZY)),
        rival.execute(RUN, StartStep(step_id=STEP, lazy=LAZY)),
        return_exceptions=True,
    )

    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1 and winners[0].created_step
    assert len(losers) == 1 and type(losers[0]) is EntityConflict
    history = await handler.history(RUN)
    assert [e.event.event_type for e in history] == [
        "run_created",
        "run_started",
        "step_created",
        "step_started",
    ]


@pytest.mark.parametrize("step_status", STEP_TERMINAL)
async def test_start_of_an_ended_step_is_terminal_state(
    handler: CommandHandler, step_status: str
) -> None:
    await run_with_step(handler, "running", step_status)
    await assert_rejected(
        handler, START, TerminalState, "cannot modify step", f"in terminal state {step_status!r}"
    )


@pytest.mark.parametrize("step_status", ["pending", "running"])
@pytest.mark.parametrize("status", TERMINAL)
async def test_start_of_a_step_on_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str, step_status: str
) -> None:
    await run_with_step(handler, status, step_status)
    await assert_rejected(
        handler,
        START,
        RunExpired,
        f"cannot start step {STEP!r}",
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("status", TERMINAL)
async def test_lazy_start_on_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    await assert_rejected(
        handler,
        StartStep(step_id=STEP, lazy=LAZY),
        RunExpired,
        f"cannot start step {STEP!r}",
        f"in terminal state {status!r}",
    )
    assert STEP not in (await handler.snapshot(RUN)).steps


async def test_start_before_retry_after_is_too_early(handler: CommandHandler, clock: Clock) -> None:
    await run_with_step(handler, "running", "running")
    due = clock.now + LATER
    await handler.execute(RUN, RetryStep(step_id=STEP, error=b"flaky", retry_after=due))
    clock.advance(LATER - timedelta(microseconds=1))

    exc = await assert_rejected(handler, START, TooEarly, repr(STEP), due.isoformat())

    assert exc.retry_after == due
    clock.advance(timedelta(microseconds=1))  # now == retry_after: due
    outcome = await handler.execute(RUN, START)
    assert [e.event for e in outcome.appended] == [StepStarted(step_id=STEP, attempt=2)]
    step = outcome.snapshot.steps[STEP]
    assert (step.status, step.attempt, step.retry_after, step.error) == (
        "running",
        2,
        None,
        b"flaky",
    )


async def test_start_of_a_running_step_is_a_crash_redelivery(
    handler: CommandHandler, clock: Clock
) -> None:
    await run_with_step(handler, "running", "running")
    first_start = clock.now

    started = []
    for _ in range(2):
        clock.advance(LATER)
        outcome = await handler.execute(RUN, START)
        assert not outcome.created_step
        [envelope] = outcome.appended
        started.append(envelope.event)

    # The history says the attempt before each of these was interrupted.
    assert started == [
        StepStarted(step_id=STEP, attempt=2, after_interruption=True),
        StepStarted(step_id=STEP, attempt=3, after_interruption=True),
    ]
    step = (await handler.snapshot(RUN)).steps[STEP]
    assert (step.status, step.attempt, step.started_at, step.updated_at) == (
        "running",
        3,
        first_start,
        clock.now,
    )


async def test_the_history_of_a_crash_inside_a_step(handler: CommandHandler) -> None:
    """A retried attempt and an interrupted one read apart in the history."""
    await run_with_step(handler, "running", "running")
    await handler.execute(RUN, RetryStep(step_id=STEP, error=b"flaky"))
    await handler.execute(RUN, START)  # attempt 2; then the process dies inside the body
    await handler.execute(RUN, START)  # attempt 3, by the process that recovered the run
    await handler.execute(RUN, CompleteStep(step_id=STEP, output=b"ok"))

    steps = [e.event for e in await handler.history(RUN) if e.event.event_type.startswith("step")]
    assert steps == [
        StepCreated(step_id=STEP, step_name="charge", input=b"card", retry=POLICY),
        StepStarted(step_id=STEP, attempt=1),
        StepRetrying(step_id=STEP, error=b"flaky"),
        StepStarted(step_id=STEP, attempt=2),
        StepStarted(step_id=STEP, attempt=3, after_interruption=True),
        StepCompleted(step_id=STEP, output=b"ok"),
    ]


# --- a retry policy changed by a deploy ---------------------------------------------------------

NEW_POLICY = RetryPolicy(max_attempts=5, initial_interval=timedelta(seconds=10))


@pytest.mark.parametrize("step_status", ["pending", "running"])
async def test_a_new_retry_policy_applies_from_the_next_attempt(
    handler: CommandHandler, step_status: str
) -> None:
    await run_with_step(handler, "running", step_status)

    outcome = await handler.execute(RUN, StartStep(step_id=STEP, retry=NEW_POLICY))

    attempt = 2 if step_status == "running" else 1
    assert [e.event for e in outcome.appended] == [
        StepStarted(
            step_id=STEP,
            attempt=attempt,
            after_interruption=step_status == "running",
            retry=NEW_POLICY,
        )
    ]
    assert outcome.snapshot.steps[STEP].retry == NEW_POLICY
    # The same policy again changes nothing, and records nothing of it.
    outcome = await handler.execute(RUN, StartStep(step_id=STEP, retry=NEW_POLICY))
    assert [e.event for e in outcome.appended] == [
        StepStarted(step_id=STEP, attempt=attempt + 1, after_interruption=True)
    ]
    assert outcome.snapshot.steps[STEP].retry == NEW_POLICY


async def test_a_new_policy_gives_an_interrupted_last_attempt_a_successor(
    handler: CommandHandler,
) -> None:
    once = RetryPolicy(max_attempts=1)
    await run_with(handler, "running", attrs.evolve(DEFINE, retry=once), START)
    await assert_rejected(handler, START, AttemptsExhausted, repr(STEP), "1 of 1", "interrupted")

    outcome = await handler.execute(RUN, StartStep(step_id=STEP, retry=NEW_POLICY))

    step = outcome.snapshot.steps[STEP]
    assert (step.status, step.attempt, step.retry) == ("running", 2, NEW_POLICY)
    # The budget of RetryStep is the new policy's too.
    await handler.execute(RUN, RetryStep(step_id=STEP, error=b"flaky"))
    assert (await handler.snapshot(RUN)).steps[STEP].status == "pending"


@pytest.mark.parametrize("step_status", ["pending", "running"])
async def test_a_new_policy_with_no_attempt_left_is_attempts_exhausted(
    handler: CommandHandler, step_status: str
) -> None:
    await run_with_step(handler, "running", "running")
    await handler.execute(RUN, RetryStep(step_id=STEP, error=b"flaky"))
    await handler.execute(RUN, START)  # attempt 2
    if step_status == "pending":
        await handler.execute(RUN, RetryStep(step_id=STEP, error=b"flaky"))

    fewer = RetryPolicy(max_attempts=2)
    await assert_rejected(
        handler, StartStep(step_id=STEP, retry=fewer), AttemptsExhausted, repr(STEP), "2 of 2"
    )
    assert (await handler.snapshot(RUN)).steps[STEP].retry == POLICY


async def test_retry_goes_with_an_existing_step_not_with_lazy(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(
        handler,
        StartStep(step_id=STEP, lazy=LAZY, retry=NEW_POLICY),
        InvalidCommand,
        "lazy.retry",
    )


def test_a_history_may_not_mark_a_pending_step_interrupted() -> None:
    events = [
        RunCreated(workflow_name="wf", input=b""),
        RunStarted(),
        StepCreated(step_id=STEP, step_name="charge", input=b"card"),
        StepStarted(step_id=STEP, attempt=1, after_interruption=True),
    ]
    history = [
        Envelope(run_id=RUN, sequence=n, event=event, recorded_at=T0)
        for n, event in enumerate(events, start=1)
    ]
    with pytest.raises(HistoryError, match="after an interruption") as raised:
        project_run(history)
    assert raised.value.sequence == 4
    # Before the marker existed, an attempt after an interruption was written without it.
    unmarked = [*history[:3], attrs.evolve(history[3], event=StepStarted(step_id=STEP, attempt=1))]
    started = StepStarted(step_id=STEP, attempt=2)
    again = Envelope(run_id=RUN, sequence=5, event=started, recorded_at=T0)
    assert project_run([*unmarked, again]).steps[STEP].attempt == 2


# --- CompleteStep and FailStep ------------------------------------------------------------------


@attrs.frozen
class Finish:
    command: Command
    event: Any
    status: str
    field: str
    value: bytes


FINISHES = {
    "complete": Finish(
        CompleteStep(step_id=STEP, output=b"out"),
        StepCompleted(step_id=STEP, output=b"out"),
        "completed",
        "output",
        b"out",
    ),
    "fail": Finish(
        FailStep(step_id=STEP, error=b"err", retryable=True),
        StepFailed(step_id=STEP, error=b"err", retryable=True),
        "failed",
        "error",
        b"err",
    ),
}


@pytest.mark.parametrize("finish", FINISHES)
async def test_finishing_an_unknown_step_is_step_not_found(
    handler: CommandHandler, finish: str
) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(handler, FINISHES[finish].command, StepNotFound, repr(STEP))


@pytest.mark.parametrize("step_status", STEP_TERMINAL)
@pytest.mark.parametrize("finish", FINISHES)
async def test_finishing_an_ended_step_is_terminal_state(
    handler: CommandHandler, finish: str, step_status: str
) -> None:
    await run_with_step(handler, "running", step_status)
    await assert_rejected(
        handler,
        FINISHES[finish].command,
        TerminalState,
        "cannot modify step",
        f"in terminal state {step_status!r}",
    )


async def _assert_finished(
    handler: CommandHandler, clock: Clock, finish: Finish, run_status: str, step_status: str
) -> None:
    before = await run_with_step(handler, run_status, step_status)
    clock.advance(LATER)

    outcome = await handler.execute(RUN, finish.command)

    assert [e.event for e in outcome.appended] == [finish.event]
    assert outcome.appended[0].sequence == before.last_sequence + 1
    step = outcome.snapshot.steps[STEP]
    assert (step.status, getattr(step, finish.field), step.completed_at) == (
        finish.status,
        finish.value,
        T0 + LATER,
    )
    assert outcome.snapshot.status == run_status
    # The late outcome is a valid history: a fresh handler folds it from the store alike.
    reread = await CommandHandler(handler.store, clock=clock).snapshot(RUN)
    assert reread.steps[STEP] == step and reread.status == run_status


@pytest.mark.parametrize("status", ALL_STATUSES)
@pytest.mark.parametrize("finish", FINISHES)
async def test_a_running_step_finishes_whatever_the_run_state(
    handler: CommandHandler, clock: Clock, finish: str, status: str
) -> None:
    await _assert_finished(handler, clock, FINISHES[finish], status, "running")


@pytest.mark.parametrize("status", LIVE)
@pytest.mark.parametrize("finish", FINISHES)
async def test_a_pending_step_of_a_live_run_finishes_instantly(
    handler: CommandHandler, clock: Clock, finish: str, status: str
) -> None:
    await _assert_finished(handler, clock, FINISHES[finish], status, "pending")


@pytest.mark.parametrize("status", TERMINAL)
@pytest.mark.parametrize("finish", FINISHES)
async def test_a_pending_step_of_an_ended_run_cannot_finish(
    handler: CommandHandler, finish: str, status: str
) -> None:
    await run_with_step(handler, status, "pending")
    await assert_rejected(
        handler,
        FINISHES[finish].command,
        RunExpired,
        f"cannot finish pending step {STEP!r}",
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("finish", FINISHES)
async def test_a_step_cancelled_with_its_run_cannot_finish_late(
    handler: CommandHandler, finish: str
) -> None:
    await run_with_step(handler, "running", "running")
    await handler.execute(RUN, RequestCancel(reason="stop"))  # cancels the running step
    await handler.execute(RUN, CancelRun(reason="stop"))

    await assert_rejected(
        handler,
        FINISHES[finish].command,
        TerminalState,
        "cannot modify step",
        "in terminal state 'cancelled'",
    )


# --- RetryStep ----------------------------------------------------------------------------------


async def test_retrying_an_unknown_step_is_step_not_found(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(handler, RetryStep(step_id=STEP, error=b"e"), StepNotFound, repr(STEP))


@pytest.mark.parametrize("step_status", STEP_TERMINAL)
async def test_retrying_an_ended_step_is_terminal_state(
    handler: CommandHandler, step_status: str
) -> None:
    await run_with_step(handler, "running", step_status)
    await assert_rejected(
        handler,
        RetryStep(step_id=STEP, error=b"e"),
        TerminalState,
        "cannot modify step",
        f"in terminal state {step_status!r}",
    )


async def test_the_same_retry_again_is_a_no_op(handler: CommandHandler) -> None:
    await run_with_step(handler, "running", "running")
    retry = RetryStep(step_id=STEP, error=b"e", retry_after=T0 + LATER)
    first = await handler.execute(RUN, retry)

    again = await handler.execute(RUN, retry)

    assert [e.event.event_type for e in first.appended] == ["step_retrying"]
    assert again.appended == ()
    assert (await handler.history(RUN))[-1] == first.appended[-1]  # nothing after it


@pytest.mark.parametrize("retried", [False, True], ids=["never started", "already retrying"])
async def test_retrying_a_pending_step_is_invalid(handler: CommandHandler, retried: bool) -> None:
    await run_with_step(handler, "running", "running" if retried else "pending")
    if retried:
        await handler.execute(RUN, RetryStep(step_id=STEP, error=b"first"))

    await assert_rejected(
        handler,
        RetryStep(step_id=STEP, error=b"e"),
        InvalidCommand,
        repr(STEP),
        "is pending, not running",
    )


@pytest.mark.parametrize("status", TERMINAL)
async def test_retrying_a_step_of_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str
) -> None:
    await run_with_step(handler, status, "running")
    await assert_rejected(
        handler,
        RetryStep(step_id=STEP, error=b"e"),
        RunExpired,
        f"cannot retry step {STEP!r}",
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("delay", [None, LATER], ids=["now", "later"])
@pytest.mark.parametrize("status", LIVE)
async def test_retrying_a_running_step_puts_it_back_to_pending(
    handler: CommandHandler, clock: Clock, status: str, delay: timedelta | None
) -> None:
    await run_with_step(handler, status, "running")
    clock.advance(LATER)
    retry_after = None if delay is None else clock.now + delay

    outcome = await handler.execute(
        RUN, RetryStep(step_id=STEP, error=b"flaky", retry_after=retry_after)
    )

    assert [e.event for e in outcome.appended] == [
        StepRetrying(step_id=STEP, error=b"flaky", retry_after=retry_after)
    ]
    step = outcome.snapshot.steps[STEP]
    assert (step.status, step.attempt, step.error, step.retry_after, step.updated_at) == (
        "pending",
        1,
        b"flaky",
        retry_after,
        T0 + LATER,
    )
    retries = [w for w in outcome.snapshot.wakeups() if w.kind == "retry"]
    expected = (
        []
        if retry_after is None
        else [WakeupDue(kind="retry", subject_id=STEP, due_at=retry_after)]
    )
    assert retries == expected


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
async def test_retrying_past_the_budget_is_invalid(
    handler: CommandHandler, max_attempts: int
) -> None:
    policy = RetryPolicy(max_attempts=max_attempts)
    await run_with(handler, "running", attrs.evolve(DEFINE, retry=policy))
    for _ in range(max_attempts - 1):
        await handler.execute(RUN, START)
        await handler.execute(RUN, RetryStep(step_id=STEP, error=b"e"))
    await handler.execute(RUN, START)

    await assert_rejected(
        handler,
        RetryStep(step_id=STEP, error=b"last"),
        InvalidCommand,
        "retry budget exhausted",
        f"{max_attempts} of {max_attempts} attempts",
        "FailStep",
    )
    outcome = await handler.execute(RUN, FailStep(step_id=STEP, error=b"last"))
    step = outcome.snapshot.steps[STEP]
    assert (step.status, step.attempt) == ("failed", max_attempts)


async def test_a_step_without_a_policy_follows_the_default_budget(
    handler: CommandHandler,
) -> None:
    """No race gets a step past the default policy's attempts: the kernel bounds it too."""
    await run_with(handler, "running", attrs.evolve(DEFINE, retry=None))
    for _ in range(DEFAULT_RETRY.max_attempts - 1):
        await handler.execute(RUN, START)
        outcome = await handler.execute(RUN, RetryStep(step_id=STEP, error=b"e"))
        assert kinds(outcome) == ["step_retrying"]
    await handler.execute(RUN, START)

    with pytest.raises(InvalidCommand, match="retry budget exhausted"):
        await handler.execute(RUN, RetryStep(step_id=STEP, error=b"e"))
    # Interrupted in its last attempt (still running), it gets no other start either.
    with pytest.raises(AttemptsExhausted, match="3 of 3"):
        await handler.execute(RUN, START)
    outcome = await handler.execute(RUN, FailStep(step_id=STEP, error=b"e", retryable=True))
    assert outcome.snapshot.steps[STEP].attempt == DEFAULT_RETRY.max_attempts


# --- CancelStep ---------------------------------------------------------------------------------


@pytest.mark.parametrize("step_status", ["pending", "running"])
@pytest.mark.parametrize("status", LIVE)
async def test_cancelling_a_live_step(
    handler: CommandHandler, clock: Clock, status: str, step_status: str
) -> None:
    await run_with_step(handler, status, step_status)
    clock.advance(LATER)

    outcome = await handler.execute(RUN, CancelStep(step_id=STEP, reason="not needed"))

    assert [e.event for e in outcome.appended] == [StepCancelled(step_id=STEP, reason="not needed")]
    step = outcome.snapshot.steps[STEP]
    assert (step.status, step.completed_at) == ("cancelled", T0 + LATER)
    assert outcome.snapshot.status == status


@pytest.mark.parametrize("step_status", [s for s in STEP_TERMINAL if s != "cancelled"])
async def test_cancelling_an_ended_step_is_terminal_state(
    handler: CommandHandler, step_status: str
) -> None:
    await run_with_step(handler, "running", step_status)
    await assert_rejected(
        handler,
        CancelStep(step_id=STEP),
        TerminalState,
        "cannot modify step",
        f"in terminal state {step_status!r}",
    )


async def test_cancelling_a_cancelled_step_again_is_a_no_op(handler: CommandHandler) -> None:
    await run_with_step(handler, "running", "cancelled")
    before = await handler.history(RUN)

    outcome = await handler.execute(RUN, CancelStep(step_id=STEP))

    assert outcome.appended == ()
    assert await handler.history(RUN) == before


async def test_cancelling_an_unknown_step_is_step_not_found(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(handler, CancelStep(step_id=STEP), StepNotFound, repr(STEP))


@pytest.mark.parametrize("step_status", ["pending", "running"])
@pytest.mark.parametrize("status", TERMINAL)
async def test_cancelling_a_step_of_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str, step_status: str
) -> None:
    # RULES.md does not name this case; the history laws allow no step_cancelled after the run
    # ended, so the kernel refuses it like the other step commands do.
    await run_with_step(handler, status, step_status)
    await assert_rejected(
        handler,
        CancelStep(step_id=STEP),
        RunExpired,
        f"cannot cancel step {STEP!r}",
        f"in terminal state {status!r}",
    )
