"""Whether a command is well-formed: its fields' types, sizes, ids and times, within the limits.

These are the checks of every command, made before any rule reads the run: an id, token, payload,
text, time or type that is malformed or over its limit is an `InvalidCommand` (`InvalidAttributes`
for attributes), whatever the run's state. `FieldCheck` holds the checks of one kind of field,
and `validate` applies the checks of each command class, field by field.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from runfold.kernel.commands import (
    CancelRun,
    CancelStep,
    ClaimRun,
    Command,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateRun,
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
    ReleaseRun,
    RequestCancel,
    RetryStep,
    SetAttributes,
    StartRun,
    StartStep,
    TimeOutRun,
)
from runfold.kernel.errors import InvalidAttributes, InvalidCommand
from runfold.kernel.events import AttributeChange, RetryPolicy, StepWriter, WorkflowWriter
from runfold.kernel.limits import (
    MAX_BACKOFF_COEFFICIENT,
    MAX_PRIORITY,
    MAX_RETRY_ATTEMPTS,
    MAX_RETRY_INTERVAL,
    Limits,
)

__all__ = ["VALIDATORS", "FieldCheck", "validate"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LOG_LEVELS = frozenset({"info", "warning", "error"})


class FieldCheck:
    """Validates one command's fields against `limits`; every failure is an `InvalidCommand`.

    Each method checks one kind of field, named `what` in the message of its refusal.
    """

    __slots__ = ("limits", "run_id")

    def __init__(self, limits: Limits, run_id: str | None) -> None:
        self.limits = limits
        self.run_id = run_id

    def bad(self, message: str) -> InvalidCommand:
        """The `InvalidCommand` of a malformed field, for the caller to raise."""
        return InvalidCommand(message, run_id=self.run_id)

    def text(self, value: object, what: str, *, optional: bool = False) -> None:
        """A string UTF-8 can encode, within the payload size limit (or None, if optional)."""
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
        """An identifier: non-empty text within the id length, with no control character."""
        if value is None and optional:
            return
        limits = self.limits
        if (
            type(value) is str
            and value.isascii()  # its UTF-8 is one byte a character: `text`'s checks in one
            and 0 < len(value) <= limits.max_id_length
            and len(value) <= limits.max_payload_bytes
            and value.isprintable()  # ASCII: no control character, without a regex search
        ):
            return  # most ids: well-formed, and nothing more to ask
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
        """A hook token: non-empty text within the token length, never quoted in a message."""
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
        """Bytes within the payload size limit (or None, if optional)."""
        if value is None and optional:
            return
        if type(value) is not bytes:
            raise self.bad(f"{what} must be bytes, not {type(value).__name__}")
        if len(value) > self.limits.max_payload_bytes:
            raise self.bad(
                f"{what} is {len(value)} bytes, over the {self.limits.max_payload_bytes} limit"
            )

    def time(self, value: object, what: str, *, optional: bool = False) -> None:
        """A timezone-aware datetime whose UTC instant exists (or None, if optional)."""
        if value is None and optional:
            return
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise self.bad(f"{what} must be a timezone-aware datetime")
        try:
            value.astimezone(UTC)  # the wire format stores the UTC instant: it must exist
        except OverflowError:
            raise self.bad(f"{what} is outside the datetime range once converted to UTC") from None

    def flag(self, value: object, what: str) -> None:
        """A bool, and nothing that merely converts to one."""
        if type(value) is not bool:
            raise self.bad(f"{what} must be a bool")

    def integer(self, value: object, what: str, *, optional: bool = False) -> None:
        """An int that every store can keep: within the 64-bit range (or None, if optional)."""
        if value is None and optional:
            return
        if type(value) is not int:
            raise self.bad(f"{what} must be an int")
        if not _INT64_MIN <= value <= _INT64_MAX:  # every store keeps a 64-bit integer
            raise self.bad(f"{what} is outside the 64-bit integer range")

    def retry(self, value: object) -> None:
        """A `RetryPolicy` (or None): attempts, intervals, coefficient and codes in bounds."""
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
        """Attribute changes: keys and values within limits, none repeated, `$` keys if allowed."""
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
        """That `changes` leave the run within the limit of how many attributes it holds."""
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


def validate(check: FieldCheck, command: Command) -> None:
    """Check ids, sizes, types and times of `command` before any rule is applied."""
    validator = VALIDATORS.get(type(command))
    if validator is None:
        raise check.bad(f"not a command: {type(command).__name__}")
    validator(check, command)


def _validate_create_run(c: FieldCheck, cmd: CreateRun) -> None:
    c.ident(cmd.workflow_name, "workflow_name")
    c.payload(cmd.input, "input")
    c.ident(cmd.workflow_version, "workflow_version", optional=True)
    c.ident(cmd.deployment_id, "deployment_id", optional=True)
    c.payload(cmd.context, "context", optional=True)
    c.flag(cmd.allow_reserved, "allow_reserved")
    c.ident(cmd.parent_run_id, "parent_run_id", optional=True)
    c.time(cmd.deadline, "deadline", optional=True)
    c.ident(cmd.queue_name, "queue_name", optional=True)
    c.integer(cmd.priority, "priority")
    if not 0 <= cmd.priority <= MAX_PRIORITY:
        raise c.bad(f"priority must be between 0 and {MAX_PRIORITY}, not {cmd.priority}")
    c.ident(cmd.dedup_id, "dedup_id", optional=True)
    if cmd.queue_name is None and (cmd.dedup_id is not None or cmd.priority):
        raise c.bad("a priority or a dedup_id needs a queue_name")
    changes = tuple(AttributeChange(key=k, value=v) for k, v in cmd.attributes.items())
    c.attribute_changes(changes, cmd.allow_reserved)
    for change in changes:
        if change.value is None:  # None removes a key in SetAttributes; a new run has none
            raise InvalidAttributes(
                f"attribute {change.key!r} of a new run must be a string, not None",
                run_id=c.run_id,
            )
    c.attribute_count({}, changes)


def _validate_start_run(c: FieldCheck, cmd: StartRun) -> None:
    if cmd.create is not None:
        if not isinstance(cmd.create, CreateRun):
            raise c.bad("StartRun.create must be a CreateRun")
        _validate_create_run(c, cmd.create)


def _validate_set_attributes(c: FieldCheck, cmd: SetAttributes) -> None:
    if isinstance(cmd.writer, StepWriter):
        c.ident(cmd.writer.step_id, "writer.step_id")
        c.integer(cmd.writer.attempt, "writer.attempt")
    elif not isinstance(cmd.writer, WorkflowWriter):
        raise c.bad("writer must be a WorkflowWriter or a StepWriter")
    c.ident(cmd.write_id, "write_id", optional=True)
    c.flag(cmd.allow_reserved, "allow_reserved")
    c.attribute_changes(cmd.changes, cmd.allow_reserved)


def _validate_progress(c: FieldCheck, cmd: RecordProgress) -> None:
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


def _validate_child(c: FieldCheck, cmd: LinkChild) -> None:
    c.ident(cmd.reference_id, "reference_id")
    c.ident(cmd.kind, "kind")
    c.ident(cmd.operation_id, "operation_id")
    c.ident(cmd.child_run_id, "child_run_id", optional=True)
    c.payload(cmd.metadata, "metadata", optional=True)


def _validate_log(c: FieldCheck, cmd: RecordLog) -> None:
    if cmd.level not in _LOG_LEVELS:
        raise c.bad(f"log level must be one of info, warning, error, not {cmd.level!r}")
    c.text(cmd.message, "message")
    c.ident(cmd.step_id, "step_id", optional=True)
    c.payload(cmd.data, "data", optional=True)
    c.ident(cmd.log_id, "log_id", optional=True)


def _validate_step_definition(
    c: FieldCheck, step_name: object, input: object, retry: object
) -> None:
    c.ident(step_name, "step_name")
    c.payload(input, "input")
    c.retry(retry)


def _validate_create_step(c: FieldCheck, cmd: CreateStep) -> None:
    c.ident(cmd.step_id, "step_id")
    _validate_step_definition(c, cmd.step_name, cmd.input, cmd.retry)


def _validate_start_step(c: FieldCheck, cmd: StartStep) -> None:
    # Each step's first start: the optional fields absent are not checked by a call each.
    c.ident(cmd.step_id, "step_id")
    if cmd.start_id is not None:
        c.ident(cmd.start_id, "start_id")
    retry = cmd.retry
    if retry is not None:
        c.retry(retry)
    lazy = cmd.lazy
    if lazy is not None:
        if type(lazy) is not LazyStep and not isinstance(lazy, LazyStep):
            raise c.bad("StartStep.lazy must be a LazyStep")
        if retry is not None:
            raise c.bad("StartStep.retry is for an existing step; a new one takes lazy.retry")
        c.ident(lazy.step_name, "step_name")
        c.payload(lazy.input, "input")
        if lazy.retry is not None:
            c.retry(lazy.retry)


def _validate_step_outcome(c: FieldCheck, cmd: Any) -> None:
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


def _validate_create_hook(c: FieldCheck, cmd: CreateHook) -> None:
    c.ident(cmd.hook_id, "hook_id")
    c.token(cmd.token)
    c.payload(cmd.metadata, "metadata", optional=True)
    c.flag(cmd.is_webhook, "is_webhook")
    c.time(cmd.retain_token_until, "retain_token_until", optional=True)


def _validate_receive_hook(c: FieldCheck, cmd: ReceiveHook) -> None:
    c.ident(cmd.hook_id, "hook_id")
    c.payload(cmd.payload, "payload")
    c.ident(cmd.delivery_id, "delivery_id", optional=True)


def _validate_fail_run(c: FieldCheck, cmd: FailRun) -> None:
    c.payload(cmd.error, "error")
    c.ident(cmd.error_code, "error_code", optional=True)


def _validate_time_out(c: FieldCheck, cmd: TimeOutRun) -> None:
    c.time(cmd.deadline, "deadline")
    c.text(cmd.reason, "reason", optional=True)


def _validate_create_wait(c: FieldCheck, cmd: CreateWait) -> None:
    c.ident(cmd.wait_id, "wait_id")
    c.time(cmd.resume_at, "resume_at")


def _validate_claim(c: FieldCheck, cmd: ClaimRun) -> None:
    c.ident(cmd.owner_id, "owner_id")
    c.ident(cmd.displacing, "displacing", optional=True)


VALIDATORS: dict[type[Command], Callable[[FieldCheck, Any], None]] = {
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
    ClaimRun: _validate_claim,
    ReleaseRun: lambda c, cmd: c.ident(cmd.owner_id, "owner_id"),
}
"""The field checks of each command class (`validate` looks them up here)."""
