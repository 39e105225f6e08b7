"""Commands (`RULES.md`): what a caller asks of a run. `decide` turns one into events or a
`Rejection`. Attrs classes: frozen, slotted, keyword-only. Hook tokens never appear in a repr."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import ClassVar

import attrs

from runfold.kernel.events import (
    AttributeChange,
    Event,
    LogLevel,
    RetryPolicy,
    WorkflowWriter,
    Writer,
    _frozen_mapping,
)

__all__ = [
    "CancelRun",
    "CancelStep",
    "Command",
    "CompleteRun",
    "CompleteStep",
    "CompleteWait",
    "CreateHook",
    "CreateRun",
    "CreateStep",
    "CreateWait",
    "Decision",
    "DisposeHook",
    "FailRun",
    "FailStep",
    "LazyStep",
    "LinkChild",
    "ReceiveHook",
    "RecordLog",
    "RecordProgress",
    "RequestCancel",
    "RetryStep",
    "SetAttributes",
    "StartRun",
    "StartStep",
    "TimeOutRun",
]


def _attribute_changes(
    value: tuple[AttributeChange, ...] | Mapping[str, str | None],
) -> tuple[AttributeChange, ...]:
    """Accept a mapping (`{"k": "v", "gone": None}`) as well as a tuple of changes."""
    if isinstance(value, Mapping):
        return tuple(AttributeChange(key=k, value=v) for k, v in value.items())
    return tuple(value)


class Command:
    """Base of every command class. `ends_run` marks the commands that may always add one more
    event past `Limits.max_events_per_run`, so a full run can still end."""

    __slots__ = ()
    ends_run: ClassVar[bool] = False


@attrs.frozen(kw_only=True)
class Decision:
    """What `decide` returns: events to append (empty for a no-op) and whether it was one."""

    events: tuple[Event, ...]
    idempotent: bool = False


# --- run commands -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateRun(Command):
    workflow_name: str
    input: bytes
    workflow_version: str | None = None
    deployment_id: str | None = None
    context: bytes | None = None
    attributes: Mapping[str, str] = attrs.field(
        default=MappingProxyType({}), converter=_frozen_mapping
    )
    allow_reserved: bool = False
    parent_run_id: str | None = None
    deadline: datetime | None = None


@attrs.frozen(kw_only=True)
class StartRun(Command):
    create: CreateRun | None = None


@attrs.frozen(kw_only=True)
class CompleteRun(Command):
    ends_run: ClassVar[bool] = True
    output: bytes


@attrs.frozen(kw_only=True)
class FailRun(Command):
    ends_run: ClassVar[bool] = True
    error: bytes
    error_code: str | None = None


@attrs.frozen(kw_only=True)
class RequestCancel(Command):
    reason: str | None = None


@attrs.frozen(kw_only=True)
class CancelRun(Command):
    ends_run: ClassVar[bool] = True
    reason: str | None = None


@attrs.frozen(kw_only=True)
class TimeOutRun(Command):
    ends_run: ClassVar[bool] = True
    deadline: datetime
    reason: str | None = None


@attrs.frozen(kw_only=True)
class SetAttributes(Command):
    changes: tuple[AttributeChange, ...] = attrs.field(converter=_attribute_changes)
    writer: Writer = WorkflowWriter()
    write_id: str | None = None
    allow_reserved: bool = False


@attrs.frozen(kw_only=True)
class RecordProgress(Command):
    progress_id: str
    completed: int
    total: int | None = None
    message: str | None = None
    details: bytes | None = None


@attrs.frozen(kw_only=True)
class LinkChild(Command):
    reference_id: str
    kind: str
    operation_id: str
    child_run_id: str | None = None
    metadata: bytes | None = None


@attrs.frozen(kw_only=True)
class RecordLog(Command):
    level: LogLevel
    message: str
    step_id: str | None = None
    data: bytes | None = None


# --- step commands ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateStep(Command):
    step_id: str
    step_name: str
    input: bytes
    retry: RetryPolicy | None = None


@attrs.frozen(kw_only=True)
class LazyStep:
    """The definition `StartStep` uses to create a step it does not find."""

    step_name: str
    input: bytes
    retry: RetryPolicy | None = None


@attrs.frozen(kw_only=True)
class StartStep(Command):
    step_id: str
    lazy: LazyStep | None = None


@attrs.frozen(kw_only=True)
class CompleteStep(Command):
    step_id: str
    output: bytes


@attrs.frozen(kw_only=True)
class FailStep(Command):
    step_id: str
    error: bytes
    retryable: bool = False


@attrs.frozen(kw_only=True)
class RetryStep(Command):
    step_id: str
    error: bytes
    retry_after: datetime | None = None


@attrs.frozen(kw_only=True)
class CancelStep(Command):
    step_id: str
    reason: str | None = None


# --- wait commands ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateWait(Command):
    wait_id: str
    resume_at: datetime


@attrs.frozen(kw_only=True)
class CompleteWait(Command):
    wait_id: str


# --- hook commands ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateHook(Command):
    hook_id: str
    token: str = attrs.field(repr=False)
    metadata: bytes | None = None
    is_webhook: bool = False
    retain_token_until: datetime | None = None


@attrs.frozen(kw_only=True)
class ReceiveHook(Command):
    hook_id: str
    payload: bytes
    delivery_id: str | None = None


@attrs.frozen(kw_only=True)
class DisposeHook(Command):
    hook_id: str
