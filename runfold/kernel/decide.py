"""`decide`: the pure command decider, the rules every command is held to.

`decide(snapshot, command, *, now, limits, token_holder)` returns a `Decision` or raises a
`Rejection`; it never raises anything else, never reads a clock and never writes anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

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
from runfold.kernel.errors import (
    AttemptsExhausted,
    EntityConflict,
    HistoryLimitExceeded,
    HookNotFound,
    InvalidAttributes,
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
    StepWriter,
    WaitCompleted,
    WaitCreated,
    WorkflowWriter,
)
from runfold.kernel.index import HookHolder
from runfold.kernel.limits import (
    MAX_BACKOFF_COEFFICIENT,
    MAX_RETRY_ATTEMPTS,
    MAX_RETRY_INTERVAL,
    SPEC_VERSION,
    Limits,
)
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, Snapshot

__all__ = ["decide"]

_DEFAULT_LIMITS = Limits()
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LOG_LEVELS = frozenset({"info", "warning", "error"})


# --- input validation ---------------------------------------------------------------------------


class _Check:
    """Validates one command's fields against `limits`; every failure is an `InvalidCommand`."""

    __slots__ = ("limits", "run_id")

    def __init__(self, limits: Limits, run_id: str | None) -> None:
        self.limits = limits
        self.run_id = run_id

    def bad(self, message: str) -> InvalidCommand:
        return InvalidCommand(message, run_id=self.run_id)

    def text(self, value: object, what: str, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str):
            raise self.bad(f"{what} must be a string, not {type(value).__name__}")
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise self.bad(f"{what} is not valid unicode (lone surrogate)") from None
        if size > self.limits.max_payload_bytes:
            raise self.bad(
                f"{what} is {size} bytes, over the {self.limits.max_payload_bytes} limit"
            )

    def ident(self, value: object, what: str, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        self.text(value, what)
        assert isinstance(value, str)
        if not value:
            raise self.bad(f"{what} must not be empty")
        if len(value) > self.limits.max_id_length:
            raise self.bad(
                f"{what} is {len(value)} characters, over the {self.limits.max_id_length} limit"
            )
        if _CONTROL.search(value):
            raise self.bad(f"{what} {value!r} contains a control character")

    def token(self, value: object) -> None:
        # The token is a secret: messages describe it, never quote it.
        if not isinstance(value, str) or not value:
            raise self.bad("hook token must be a non-empty string")
        if len(value) > self.limits.max_token_length:
            raise self.bad(f"hook token is over the {self.limits.max_token_length} character limit")
        try:
            value.encode()
        except UnicodeEncodeError:
            raise self.bad("hook token is not valid unicode (lone surrogate)") from None

    def payload(self, value: object, what: str, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if type(value) is not bytes:
            raise self.bad(f"{what} must be bytes, not {type(value).__name__}")
        if len(value) > self.limits.max_payload_bytes:
            raise self.bad(
                f"{what} is {len(value)} bytes, over the {self.limits.max_payload_bytes} limit"
            )

    def time(self, value: object, what: str, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise self.bad(f"{what} must be a timezone-aware datetime")
        try:
            value.astimezone(UTC)  # the wire format stores the UTC instant: it must exist
        except OverflowError:
            raise self.bad(f"{what} is outside the datetime range once converted to UTC") from None

    def flag(self, value: object, what: str) -> None:
        if type(value) is not bool:
            raise self.bad(f"{what} must be a bool")

    def integer(self, value: object, what: str, *, optional: bool = False) -> None:
        if value is None and optional:
            return
        if type(value) is not int:
            raise self.bad(f"{what} must be an int")
        if not _INT64_MIN <= value <= _INT64_MAX:  # every store keeps a 64-bit integer
            raise self.bad(f"{what} is outside the 64-bit integer range")

    def retry(self, value: object) -> None:
        if value is None:
            return
        if not isinstance(value, RetryPolicy):
            raise self.bad("retry must be a RetryPolicy")
        if type(value.max_attempts) is not int or not 1 <= value.max_attempts <= MAX_RETRY_ATTEMPTS:
            raise self.bad(f"retry.max_attempts must be an int from 1 to {MAX_RETRY_ATTEMPTS:,}")
        for name in ("initial_interval", "max_interval"):
            interval = getattr(value, name)
            if interval is None and name == "max_interval":
                continue
            if (
                not isinstance(interval, timedelta)
                or not timedelta(0) <= interval <= MAX_RETRY_INTERVAL
            ):
                days = MAX_RETRY_INTERVAL.days
                raise self.bad(f"retry.{name} must be a timedelta from 0 to {days:,} days")
        coefficient = value.backoff_coefficient
        if (
            not isinstance(coefficient, int | float)
            or isinstance(coefficient, bool)
            or not 1 <= coefficient <= MAX_BACKOFF_COEFFICIENT  # also refuses NaN; no float()
        ):
            raise self.bad(
                f"retry.backoff_coefficient must be a number from 1 to {MAX_BACKOFF_COEFFICIENT}"
            )
        if not isinstance(value.non_retryable_error_codes, tuple):
            raise self.bad("retry.non_retryable_error_codes must be a tuple of strings")
        for code in value.non_retryable_error_codes:
            self.ident(code, "retry.non_retryable_error_codes item")

    def attribute_changes(self, changes: tuple[AttributeChange, ...], allow_reserved: bool) -> None:
        limits = self.limits
        seen: set[str] = set()
        for change in changes:
            if not isinstance(change, AttributeChange):
                raise InvalidAttributes(
                    "attribute changes must be AttributeChange", run_id=self.run_id
                )
            key, value = change.key, change.value
            if not isinstance(key, str) or not key:
                raise InvalidAttributes(
                    "attribute key must be a non-empty string", run_id=self.run_id
                )
            if len(key) > limits.max_attribute_key_length:
                raise InvalidAttributes(
                    f"attribute key {key[:32]!r}… length {len(key)} exceeds limit "
                    f"{limits.max_attribute_key_length}",
                    run_id=self.run_id,
                )
            self._attribute_text(key, "key")
            if key in seen:
                raise InvalidAttributes(
                    f"attribute key {key!r} repeats in one batch", run_id=self.run_id
                )
            seen.add(key)
            if key.startswith("$") and not allow_reserved:
                raise InvalidAttributes(
                    f"attribute key {key!r} uses the reserved prefix '$'", run_id=self.run_id
                )
            if value is not None:
                if not isinstance(value, str):
                    raise InvalidAttributes(
                        f"attribute {key!r} value must be a string or None", run_id=self.run_id
                    )
                size = len(self._attribute_text(value, f"{key!r} value"))
                if size > limits.max_attribute_value_bytes:
                    raise InvalidAttributes(
                        f"attribute {key!r} value byte length {size} exceeds limit "
                        f"{limits.max_attribute_value_bytes}",
                        run_id=self.run_id,
                    )

    def _attribute_text(self, value: str, what: str) -> bytes:
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise InvalidAttributes(
                f"attribute {what} is not valid unicode", run_id=self.run_id
            ) from None

    def attribute_count(
        self, current: Mapping[str, str], changes: tuple[AttributeChange, ...]
    ) -> None:
        keys = set(current)
        for change in changes:
            if change.value is None:
                keys.discard(change.key)
            else:
                keys.add(change.key)
        if len(keys) > self.limits.max_attributes:
            raise InvalidAttributes(
                f"run would hold {len(keys)} attributes, which exceeds limit "
                f"{self.limits.max_attributes}",
                run_id=self.run_id,
            )


def _validate(check: _Check, command: Command) -> None:
    """Check ids, sizes, types and times of `command` before any rule is applied."""
    validator = _VALIDATORS.get(type(command))
    if validator is None:
        raise check.bad(f"not a command: {type(command).__name__}")
    validator(check, command)


def _validate_create_run(c: _Check, cmd: CreateRun) -> None:
    c.ident(cmd.workflow_name, "workflow_name")
    c.payload(cmd.input, "input")
    c.ident(cmd.workflow_version, "workflow_version", optional=True)
    c.ident(cmd.deployment_id, "deployment_id", optional=True)
    c.payload(cmd.context, "context", optional=True)
    c.flag(cmd.allow_reserved, "allow_reserved")
    c.ident(cmd.parent_run_id, "parent_run_id", optional=True)
    c.time(cmd.deadline, "deadline", optional=True)
    changes = tuple(AttributeChange(key=k, value=v) for k, v in cmd.attributes.items())
    c.attribute_changes(changes, cmd.allow_reserved)
    for change in changes:
        if change.value is None:  # None removes a key in SetAttributes; a new run has none
            raise InvalidAttributes(
                f"attribute {change.key!r} of a new run must be a string, not None",
                run_id=c.run_id,
            )
    c.attribute_count({}, changes)


def _validate_start_run(c: _Check, cmd: StartRun) -> None:
    if cmd.create is not None:
        if not isinstance(cmd.create, CreateRun):
            raise c.bad("StartRun.create must be a CreateRun")
        _validate_create_run(c, cmd.create)


def _validate_set_attributes(c: _Check, cmd: SetAttributes) -> None:
    if isinstance(cmd.writer, StepWriter):
        c.ident(cmd.writer.step_id, "writer.step_id")
        c.integer(cmd.writer.attempt, "writer.attempt")
    elif not isinstance(cmd.writer, WorkflowWriter):
        raise c.bad("writer must be a WorkflowWriter or a StepWriter")
    c.ident(cmd.write_id, "write_id", optional=True)
    c.flag(cmd.allow_reserved, "allow_reserved")
    c.attribute_changes(cmd.changes, cmd.allow_reserved)


def _validate_progress(c: _Check, cmd: RecordProgress) -> None:
    c.ident(cmd.progress_id, "progress_id")
    c.integer(cmd.completed, "completed")
    c.integer(cmd.total, "total", optional=True)
    c.text(cmd.message, "message", optional=True)
    c.payload(cmd.details, "details", optional=True)
    if cmd.completed < 0:
        raise c.bad(f"progress {cmd.progress_id!r}: completed must not be negative")
    if cmd.total is not None and (cmd.total <= 0 or cmd.completed > cmd.total):
        raise c.bad(
            f"progress {cmd.progress_id!r}: total must be positive and at least completed "
            f"(completed={cmd.completed}, total={cmd.total})"
        )


def _validate_child(c: _Check, cmd: LinkChild) -> None:
    c.ident(cmd.reference_id, "reference_id")
    c.ident(cmd.kind, "kind")
    c.ident(cmd.operation_id, "operation_id")
    c.ident(cmd.child_run_id, "child_run_id", optional=True)
    c.payload(cmd.metadata, "metadata", optional=True)


def _validate_log(c: _Check, cmd: RecordLog) -> None:
    if cmd.level not in _LOG_LEVELS:
        raise c.bad(f"log level must be one of info, warning, error, not {cmd.level!r}")
    c.text(cmd.message, "message")
    c.ident(cmd.step_id, "step_id", optional=True)
    c.payload(cmd.data, "data", optional=True)


def _validate_step_definition(c: _Check, step_name: object, input: object, retry: object) -> None:
    c.ident(step_name, "step_name")
    c.payload(input, "input")
    c.retry(retry)


def _validate_create_step(c: _Check, cmd: CreateStep) -> None:
    c.ident(cmd.step_id, "step_id")
    _validate_step_definition(c, cmd.step_name, cmd.input, cmd.retry)


def _validate_start_step(c: _Check, cmd: StartStep) -> None:
    c.ident(cmd.step_id, "step_id")
    c.retry(cmd.retry)
    if cmd.lazy is not None:
        if not isinstance(cmd.lazy, LazyStep):
            raise c.bad("StartStep.lazy must be a LazyStep")
        if cmd.retry is not None:
            raise c.bad("StartStep.retry is for an existing step; a new one takes lazy.retry")
        _validate_step_definition(c, cmd.lazy.step_name, cmd.lazy.input, cmd.lazy.retry)


def _validate_step_outcome(c: _Check, cmd: Any) -> None:
    c.ident(cmd.step_id, "step_id")
    if isinstance(cmd, CompleteStep):
        c.payload(cmd.output, "output")
    elif isinstance(cmd, FailStep):
        c.payload(cmd.error, "error")
        c.flag(cmd.retryable, "retryable")
    elif isinstance(cmd, RetryStep):
        c.payload(cmd.error, "error")
        c.time(cmd.retry_after, "retry_after", optional=True)
    else:
        c.text(cmd.reason, "reason", optional=True)


def _validate_create_hook(c: _Check, cmd: CreateHook) -> None:
    c.ident(cmd.hook_id, "hook_id")
    c.token(cmd.token)
    c.payload(cmd.metadata, "metadata", optional=True)
    c.flag(cmd.is_webhook, "is_webhook")
    c.time(cmd.retain_token_until, "retain_token_until", optional=True)


def _validate_receive_hook(c: _Check, cmd: ReceiveHook) -> None:
    c.ident(cmd.hook_id, "hook_id")
    c.payload(cmd.payload, "payload")
    c.ident(cmd.delivery_id, "delivery_id", optional=True)


def _validate_fail_run(c: _Check, cmd: FailRun) -> None:
    c.payload(cmd.error, "error")
    c.ident(cmd.error_code, "error_code", optional=True)


def _validate_time_out(c: _Check, cmd: TimeOutRun) -> None:
    c.time(cmd.deadline, "deadline")
    c.text(cmd.reason, "reason", optional=True)


def _validate_create_wait(c: _Check, cmd: CreateWait) -> None:
    c.ident(cmd.wait_id, "wait_id")
    c.time(cmd.resume_at, "resume_at")


_VALIDATORS: dict[type[Command], Callable[[_Check, Any], None]] = {
    CreateRun: _validate_create_run,
    StartRun: _validate_start_run,
    CompleteRun: lambda c, cmd: c.payload(cmd.output, "output"),
    FailRun: _validate_fail_run,
    RequestCancel: lambda c, cmd: c.text(cmd.reason, "reason", optional=True),
    CancelRun: lambda c, cmd: c.text(cmd.reason, "reason", optional=True),
    TimeOutRun: _validate_time_out,
    SetAttributes: _validate_set_attributes,
    RecordProgress: _validate_progress,
    LinkChild: _validate_child,
    RecordLog: _validate_log,
    CreateStep: _validate_create_step,
    StartStep: _validate_start_step,
    CompleteStep: _validate_step_outcome,
    FailStep: _validate_step_outcome,
    RetryStep: _validate_step_outcome,
    CancelStep: _validate_step_outcome,
    CreateWait: _validate_create_wait,
    CompleteWait: lambda c, cmd: c.ident(cmd.wait_id, "wait_id"),
    CreateHook: _validate_create_hook,
    ReceiveHook: _validate_receive_hook,
    DisposeHook: lambda c, cmd: c.ident(cmd.hook_id, "hook_id"),
}


# --- the rules ----------------------------------------------------------------------------------


class _Ctx(_Check):
    """What every rule needs: the snapshot (None for no history), the time, the limits; and,
    being a `_Check` of those limits, the validation of the command's fields."""

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
        _validate(ctx, command)
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
