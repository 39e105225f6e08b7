"""`decide`: the pure command decider, the rules every command is held to.

`decide(snapshot, command, *, now, limits, token_holder)` returns a `Decision` or raises a
`Rejection`; it never raises anything else, never reads a clock and never writes anything.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from runfold.kernel._rules.fields import FieldCheck, validate
from runfold.kernel.commands import (
    CancelRun,
    CancelStep,
    Command,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateRun,
    CreateStep,
    CreateWait,
    Decision,
    DisposeHook,
    FailRun,
    FailStep,
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
from runfold.kernel.errors import (
    AttemptsExhausted,
    EntityConflict,
    HistoryLimitExceeded,
    HookNotFound,
    InvalidCommand,
    NonDeterministic,
    Rejection,
    RunExpired,
    RunNotFound,
    RunNotSupported,
    StepNotFound,
    TerminalState,
    TooEarly,
    WaitNotFound,
)
from runfold.kernel.events import (
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
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    RunTimedOut,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from runfold.kernel.index import HookHolder
from runfold.kernel.limits import SPEC_VERSION, Limits
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, Snapshot

__all__ = ["decide"]

_DEFAULT_LIMITS = Limits()


# --- the rules ----------------------------------------------------------------------------------


class _Ctx(FieldCheck):
    """What every rule needs: the snapshot (None for no history), the time, the limits; and,
    being a `FieldCheck` of those limits, the validation of the command's fields."""

    __slots__ = ("now", "snapshot", "token_holder")

    def __init__(
        self,
        snapshot: Snapshot | None,
        run_id: str | None,
        now: datetime,
        limits: Limits,
        token_holder: HookHolder | None,
    ) -> None:
        self.snapshot = snapshot
        self.run_id = run_id
        self.now = now
        self.limits = limits
        self.token_holder = token_holder

    def run(self) -> Snapshot:
        if self.snapshot is None:
            raise RunNotFound(f"run {self.run_id!r} not found", run_id=self.run_id)
        return self.snapshot

    def terminal(self, doing: str) -> TerminalState:
        snap = self.run()
        return TerminalState(
            f"cannot {doing} run {snap.run_id!r} in terminal state {snap.status!r}",
            run_id=snap.run_id,
        )

    def live_run(self, doing: str) -> Snapshot:
        snap = self.run()
        if snap.status not in LIVE_RUN_STATUSES:
            raise self.terminal(doing)
        return snap


_Events = tuple[Event, ...]
_NOOP: _Events = ()


def _created(cmd: CreateRun) -> RunCreated:
    return RunCreated(
        workflow_name=cmd.workflow_name,
        input=cmd.input,
        workflow_version=cmd.workflow_version,
        deployment_id=cmd.deployment_id,
        context=cmd.context,
        attributes=cmd.attributes,
        parent_run_id=cmd.parent_run_id,
        deadline=cmd.deadline,
        spec_version=SPEC_VERSION,
    )


def _definition(of: Snapshot | CreateRun) -> tuple[object, ...]:
    """What a run is created with and keeps, but its attributes (which may change since)."""
    return (
        of.workflow_name,
        of.workflow_version,
        of.deployment_id,
        of.input,
        of.context,
        of.parent_run_id,
        of.deadline,
    )


def _create_run(ctx: _Ctx, cmd: CreateRun) -> _Events:
    if ctx.snapshot is not None:
        raise EntityConflict(f"run {ctx.snapshot.run_id!r} already exists", run_id=ctx.run_id)
    return (_created(cmd),)


def _start_run(ctx: _Ctx, cmd: StartRun) -> _Events:
    snap = ctx.snapshot
    if snap is None:
        if cmd.create is None:
            raise RunNotFound(f"run {ctx.run_id!r} not found", run_id=ctx.run_id)
        return (_created(cmd.create), RunStarted())
    if cmd.create is not None and _definition(snap) != _definition(cmd.create):
        raise NonDeterministic(
            f"run {snap.run_id!r} already exists with another definition", run_id=snap.run_id
        )
    if snap.status == "pending":
        return (RunStarted(),)
    if snap.status in ("running", "cancelling"):
        return _NOOP
    raise RunExpired(
        f"run {snap.run_id!r} already in terminal state {snap.status!r}", run_id=snap.run_id
    )


def _complete_run(ctx: _Ctx, cmd: CompleteRun) -> _Events:
    snap = ctx.run()
    if snap.status == "cancelling":
        raise TerminalState(
            f"cannot complete run {snap.run_id!r}: a cancelling run ends as cancelled, failed "
            "or timed out",
            run_id=snap.run_id,
        )
    if snap.status not in LIVE_RUN_STATUSES:
        raise ctx.terminal("transition")
    return (RunCompleted(output=cmd.output),)


def _fail_run(ctx: _Ctx, cmd: FailRun) -> _Events:
    ctx.live_run("transition")
    return (RunFailed(error=cmd.error, error_code=cmd.error_code),)


def _request_cancel(ctx: _Ctx, cmd: RequestCancel) -> _Events:
    snap = ctx.run()
    if snap.status in ("pending", "running"):
        return (CancelRequested(reason=cmd.reason),)
    if snap.status == "cancelled":
        return _NOOP
    if snap.status == "cancelling":
        assert snap.cancellation is not None
        if snap.cancellation.reason == cmd.reason:
            return _NOOP
        raise EntityConflict(
            f"run {snap.run_id!r} is already cancelling for another reason", run_id=snap.run_id
        )
    raise ctx.terminal("request cancellation of")


def _cancel_run(ctx: _Ctx, cmd: CancelRun) -> _Events:
    snap = ctx.run()
    if snap.status == "cancelled":
        return _NOOP
    ctx.live_run("transition")
    return (RunCancelled(reason=cmd.reason),)


def _time_out_run(ctx: _Ctx, cmd: TimeOutRun) -> _Events:
    ctx.live_run("transition")
    return (RunTimedOut(deadline=cmd.deadline, reason=cmd.reason),)


def _set_attributes(ctx: _Ctx, cmd: SetAttributes) -> _Events:
    snap = ctx.run()
    ctx.attribute_count(snap.attributes, cmd.changes)
    ctx.live_run("set attributes on")
    if cmd.write_id is not None and cmd.write_id in snap.attribute_write_ids:
        raise EntityConflict(
            f"attribute write {cmd.write_id!r} was already applied to run {snap.run_id!r}",
            run_id=snap.run_id,
        )
    return (
        AttributesSet(
            changes=cmd.changes,
            writer=cmd.writer,
            write_id=cmd.write_id,
            allow_reserved=cmd.allow_reserved,
        ),
    )


def _record_progress(ctx: _Ctx, cmd: RecordProgress) -> _Events:
    snap = ctx.run()
    event = ProgressRecorded(
        progress_id=cmd.progress_id,
        completed=cmd.completed,
        total=cmd.total,
        message=cmd.message,
        details=cmd.details,
    )
    return _once(
        ctx, snap, snap.progress.raw(cmd.progress_id), event, f"progress {cmd.progress_id!r}"
    )


def _link_child(ctx: _Ctx, cmd: LinkChild) -> _Events:
    snap = ctx.run()
    event = ChildLinked(
        reference_id=cmd.reference_id,
        kind=cmd.kind,
        operation_id=cmd.operation_id,
        child_run_id=cmd.child_run_id,
        metadata=cmd.metadata,
    )
    return _once(
        ctx, snap, snap.children.raw(cmd.reference_id), event, f"child {cmd.reference_id!r}"
    )


def _once(ctx: _Ctx, snap: Snapshot, recorded: Event | None, event: Event, what: str) -> _Events:
    """Record `event` once per id: the same content again is a no-op, other content a conflict."""
    if recorded is not None:
        if recorded == event:
            return _NOOP
        raise NonDeterministic(
            f"{what} was already recorded on run {snap.run_id!r} with other content",
            run_id=snap.run_id,
        )
    ctx.live_run("record on")
    return (event,)


def _record_log(ctx: _Ctx, cmd: RecordLog) -> _Events:
    ctx.live_run("log on")
    return (LogRecorded(level=cmd.level, message=cmd.message, step_id=cmd.step_id, data=cmd.data),)


def _step_record(ctx: _Ctx, step_id: str) -> Any:
    snap = ctx.run()
    record = snap.steps.raw(step_id)
    if record is None:
        raise StepNotFound(f"step {step_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id)
    return record


def _same_definition(record: Any, step_name: str, input: bytes) -> bool:
    """A step's identity is its name and input; its retry policy may change (`StartStep.retry`)."""
    return bool(record.step_name == step_name and record.input == input)


def _create_step(ctx: _Ctx, cmd: CreateStep) -> _Events:
    snap = ctx.run()
    if snap.status not in LIVE_RUN_STATUSES:
        raise ctx.terminal("create new entities on")
    record = snap.steps.raw(cmd.step_id)
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


def _start_step(ctx: _Ctx, cmd: StartStep) -> _Events:
    snap = ctx.run()
    record = snap.steps.raw(cmd.step_id)
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
            StepStarted(step_id=cmd.step_id, attempt=1),
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
    policy = changed if changed is not None else record.retry
    interrupted = record.status == "running"
    if policy is not None and record.attempt >= policy.max_attempts:
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
        ),
    )


def _step_outcome_allowed(ctx: _Ctx, step_id: str) -> Any:
    """The step record if an outcome (complete/fail) may be recorded for it now."""
    snap = ctx.run()
    record = _step_record(ctx, step_id)
    if record.status not in ("pending", "running"):
        raise _step_terminal(snap, step_id, record.status)
    if record.status == "pending" and snap.status not in LIVE_RUN_STATUSES:
        raise RunExpired(
            f"cannot finish pending step {step_id!r}: run {snap.run_id!r} is in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )
    return record


def _complete_step(ctx: _Ctx, cmd: CompleteStep) -> _Events:
    _step_outcome_allowed(ctx, cmd.step_id)
    return (StepCompleted(step_id=cmd.step_id, output=cmd.output),)


def _fail_step(ctx: _Ctx, cmd: FailStep) -> _Events:
    _step_outcome_allowed(ctx, cmd.step_id)
    return (StepFailed(step_id=cmd.step_id, error=cmd.error, retryable=cmd.retryable),)


def _retry_step(ctx: _Ctx, cmd: RetryStep) -> _Events:
    snap = ctx.run()
    record = _step_record(ctx, cmd.step_id)
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
    if record.retry is not None and record.attempt >= record.retry.max_attempts:
        raise InvalidCommand(
            f"step {cmd.step_id!r} of run {snap.run_id!r}: retry budget exhausted "
            f"({record.attempt} of {record.retry.max_attempts} attempts); use FailStep",
            run_id=snap.run_id,
        )
    return (StepRetrying(step_id=cmd.step_id, error=cmd.error, retry_after=cmd.retry_after),)


def _cancel_step(ctx: _Ctx, cmd: CancelStep) -> _Events:
    snap = ctx.run()
    record = _step_record(ctx, cmd.step_id)
    if record.status not in ("pending", "running"):
        raise _step_terminal(snap, cmd.step_id, record.status)
    if snap.status not in LIVE_RUN_STATUSES:
        raise RunExpired(
            f"cannot cancel step {cmd.step_id!r}: run {snap.run_id!r} is in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )
    return (StepCancelled(step_id=cmd.step_id, reason=cmd.reason),)


def _create_wait(ctx: _Ctx, cmd: CreateWait) -> _Events:
    snap = ctx.live_run("create new entities on")
    record = snap.waits.raw(cmd.wait_id)
    if record is not None:
        if record.resume_at != cmd.resume_at:
            raise NonDeterministic(
                f"wait {cmd.wait_id!r} already exists in run {snap.run_id!r} with another "
                "resume_at",
                run_id=snap.run_id,
            )
        raise EntityConflict(
            f"wait {cmd.wait_id!r} already exists in run {snap.run_id!r}", run_id=snap.run_id
        )
    return (WaitCreated(wait_id=cmd.wait_id, resume_at=cmd.resume_at),)


def _complete_wait(ctx: _Ctx, cmd: CompleteWait) -> _Events:
    snap = ctx.run()
    record = snap.waits.raw(cmd.wait_id)
    if record is None:
        raise WaitNotFound(
            f"wait {cmd.wait_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id
        )
    if record.status == "completed":
        raise EntityConflict(
            f"wait {cmd.wait_id!r} of run {snap.run_id!r} already completed", run_id=snap.run_id
        )
    if record.status == "cancelled":
        raise TerminalState(
            f"cannot complete wait {cmd.wait_id!r} of run {snap.run_id!r} in terminal state "
            "'cancelled'",
            run_id=snap.run_id,
        )
    if snap.status not in LIVE_RUN_STATUSES:
        raise RunExpired(
            f"cannot complete wait {cmd.wait_id!r}: run {snap.run_id!r} is in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )
    return (WaitCompleted(wait_id=cmd.wait_id),)


def _create_hook(ctx: _Ctx, cmd: CreateHook) -> _Events:
    if (
        cmd.retain_token_until is not None
        # A difference, not `now + retention`, which overflows near the end of the datetime range.
        and cmd.retain_token_until - ctx.now > ctx.limits.max_token_retention
    ):
        days = ctx.limits.max_token_retention / timedelta(days=1)
        raise InvalidCommand(f"hook token retention cannot exceed {days:g} days", run_id=ctx.run_id)
    snap = ctx.live_run("create new entities on")
    if snap.hooks.raw(cmd.hook_id) is not None:
        raise EntityConflict(
            f"hook {cmd.hook_id!r} already exists in run {snap.run_id!r}", run_id=snap.run_id
        )
    holder_run_id = None
    if ctx.token_holder is not None and ctx.token_holder.run_id != snap.run_id:
        holder_run_id = ctx.token_holder.run_id
    else:
        for hook_id in snap.active_hook_ids:
            if snap.hooks.raw(hook_id).token == cmd.token:  # type: ignore[union-attr]
                holder_run_id = snap.run_id
                break
    if holder_run_id is not None:
        return (HookConflict(hook_id=cmd.hook_id, token=cmd.token, holder_run_id=holder_run_id),)
    return (
        HookCreated(
            hook_id=cmd.hook_id,
            token=cmd.token,
            metadata=cmd.metadata,
            is_webhook=cmd.is_webhook,
            retain_token_until=cmd.retain_token_until,
        ),
    )


def _retaining(record: Any, now: datetime) -> bool:
    return record.retain_token_until is not None and record.retain_token_until > now


def _hook_not_found(snap: Snapshot, hook_id: str) -> HookNotFound:
    return HookNotFound(f"hook {hook_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id)


def _receive_hook(ctx: _Ctx, cmd: ReceiveHook) -> _Events:
    snap = ctx.run()
    record = snap.hooks.raw(cmd.hook_id)
    if record is None or record.status != "active":
        raise _hook_not_found(snap, cmd.hook_id)
    if snap.status not in LIVE_RUN_STATUSES:
        if _retaining(record, ctx.now):
            raise RunExpired(
                f"hook {cmd.hook_id!r} belongs to run {snap.run_id!r}, which is in terminal "
                f"state {snap.status!r}",
                run_id=snap.run_id,
            )
        raise _hook_not_found(snap, cmd.hook_id)
    if cmd.delivery_id is not None:
        for delivery in record.deliveries:
            if delivery.delivery_id == cmd.delivery_id:
                if delivery.payload == cmd.payload:
                    return _NOOP
                raise EntityConflict(
                    f"delivery {cmd.delivery_id!r} to hook {cmd.hook_id!r} of run "
                    f"{snap.run_id!r} was already received with another payload",
                    run_id=snap.run_id,
                )
    return (HookReceived(hook_id=cmd.hook_id, payload=cmd.payload, delivery_id=cmd.delivery_id),)


def _dispose_hook(ctx: _Ctx, cmd: DisposeHook) -> _Events:
    snap = ctx.run()
    record = snap.hooks.raw(cmd.hook_id)
    if record is None:
        raise _hook_not_found(snap, cmd.hook_id)
    if record.status == "disposed":
        raise EntityConflict(
            f"hook {cmd.hook_id!r} of run {snap.run_id!r} already disposed", run_id=snap.run_id
        )
    if record.status == "cancelled":
        raise TerminalState(
            f"cannot dispose hook {cmd.hook_id!r} of run {snap.run_id!r} in terminal state "
            "'cancelled'",
            run_id=snap.run_id,
        )
    if snap.status not in LIVE_RUN_STATUSES and not _retaining(record, ctx.now):
        raise _hook_not_found(snap, cmd.hook_id)
    return (HookDisposed(hook_id=cmd.hook_id),)


_RULES: dict[type[Command], Callable[[_Ctx, Any], _Events]] = {
    CreateRun: _create_run,
    StartRun: _start_run,
    CompleteRun: _complete_run,
    FailRun: _fail_run,
    RequestCancel: _request_cancel,
    CancelRun: _cancel_run,
    TimeOutRun: _time_out_run,
    SetAttributes: _set_attributes,
    RecordProgress: _record_progress,
    LinkChild: _link_child,
    RecordLog: _record_log,
    CreateStep: _create_step,
    StartStep: _start_step,
    CompleteStep: _complete_step,
    FailStep: _fail_step,
    RetryStep: _retry_step,
    CancelStep: _cancel_step,
    CreateWait: _create_wait,
    CompleteWait: _complete_wait,
    CreateHook: _create_hook,
    ReceiveHook: _receive_hook,
    DisposeHook: _dispose_hook,
}


def decide(
    snapshot: Snapshot | None,
    command: Command,
    *,
    now: datetime,
    limits: Limits = _DEFAULT_LIMITS,
    token_holder: HookHolder | None = None,
    run_id: str | None = None,
) -> Decision:
    """Decide what `command` means for the run in `snapshot`: events to append, or a rejection.

    Pure: no clock, no I/O, no randomness. Law (decide ∘ apply is closed): for a snapshot of a
    valid history, either `decide` raises a `Rejection` or `project_run(history + events)` is
    valid. It raises a `Rejection` subclass naming what was wrong, and nothing else.

    Args:
        snapshot: The run's snapshot; None when the run has no history.
        command: What the caller asks; each command class lists the rejections it may meet.
        now: The time of the decision (timezone-aware), e.g. for retry and retention deadlines.
        limits: The bounds the command and the resulting history are checked against.
        token_holder: What the store says holds a `CreateHook` command's token, if anything.
        run_id: Names the run in messages when `snapshot` is None.

    Returns:
        The events to append; an empty `Decision(idempotent=True)` when the command had
            already taken effect.

    Raises:
        InvalidCommand: A malformed command (a field's type, size or id), or a naive `now`.
        RunNotSupported: The run was stamped by a newer kernel spec than this one.
        HistoryLimitExceeded: The events would take the run past `Limits.max_events_per_run`.
        Rejection: Any other refusal of the rules (`RunNotFound`, `TerminalState`, …).
    """
    if snapshot is not None:
        run_id = snapshot.run_id
        if snapshot.spec_version > SPEC_VERSION:
            raise RunNotSupported(
                f"run {run_id!r} requires spec version {snapshot.spec_version}, runfold supports "
                f"{SPEC_VERSION}",
                run_id=run_id,
            )
    ctx = _Ctx(snapshot, run_id, now, limits, token_holder)
    try:
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise InvalidCommand("now must be a timezone-aware datetime", run_id=run_id)
        if snapshot is None and run_id is not None:
            ctx.ident(run_id, "run_id")  # an existing run's id was checked when created
        validate(ctx, command)
        events = _RULES[type(command)](ctx, command)
    except Rejection:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        # A field of the wrong shape that slipped past validation is still the caller's error.
        raise InvalidCommand(
            f"malformed {type(command).__name__}: {type(exc).__name__}", run_id=run_id
        ) from None
    if not events:
        return Decision(events=(), idempotent=True)
    head = snapshot.last_sequence if snapshot is not None else 0
    allowed = limits.max_events_per_run + (1 if command.ends_run else 0)
    if head + len(events) > allowed:
        raise HistoryLimitExceeded(
            f"run {run_id!r} holds {head} events; {len(events)} more would pass the limit of "
            f"{limits.max_events_per_run}",
            run_id=run_id,
        )
    return Decision(events=events)
