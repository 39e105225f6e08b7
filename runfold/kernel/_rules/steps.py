"""The rules of the step commands: a step's creation, each attempt, and how it ends.

A step's identity is its name and input, and it is created once (`CreateStep`, or a lazy
`StartStep`). An attempt starts no earlier than a retry allows and only while the step's retry
policy leaves one; a step ends once (completed, failed or cancelled), and only a running step is
retried. A step still running when its run ended may still record its outcome. A command
applied already and sent again (its reply lost) is recognised by what it recorded: an outcome
by its content, a start by its `start_id`; it is a no-op, not a refusal.
"""

from __future__ import annotations

from typing import Any

from runfold.kernel._pmap import stored
from runfold.kernel._rules.context import NOOP, NewEvents, Rule, RuleContext
from runfold.kernel.commands import (
    CancelStep,
    Command,
    CompleteStep,
    CreateStep,
    FailStep,
    RetryStep,
    StartStep,
)
from runfold.kernel.errors import (
    AttemptsExhausted,
    EntityConflict,
    InvalidCommand,
    NonDeterministic,
    RunExpired,
    StepNotFound,
    TerminalState,
    TooEarly,
)
from runfold.kernel.events import (
    DEFAULT_RETRY,
    RetryPolicy,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
)
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, Snapshot

__all__ = ["STEP_RULES"]


def _step_record(ctx: RuleContext, step_id: str) -> Any:
    snap = ctx.run()
    record = stored(snap.steps, step_id)
    if record is None:
        raise StepNotFound(f"step {step_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id)
    return record


def _policy(record: Any) -> RetryPolicy:
    """The step's recorded retry policy, or the default one a step without one follows."""
    policy: RetryPolicy = record.retry if record.retry is not None else DEFAULT_RETRY
    return policy


def _same_definition(record: Any, step_name: str, input: bytes) -> bool:
    """A step's identity is its name and input; its retry policy may change (`StartStep.retry`)."""
    return bool(record.step_name == step_name and record.input == input)


def _create_step(ctx: RuleContext, cmd: CreateStep) -> NewEvents:
    snap = ctx.run()
    if snap.status not in LIVE_RUN_STATUSES:
        raise ctx.terminal("create new entities on")
    record = stored(snap.steps, cmd.step_id)
    if record is not None:
        if not _same_definition(record, cmd.step_name, cmd.input):
            raise NonDeterministic(
                f"step {cmd.step_id!r} already exists in run {snap.run_id!r} with another "
                "definition",
                run_id=snap.run_id,
            )
        raise EntityConflict(
            f"step {cmd.step_id!r} already exists in run {snap.run_id!r}", run_id=snap.run_id
        )
    return (
        StepCreated(step_id=cmd.step_id, step_name=cmd.step_name, input=cmd.input, retry=cmd.retry),
    )


def _step_terminal(snap: Snapshot, step_id: str, status: str) -> TerminalState:
    return TerminalState(
        f"cannot modify step {step_id!r} of run {snap.run_id!r} in terminal state {status!r}",
        run_id=snap.run_id,
    )


def _start_step(ctx: RuleContext, cmd: StartStep) -> NewEvents:
    snap = ctx.run()
    record = stored(snap.steps, cmd.step_id)
    if record is not None and cmd.start_id is not None and record.start_id == cmd.start_id:
        return NOOP  # this very start began the step's latest attempt: applied already
    run_ended = snap.status not in LIVE_RUN_STATUSES
    if record is None:
        if cmd.lazy is None:
            raise StepNotFound(
                f"step {cmd.step_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id
            )
        if run_ended:
            raise RunExpired(
                f"cannot start step {cmd.step_id!r} on run {snap.run_id!r} in terminal state "
                f"{snap.status!r}",
                run_id=snap.run_id,
            )
        lazy = cmd.lazy
        return (
            StepCreated(
                step_id=cmd.step_id, step_name=lazy.step_name, input=lazy.input, retry=lazy.retry
            ),
            StepStarted(step_id=cmd.step_id, attempt=1, start_id=cmd.start_id),
        )
    if cmd.lazy is not None:
        raise EntityConflict(
            f"step {cmd.step_id!r} already exists in run {snap.run_id!r}: another caller created "
            "it first",
            run_id=snap.run_id,
        )
    if record.status not in ("pending", "running"):
        raise _step_terminal(snap, cmd.step_id, record.status)
    if run_ended:
        raise RunExpired(
            f"cannot start step {cmd.step_id!r} on run {snap.run_id!r} in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )
    if record.retry_after is not None and record.retry_after > ctx.now:
        raise TooEarly(
            f"step {cmd.step_id!r} of run {snap.run_id!r} may not retry before "
            f"{record.retry_after.isoformat()}",
            run_id=snap.run_id,
            retry_after=record.retry_after,
        )
    # A new policy applies from this attempt on; the step keeps its own when none is given.
    changed = cmd.retry if cmd.retry is not None and cmd.retry != record.retry else None
    policy = changed if changed is not None else _policy(record)
    interrupted = record.status == "running"
    if record.attempt >= policy.max_attempts:
        what = "was interrupted in its last attempt" if interrupted else "has no attempt left"
        raise AttemptsExhausted(
            f"step {cmd.step_id!r} of run {snap.run_id!r} {what} "
            f"({record.attempt} of {policy.max_attempts}); fail it instead",
            run_id=snap.run_id,
        )
    return (
        StepStarted(
            step_id=cmd.step_id,
            attempt=record.attempt + 1,
            after_interruption=interrupted,
            retry=changed,
            start_id=cmd.start_id,
        ),
    )


def _step_outcome_allowed(ctx: RuleContext, step_id: str, record: Any) -> None:
    """Refuse an outcome (complete/fail) of the step, whose record is `record`, unless one may
    be recorded now."""
    snap = ctx.run()
    if record is None:
        raise StepNotFound(f"step {step_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id)
    if record.status not in ("pending", "running"):
        raise _step_terminal(snap, step_id, record.status)
    if record.status == "pending" and snap.status not in LIVE_RUN_STATUSES:
        raise RunExpired(
            f"cannot finish pending step {step_id!r}: run {snap.run_id!r} is in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )


def _complete_step(ctx: RuleContext, cmd: CompleteStep) -> NewEvents:
    record = stored(ctx.run().steps, cmd.step_id)
    if record is not None and record.status == "completed" and record.output == cmd.output:
        return NOOP  # the same outcome, recorded already (a retry whose reply was lost)
    _step_outcome_allowed(ctx, cmd.step_id, record)
    return (StepCompleted(step_id=cmd.step_id, output=cmd.output),)


def _fail_step(ctx: RuleContext, cmd: FailStep) -> NewEvents:
    record = stored(ctx.run().steps, cmd.step_id)
    if record is not None and record.status == "failed" and record.error == cmd.error:
        return NOOP  # the same outcome, recorded already
    _step_outcome_allowed(ctx, cmd.step_id, record)
    return (StepFailed(step_id=cmd.step_id, error=cmd.error, retryable=cmd.retryable),)


def _retry_step(ctx: RuleContext, cmd: RetryStep) -> NewEvents:
    snap = ctx.run()
    record = _step_record(ctx, cmd.step_id)
    if (
        record.status == "pending"
        and record.attempt
        and (record.error, record.retry_after) == (cmd.error, cmd.retry_after)
    ):
        return NOOP  # this retry, recorded already (its reply lost)
    if record.status in ("completed", "failed", "cancelled"):
        raise _step_terminal(snap, cmd.step_id, record.status)
    if record.status != "running":
        raise InvalidCommand(
            f"step {cmd.step_id!r} of run {snap.run_id!r} is {record.status}, not running: only "
            "a running step can be retried",
            run_id=snap.run_id,
        )
    if snap.status not in LIVE_RUN_STATUSES:
        raise RunExpired(
            f"cannot retry step {cmd.step_id!r}: run {snap.run_id!r} is in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )
    if record.attempt >= (policy := _policy(record)).max_attempts:
        raise InvalidCommand(
            f"step {cmd.step_id!r} of run {snap.run_id!r}: retry budget exhausted "
            f"({record.attempt} of {policy.max_attempts} attempts); use FailStep",
            run_id=snap.run_id,
        )
    return (StepRetrying(step_id=cmd.step_id, error=cmd.error, retry_after=cmd.retry_after),)


def _cancel_step(ctx: RuleContext, cmd: CancelStep) -> NewEvents:
    snap = ctx.run()
    record = _step_record(ctx, cmd.step_id)
    if record.status == "cancelled":
        return NOOP
    if record.status not in ("pending", "running"):
        raise _step_terminal(snap, cmd.step_id, record.status)
    if snap.status not in LIVE_RUN_STATUSES:
        raise RunExpired(
            f"cannot cancel step {cmd.step_id!r}: run {snap.run_id!r} is in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )
    return (StepCancelled(step_id=cmd.step_id, reason=cmd.reason),)


STEP_RULES: dict[type[Command], Rule] = {
    CreateStep: _create_step,
    StartStep: _start_step,
    CompleteStep: _complete_step,
    FailStep: _fail_step,
    RetryStep: _retry_step,
    CancelStep: _cancel_step,
}
"""The rule of each step command class."""
