"""The event catalogue and the envelope.

Events are attrs classes: frozen, slotted, keyword-only. Each has a wire name (`event_type`) and a
`schema_version`. `bytes` fields are opaque payloads the runtime serialized; times are aware UTC
datetimes. Hook tokens are bearer secrets: they are excluded from every `repr`. The value types
events carry (`RetryPolicy`, `AttributeChange`, a writer) are `runfold.kernel.values`'s, and
importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import ClassVar, Literal, TypeAlias

import attrs

from runfold.kernel.fast import fast_inits, frozen_columns, frozen_factory
from runfold.kernel.values import (
    DEFAULT_RETRY,
    AttributeChange,
    RetryPolicy,
    StepWriter,
    WorkflowWriter,
    Writer,
)

__all__ = [
    "DEFAULT_RETRY",
    "EVENT_TYPES",
    "AttributeChange",
    "AttributesSet",
    "CancelRequested",
    "ChildLinked",
    "Envelope",
    "Event",
    "HookConflict",
    "HookCreated",
    "HookDisposed",
    "HookReceived",
    "LogLevel",
    "LogRecorded",
    "ProgressRecorded",
    "RetryPolicy",
    "RunCancelled",
    "RunClaimed",
    "RunCompleted",
    "RunCreated",
    "RunFailed",
    "RunReleased",
    "RunStarted",
    "RunTimedOut",
    "StepCancelled",
    "StepCompleted",
    "StepCreated",
    "StepFailed",
    "StepRetrying",
    "StepStarted",
    "StepWriter",
    "WaitCompleted",
    "WaitCreated",
    "WorkflowWriter",
    "Writer",
    "make_envelope",
    "make_envelopes",
]

LogLevel: TypeAlias = Literal["info", "warning", "error"]
"""The level of a `LogRecorded` line."""


def _frozen_mapping(value: Mapping[str, str]) -> Mapping[str, str]:
    """Copy a mapping into a read-only view, so a frozen event cannot change under anyone."""
    if type(value) is MappingProxyType:
        return value
    return MappingProxyType(dict(value))


# --- events -------------------------------------------------------------------------------------


class Event:
    """Base of every event class: a fact recorded in a run's history.

    `event_type` is the wire name, stable forever; `schema_version` is the payload's version
    (older ones are lifted by upcasters on read). `positional` says how the current version is
    laid out: a CBOR array of the fields in declaration order (trailing fields that hold their
    defaults left out), or, when False, a CBOR map keyed by field name.
    """

    __slots__ = ()
    event_type: ClassVar[str]
    schema_version: ClassVar[int] = 1
    positional: ClassVar[bool] = False


class _Catalogued(Event):
    """Every event of runfold's catalogue: schema version 1 was the map form; version 2, the
    positional form, decodes about twice as fast (no field names to read and hash). The codec
    lifts version 1 rows (`EventCodec` registers their upcasters)."""

    __slots__ = ()
    schema_version: ClassVar[int] = 2
    positional: ClassVar[bool] = True


@attrs.frozen(kw_only=True)
class RunCreated(_Catalogued):
    """The run exists, with its workflow, input and definition: always the first event.

    The run is `pending` until `RunStarted`. `spec_version` is the kernel spec that wrote the
    run; a run stamped newer than this kernel's `SPEC_VERSION` is refused with
    `RunNotSupported`, never misread. A run started on a queue names it (`queue_name`), with
    its `priority` there and its deduplication id (`dedup_id`). Schema version 3 added those
    three fields; versions 1 and 2 are lifted with none of them (`EventCodec`).
    """

    event_type: ClassVar[str] = "run_created"
    schema_version: ClassVar[int] = 3
    workflow_name: str
    input: bytes
    workflow_version: str | None = None
    deployment_id: str | None = None
    context: bytes | None = None
    attributes: Mapping[str, str] = attrs.field(
        default=MappingProxyType({}), converter=_frozen_mapping
    )
    parent_run_id: str | None = None
    deadline: datetime | None = None
    spec_version: int = 1
    queue_name: str | None = None
    priority: int = 0
    dedup_id: str | None = None


@attrs.frozen(kw_only=True)
class RunStarted(_Catalogued):
    """The run began executing: `pending` became `running`."""

    event_type: ClassVar[str] = "run_started"


@attrs.frozen(kw_only=True)
class RunCompleted(_Catalogued):
    """The run ended successfully with `output` (status `completed`)."""

    event_type: ClassVar[str] = "run_completed"
    output: bytes


@attrs.frozen(kw_only=True)
class RunFailed(_Catalogued):
    """The run ended as failed with `error` and an optional `error_code` (status `failed`)."""

    event_type: ClassVar[str] = "run_failed"
    error: bytes
    error_code: str | None = None


@attrs.frozen(kw_only=True)
class CancelRequested(_Catalogued):
    """Cancellation was requested: the run is `cancelling`.

    Its live steps, waiting waits and active hooks were cancelled with this event; the run then
    ends with `RunCancelled`, `RunFailed` or `RunTimedOut`.
    """

    event_type: ClassVar[str] = "cancel_requested"
    reason: str | None = None


@attrs.frozen(kw_only=True)
class RunCancelled(_Catalogued):
    """The run ended as cancelled (status `cancelled`), with an optional `reason`."""

    event_type: ClassVar[str] = "run_cancelled"
    reason: str | None = None


@attrs.frozen(kw_only=True)
class RunTimedOut(_Catalogued):
    """The run ended because its `deadline` passed (status `timed_out`)."""

    event_type: ClassVar[str] = "run_timed_out"
    deadline: datetime
    reason: str | None = None


@attrs.frozen(kw_only=True)
class AttributesSet(_Catalogued):
    """Attribute changes written to the run by `writer`: the workflow or one step attempt.

    A change whose value is None removed its key. A `write_id` is applied once per run; keys
    starting with `$` were allowed only with `allow_reserved`.
    """

    event_type: ClassVar[str] = "attributes_set"
    changes: tuple[AttributeChange, ...]
    writer: Writer = WorkflowWriter()
    write_id: str | None = None
    allow_reserved: bool = False


@attrs.frozen(kw_only=True)
class ProgressRecorded(_Catalogued):
    """A progress report: `completed` of `total` units for `progress_id`, once per id."""

    event_type: ClassVar[str] = "progress_recorded"
    progress_id: str
    completed: int
    total: int | None = None
    message: str | None = None
    details: bytes | None = None


@attrs.frozen(kw_only=True)
class ChildLinked(_Catalogued):
    """A child operation linked to the run under `reference_id`, once per id.

    `kind` and `operation_id` name the operation; `child_run_id` is the child run, if it is one.
    """

    event_type: ClassVar[str] = "child_linked"
    reference_id: str
    kind: str
    operation_id: str
    child_run_id: str | None = None
    metadata: bytes | None = None


@attrs.frozen(kw_only=True)
class LogRecorded(_Catalogued):
    """A log line at `level` from the workflow or the step `step_id`; the snapshot counts it.

    `log_id`, when the caller named the line, is unique in the run (`Snapshot.log_ids`). It is a
    trailing field left out of the wire form when unset, so a history without it reads as
    before, and it appears in the `repr` only when set.
    """

    event_type: ClassVar[str] = "log_recorded"
    level: LogLevel
    message: str
    step_id: str | None = None
    data: bytes | None = None
    log_id: str | None = None

    def __repr__(self) -> str:
        extra = "" if self.log_id is None else f", log_id={self.log_id!r}"
        return (
            f"LogRecorded(level={self.level!r}, message={self.message!r}, "
            f"step_id={self.step_id!r}, data={self.data!r}{extra})"
        )


@attrs.frozen(kw_only=True)
class StepCreated(_Catalogued):
    """A step exists with its name, input and retry policy: `pending`, no attempt started yet."""

    event_type: ClassVar[str] = "step_created"
    step_id: str
    step_name: str
    input: bytes
    retry: RetryPolicy | None = None


@attrs.frozen(kw_only=True)
class StepStarted(_Catalogued):
    """A step's attempt number `attempt` (the previous one plus one) began: status `running`.

    `after_interruption` says the attempt before was interrupted: the step was still `running`
    (its process died inside the body, and no outcome was recorded). `retry` is the step's retry
    policy from this attempt on, set only when it differs from the one before (a deploy changed
    it); None keeps the policy. `start_id` is the identity of the `StartStep` that began the
    attempt (`StartStep.start_id`), when it had one: the same command again is then recognised
    as applied. All three are trailing fields left out of the wire form when unset, so a history
    without them reads as before, and they appear in the `repr` only when set.
    """

    event_type: ClassVar[str] = "step_started"
    step_id: str
    attempt: int
    after_interruption: bool = False
    retry: RetryPolicy | None = None
    start_id: str | None = None

    def __repr__(self) -> str:
        extra = ", after_interruption=True" if self.after_interruption else ""
        if self.retry is not None:
            extra += f", retry={self.retry!r}"
        if self.start_id is not None:
            extra += f", start_id={self.start_id!r}"
        return f"StepStarted(step_id={self.step_id!r}, attempt={self.attempt!r}{extra})"


@attrs.frozen(kw_only=True)
class StepCompleted(_Catalogued):
    """A step ended successfully with `output` (status `completed`)."""

    event_type: ClassVar[str] = "step_completed"
    step_id: str
    output: bytes


@attrs.frozen(kw_only=True)
class StepFailed(_Catalogued):
    """A step ended as failed with `error` (status `failed`).

    `retryable` is how the runtime classified the error; the step will not run again either way.
    """

    event_type: ClassVar[str] = "step_failed"
    step_id: str
    error: bytes
    retryable: bool = False


@attrs.frozen(kw_only=True)
class StepRetrying(_Catalogued):
    """A running step's attempt failed and the step will run again: back to `pending`.

    Its next attempt may not start before `retry_after` (if set), which the index lists as a
    `retry` wakeup.
    """

    event_type: ClassVar[str] = "step_retrying"
    step_id: str
    error: bytes
    retry_after: datetime | None = None


@attrs.frozen(kw_only=True)
class StepCancelled(_Catalogued):
    """A pending or running step was cancelled (status `cancelled`)."""

    event_type: ClassVar[str] = "step_cancelled"
    step_id: str
    reason: str | None = None


@attrs.frozen(kw_only=True)
class WaitCreated(_Catalogued):
    """A durable timer: the run waits until `resume_at` (status `waiting`)."""

    event_type: ClassVar[str] = "wait_created"
    wait_id: str
    resume_at: datetime


@attrs.frozen(kw_only=True)
class WaitCompleted(_Catalogued):
    """A wait is over (status `completed`)."""

    event_type: ClassVar[str] = "wait_completed"
    wait_id: str


@attrs.frozen(kw_only=True)
class HookCreated(_Catalogued):
    """A hook was opened: outside callers deliver to it by `token` until it is disposed.

    The token is a bearer secret (never in a repr) and unique among live hooks across runs.
    `retain_token_until` keeps the token held (and the hook disposable) after the run ends.
    """

    event_type: ClassVar[str] = "hook_created"
    hook_id: str
    token: str = attrs.field(repr=False)
    metadata: bytes | None = None
    is_webhook: bool = False
    retain_token_until: datetime | None = None


@attrs.frozen(kw_only=True)
class HookReceived(_Catalogued):
    """A payload delivered to an active hook, with the caller's optional `delivery_id`."""

    event_type: ClassVar[str] = "hook_received"
    hook_id: str
    payload: bytes
    delivery_id: str | None = None


@attrs.frozen(kw_only=True)
class HookDisposed(_Catalogued):
    """A hook was closed: it takes no more deliveries and its token is free again."""

    event_type: ClassVar[str] = "hook_disposed"
    hook_id: str


@attrs.frozen(kw_only=True)
class HookConflict(_Catalogued):
    """A hook could not be created because the hook of run `holder_run_id` holds its token.

    No hook `hook_id` exists afterwards; the workflow learns of the conflict from its history.
    """

    event_type: ClassVar[str] = "hook_conflict"
    hook_id: str
    token: str = attrs.field(repr=False)
    holder_run_id: str


@attrs.frozen(kw_only=True)
class RunClaimed(_Catalogued):
    """Worker `owner_id` took the run: it alone drives it until it releases it or is displaced.

    `epoch` counts the run's claims (1, 2, …): it is the fencing token a worker's commands carry,
    so a displaced worker's late commands are refused. `displaced` names the owner whose lease
    had lapsed when this claim took the run from it (None when the run had no owner).
    """

    event_type: ClassVar[str] = "run_claimed"
    owner_id: str
    epoch: int
    displaced: str | None = None


@attrs.frozen(kw_only=True)
class RunReleased(_Catalogued):
    """The owner of claim `epoch` let the run go: it waits, or its worker is shutting down."""

    event_type: ClassVar[str] = "run_released"
    owner_id: str
    epoch: int


EVENT_TYPES: Mapping[str, type[Event]] = MappingProxyType(
    {
        cls.event_type: cls
        for cls in (
            RunCreated,
            RunStarted,
            RunCompleted,
            RunFailed,
            CancelRequested,
            RunCancelled,
            RunTimedOut,
            AttributesSet,
            ProgressRecorded,
            ChildLinked,
            LogRecorded,
            StepCreated,
            StepStarted,
            StepCompleted,
            StepFailed,
            StepRetrying,
            StepCancelled,
            WaitCreated,
            WaitCompleted,
            HookCreated,
            HookReceived,
            HookDisposed,
            HookConflict,
            RunClaimed,
            RunReleased,
        )
    }
)
"""Every event class by its wire name."""


@attrs.frozen(kw_only=True)
class Envelope:
    """An event in its run: identity is `(run_id, sequence)`; `position` is the global-feed slot."""

    run_id: str
    sequence: int
    event: Event
    recorded_at: datetime
    position: int | None = None


fast_inits([*EVENT_TYPES.values(), Envelope])

make_envelope = frozen_factory(Envelope)
"""A positional `Envelope` constructor, about twice as fast as `Envelope(...)`.

`make_envelope(run_id, sequence, event, recorded_at, position)`: every field, in order, with no
default applied; stores use it when decoding rows.
"""

make_envelopes = frozen_columns(Envelope)
"""Many `Envelope`s at once, from one iterable per field.

Stores use it to build a read's envelopes without a Python call per row.

`make_envelopes(count, run_ids, sequences, events, recorded_ats, positions)`: each iterable
holds at least `count` values (`itertools.repeat` for one shared by every row); no default is
applied.
"""
