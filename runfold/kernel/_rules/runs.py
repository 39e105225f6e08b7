"""The rules of the run commands: a run's life, and its attributes, progress, children and logs.

A run is created once (`CreateRun`, or `StartRun` with its definition, which must match the
run's if it exists), started once, and ended once: completed (never once cancelling), failed,
cancelled or timed out; a cancellation is requested once, for one reason. Attributes, progress,
children and logs are recorded on a live run; a progress or child recorded again with the same
content is a no-op, with other content `NonDeterministic`. A command applied already and sent
again (its reply lost) is recognised by what it recorded and is a no-op, not a refusal: an end
by its content, an attribute write by its `write_id` (or its changes being in effect), a log
line by its `log_id`.
"""

from __future__ import annotations

from runfold.kernel._rules.context import NOOP, NewEvents, Rule, RuleContext
from runfold.kernel.commands import (
    CancelRun,
    Command,
    CompleteRun,
    CreateRun,
    FailRun,
    LinkChild,
    RecordLog,
    RecordProgress,
    RequestCancel,
    SetAttributes,
    StartRun,
    TimeOutRun,
)
from runfold.kernel.errors import (
    EntityConflict,
    NonDeterministic,
    RunExpired,
    RunNotFound,
    TerminalState,
)
from runfold.kernel.events import (
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Event,
    LogRecorded,
    ProgressRecorded,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    RunTimedOut,
)
from runfold.kernel.limits import SPEC_VERSION
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, Snapshot

__all__ = ["RUN_RULES"]


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
        queue_name=cmd.queue_name,
        priority=cmd.priority,
        dedup_id=cmd.dedup_id,
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
        of.queue_name,
        of.priority,
        of.dedup_id,
    )


def _create_run(ctx: RuleContext, cmd: CreateRun) -> NewEvents:
    if ctx.snapshot is not None:
        raise EntityConflict(f"run {ctx.snapshot.run_id!r} already exists", run_id=ctx.run_id)
    return (_created(cmd),)


def _start_run(ctx: RuleContext, cmd: StartRun) -> NewEvents:
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
        return NOOP
    raise RunExpired(
        f"run {snap.run_id!r} already in terminal state {snap.status!r}", run_id=snap.run_id
    )


def _complete_run(ctx: RuleContext, cmd: CompleteRun) -> NewEvents:
    snap = ctx.run()
    if snap.status == "completed" and snap.output == cmd.output:
        return NOOP  # the same end, recorded already (a retry whose reply was lost)
    if snap.status == "cancelling":
        raise TerminalState(
            f"cannot complete run {snap.run_id!r}: a cancelling run ends as cancelled, failed "
            "or timed out",
            run_id=snap.run_id,
        )
    if snap.status not in LIVE_RUN_STATUSES:
        raise ctx.terminal("transition")
    return (RunCompleted(output=cmd.output),)


def _fail_run(ctx: RuleContext, cmd: FailRun) -> NewEvents:
    snap = ctx.run()
    if snap.status == "failed" and (snap.error, snap.error_code) == (cmd.error, cmd.error_code):
        return NOOP
    ctx.live_run("transition")
    return (RunFailed(error=cmd.error, error_code=cmd.error_code),)


def _request_cancel(ctx: RuleContext, cmd: RequestCancel) -> NewEvents:
    snap = ctx.run()
    if snap.status in ("pending", "running"):
        return (CancelRequested(reason=cmd.reason),)
    if snap.status == "cancelled":
        return NOOP
    if snap.status == "cancelling":
        assert snap.cancellation is not None
        if snap.cancellation.reason == cmd.reason:
            return NOOP
        raise EntityConflict(
            f"run {snap.run_id!r} is already cancelling for another reason", run_id=snap.run_id
        )
    raise ctx.terminal("request cancellation of")


def _cancel_run(ctx: RuleContext, cmd: CancelRun) -> NewEvents:
    snap = ctx.run()
    if snap.status == "cancelled":
        return NOOP
    ctx.live_run("transition")
    return (RunCancelled(reason=cmd.reason),)


def _time_out_run(ctx: RuleContext, cmd: TimeOutRun) -> NewEvents:
    if ctx.run().status == "timed_out":
        return NOOP
    ctx.live_run("transition")
    return (RunTimedOut(deadline=cmd.deadline, reason=cmd.reason),)


def _set_attributes(ctx: RuleContext, cmd: SetAttributes) -> NewEvents:
    snap = ctx.run()
    ctx.attribute_count(snap.attributes, cmd.changes)
    if cmd.write_id is not None and cmd.write_id in snap.attribute_write_ids:
        return NOOP  # applied already (a retry whose reply was lost): the first write stands
    if cmd.write_id is None and all(
        snap.attributes.get(change.key) == change.value for change in cmd.changes
    ):
        return NOOP  # every change in effect already: a write sent again is recorded once
    ctx.live_run("set attributes on")
    return (
        AttributesSet(
            changes=cmd.changes,
            writer=cmd.writer,
            write_id=cmd.write_id,
            allow_reserved=cmd.allow_reserved,
        ),
    )


def _record_progress(ctx: RuleContext, cmd: RecordProgress) -> NewEvents:
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


def _link_child(ctx: RuleContext, cmd: LinkChild) -> NewEvents:
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


def _once(
    ctx: RuleContext, snap: Snapshot, recorded: Event | None, event: Event, what: str
) -> NewEvents:
    """Record `event` once per id: the same content again is a no-op, other content a conflict."""
    if recorded is not None:
        if recorded == event:
            return NOOP
        raise NonDeterministic(
            f"{what} was already recorded on run {snap.run_id!r} with other content",
            run_id=snap.run_id,
        )
    ctx.live_run("record on")
    return (event,)


def _record_log(ctx: RuleContext, cmd: RecordLog) -> NewEvents:
    if cmd.log_id is not None and cmd.log_id in ctx.run().log_ids:
        return NOOP  # recorded already (a retry whose reply was lost): the first line stands
    ctx.live_run("log on")
    return (
        LogRecorded(
            level=cmd.level,
            message=cmd.message,
            step_id=cmd.step_id,
            data=cmd.data,
            log_id=cmd.log_id,
        ),
    )


RUN_RULES: dict[type[Command], Rule] = {
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
}
"""The rule of each run command class."""
