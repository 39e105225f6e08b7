"""Commands: what a caller asks of a run.

`decide` turns a command into events or a `Rejection`. Attrs classes: frozen, slotted,
keyword-only. Hook tokens never appear in a repr.
"""

from __future__ import annotations

import os
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
from runfold.kernel.fast import fast_inits

__all__ = [
    "CancelRun",
    "CancelStep",
    "ClaimRun",
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
    "ReleaseRun",
    "RequestCancel",
    "RetryStep",
    "SetAttributes",
    "StartRun",
    "StartStep",
    "TimeOutRun",
]


def new_log_id() -> str:
    """A fresh identity for a log line: `log-` and 16 random hex digits (`RecordLog.log_id`)."""
    return "log-" + os.urandom(8).hex()


def _attribute_changes(
    value: tuple[AttributeChange, ...] | Mapping[str, str | None],
) -> tuple[AttributeChange, ...]:
    """Accept a mapping (`{"k": "v", "gone": None}`) as well as a tuple of changes."""
    if isinstance(value, Mapping):
        return tuple(AttributeChange(key=k, value=v) for k, v in value.items())
    return tuple(value)


class Command:
    """Base of every command class.

    `ends_run` marks the commands that may always add one more event past
    `Limits.max_events_per_run`, so a full run can still end. Any command whose fields are
    malformed (wrong type, empty or oversized id, naive datetime) is an `InvalidCommand`.
    """

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
    """Create a run (`RunCreated`) without starting it.

    `decide` rejects it with `EntityConflict` when the run already exists, and with
    `InvalidAttributes` for bad `attributes` (keys starting with `$` need `allow_reserved`).
    `deadline` is when the run times out; `parent_run_id` names the run that started this one.
    `queue_name` puts the run on a queue (a worker serving it starts the run), with a
    `priority` there (0 to 2**31 - 1, lower first) and a deduplication id (`dedup_id`, which
    needs a queue); `InvalidArgument` otherwise.
    """

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
    queue_name: str | None = None
    priority: int = 0
    dedup_id: str | None = None


@attrs.frozen(kw_only=True)
class StartRun(Command):
    """Start a run (`RunStarted`), creating it first from `create` when it has no history.

    A no-op on a running or cancelling run. `decide` rejects it with `RunNotFound` when the run has
    no history and `create` is None, and with `RunExpired` once the run has ended.
    """

    create: CreateRun | None = None


@attrs.frozen(kw_only=True)
class CompleteRun(Command):
    """End the run successfully with `output` (`RunCompleted`).

    A no-op on a run completed with the same `output` (the command, applied already, sent again).
    `decide` rejects it with `TerminalState` on a cancelling run (it ends cancelled, failed or timed
    out) and on a run that ended otherwise.
    """

    ends_run: ClassVar[bool] = True
    output: bytes


@attrs.frozen(kw_only=True)
class FailRun(Command):
    """End the run as failed with `error` and an optional `error_code` (`RunFailed`).

    A no-op on a run failed with the same `error` and `error_code`; `decide` rejects it with
    `TerminalState` once the run has ended otherwise.
    """

    ends_run: ClassVar[bool] = True
    error: bytes
    error_code: str | None = None


@attrs.frozen(kw_only=True)
class RequestCancel(Command):
    """Ask the run to cancel (`CancelRequested`): it turns `cancelling`, its live work cancelled.

    A no-op on a cancelled run and on one already cancelling for the same `reason`. `decide` rejects
    it with `EntityConflict` when the run is cancelling for another reason, and with `TerminalState`
    on a run that ended otherwise.
    """

    reason: str | None = None


@attrs.frozen(kw_only=True)
class CancelRun(Command):
    """End the run as cancelled (`RunCancelled`).

    A no-op on a cancelled run; `decide` rejects it with `TerminalState` on a run that ended
    otherwise.
    """

    ends_run: ClassVar[bool] = True
    reason: str | None = None


@attrs.frozen(kw_only=True)
class TimeOutRun(Command):
    """End the run as timed out because its `deadline` passed (`RunTimedOut`).

    A no-op on a run that timed out; `decide` rejects it with `TerminalState` once the run has
    ended otherwise.
    """

    ends_run: ClassVar[bool] = True
    deadline: datetime
    reason: str | None = None


@attrs.frozen(kw_only=True)
class SetAttributes(Command):
    """Change the run's attributes (`AttributesSet`); a change whose value is None removes the key.

    `changes` also accepts a mapping (`{"key": "value", "gone": None}`). A no-op, even once the run
    has ended, when `write_id` was already applied (the first write stands) and, without a
    `write_id`, when every change is in effect already: a write sent again after it was applied
    is recorded once. `decide` rejects it with `InvalidAttributes` (a bad key or value, a `$` key
    without `allow_reserved`, too many attributes) and `TerminalState` once the run has ended.
    """

    changes: tuple[AttributeChange, ...] = attrs.field(converter=_attribute_changes)
    writer: Writer = WorkflowWriter()
    write_id: str | None = None
    allow_reserved: bool = False


@attrs.frozen(kw_only=True)
class RecordProgress(Command):
    """Record the progress report `progress_id` (`ProgressRecorded`), once per id.

    The same report again is a no-op; other content under the same id is `NonDeterministic`.
    `decide` rejects with `InvalidCommand` a negative `completed` or a `total` below it, and with
    `TerminalState` a new report once the run has ended.
    """

    progress_id: str
    completed: int
    total: int | None = None
    message: str | None = None
    details: bytes | None = None


@attrs.frozen(kw_only=True)
class LinkChild(Command):
    """Link a child operation to the run under `reference_id` (`ChildLinked`), once per id.

    The same link again is a no-op; other content under the same id is `NonDeterministic`. `decide`
    rejects a new link with `TerminalState` once the run has ended.
    """

    reference_id: str
    kind: str
    operation_id: str
    child_run_id: str | None = None
    metadata: bytes | None = None


@attrs.frozen(kw_only=True)
class RecordLog(Command):
    """Record a log line at `level`, from the workflow or the step `step_id` (`LogRecorded`).

    `log_id` names the line: a `RecordLog` whose `log_id` the run has recorded already is a
    no-op (the line first recorded stands), even once the run has ended, so a caller that lost
    the reply can send the command again, through any handler, and the line is recorded once.
    Unless the caller names it, each `RecordLog` made gets an identity of its own (`log-` and 16
    random hex digits): two commands are two lines, the same command sent twice one. An explicit
    None records a line each time it is sent.

    `decide` rejects it with `InvalidCommand` for a level other than info, warning or error, and
    with `TerminalState` once the run has ended (unless its `log_id` was recorded).
    """

    level: LogLevel
    message: str
    step_id: str | None = None
    data: bytes | None = None
    log_id: str | None = attrs.field(factory=new_log_id)


@attrs.frozen(kw_only=True)
class ClaimRun(Command):
    """Worker `owner_id` takes the run to drive it alone (`RunClaimed`, the next epoch).

    A run nobody owns is taken; one `owner_id` already owns is a no-op. A run another worker
    owns is taken only when `displacing` names that worker: the claimant found its lease
    lapsed. `decide` rejects it with `RunOwned` (another owner, not displaced), `RunNotFound` and
    `TerminalState` (the run ended).
    """

    owner_id: str
    displacing: str | None = None


@attrs.frozen(kw_only=True)
class ReleaseRun(Command):
    """The owning worker `owner_id` lets the run go (`RunReleased`): another may claim it.

    A no-op when nobody owns the run or it ended (ending a run ends its ownership). `decide`
    rejects it with `OwnershipLost` when another worker owns the run, and `RunNotFound`.
    """

    owner_id: str


# --- step commands ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateStep(Command):
    """Create a pending step (`StepCreated`) without starting it.

    `decide` rejects it with `EntityConflict` when the step exists with the same name and input
    (whatever its retry policy: `StartStep.retry` changes that), `NonDeterministic` when it exists
    with another name or input, and `TerminalState` once the run has ended.
    """

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
    """Start a step's next attempt (`StepStarted`), creating the step from `lazy` if it is new.

    With `lazy`, an existing step is an `EntityConflict`: another caller created it, and only the
    creator runs the body. `retry`, for an existing step, is its retry policy from this attempt
    on (a deploy changed it; None keeps the step's): a step's identity is its name and input, so
    a new policy is not a new step. `decide` also rejects it with `StepNotFound` (no such step and
    no `lazy`), `TerminalState` (the step has ended), `RunExpired` (the run has ended), `TooEarly`
    (a retry before its `retry_after`), `AttemptsExhausted` (the policy allows no further attempt)
    and `InvalidCommand` (`retry` with `lazy`: a new step takes its policy from `lazy.retry`).

    `start_id`, chosen by the caller, names this start; it is recorded on the `StepStarted`. The
    same command again, by any caller, after it was applied (a retry whose reply was lost) is a
    no-op while the attempt it began is the step's latest: a lazy one then reports the step as
    created by it (`BatchDecision.created_steps`), so its caller runs the body, and another
    caller's lazy start (another `start_id`) is still the `EntityConflict` above.
    """

    step_id: str
    lazy: LazyStep | None = None
    retry: RetryPolicy | None = None
    start_id: str | None = None


@attrs.frozen(kw_only=True)
class CompleteStep(Command):
    """End a pending or running step with `output` (`StepCompleted`).

    A running step may still complete after its run ended (a late outcome). A no-op on a step
    completed with the same `output` (the command, applied already, sent again). `decide`
    rejects it with `StepNotFound`, `TerminalState` (the step ended otherwise) and `RunExpired`
    (a pending step of an ended run).
    """

    step_id: str
    output: bytes


@attrs.frozen(kw_only=True)
class FailStep(Command):
    """End a pending or running step as failed with `error` (`StepFailed`).

    `retryable` records how the runtime classified the error. A no-op on a step failed with the
    same `error`. `decide` rejects it like `CompleteStep`: `StepNotFound`, `TerminalState`,
    `RunExpired`.
    """

    step_id: str
    error: bytes
    retryable: bool = False


@attrs.frozen(kw_only=True)
class RetryStep(Command):
    """Send a running step back to pending after a failed attempt (`StepRetrying`).

    The next `StartStep` is refused with `TooEarly` before `retry_after`. A no-op on a step sent
    back to pending with the same `error` and `retry_after` (this retry, recorded already; its
    reply lost). `decide` rejects it with
    `StepNotFound`, `TerminalState` (the step has ended), `InvalidCommand` (the step is not running,
    or its retry budget is spent: use `FailStep`) and `RunExpired` (the run has ended).
    """

    step_id: str
    error: bytes
    retry_after: datetime | None = None


@attrs.frozen(kw_only=True)
class CancelStep(Command):
    """Cancel a pending or running step (`StepCancelled`).

    A no-op on a cancelled step. `decide` rejects it with `StepNotFound`, `TerminalState` (the step
    ended otherwise) and `RunExpired` (the run has ended).
    """

    step_id: str
    reason: str | None = None


# --- wait commands ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateWait(Command):
    """Create a durable timer the run waits on until `resume_at` (`WaitCreated`).

    `decide` rejects it with `EntityConflict` when the wait exists with the same `resume_at`,
    `NonDeterministic` when it exists with another, and `TerminalState` once the run has ended.
    """

    wait_id: str
    resume_at: datetime


@attrs.frozen(kw_only=True)
class CompleteWait(Command):
    """Complete a waiting wait (`WaitCompleted`).

    A no-op on a completed wait. `decide` rejects it with `WaitNotFound`, `TerminalState`
    (cancelled) and `RunExpired` (the run has ended).
    """

    wait_id: str


# --- hook commands ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateHook(Command):
    """Open a hook that outside callers deliver to by its `token` (`HookCreated`).

    When another hook holds the token (`decide`'s `token_holder`, or a live hook of this run), the
    decision is a `HookConflict` event instead: the workflow sees the conflict in its history.
    `decide` rejects it with `EntityConflict` for an existing `hook_id`, `InvalidCommand` for a
    `retain_token_until` past `Limits.max_token_retention`, and `TerminalState` once the run has
    ended. The token is a bearer secret: it never appears in a repr.
    """

    hook_id: str
    token: str = attrs.field(repr=False)
    metadata: bytes | None = None
    is_webhook: bool = False
    retain_token_until: datetime | None = None


@attrs.frozen(kw_only=True)
class ReceiveHook(Command):
    """Deliver `payload` to an active hook (`HookReceived`).

    A repeated `delivery_id` with the same payload is a no-op (a lost-ack retry is safe); with
    another payload it is an `EntityConflict`. `decide` rejects it with `HookNotFound` for an
    unknown, disposed or cancelled hook, and with `RunExpired` when the run has ended but the hook
    still retains its token.
    """

    hook_id: str
    payload: bytes
    delivery_id: str | None = None


@attrs.frozen(kw_only=True)
class DisposeHook(Command):
    """Close an active hook and free its token (`HookDisposed`).

    A no-op on a disposed hook. `decide` rejects it with `HookNotFound` (unknown, or its run
    ended without retaining the token) and `TerminalState` (cancelled).
    """

    hook_id: str


fast_inits(
    [
        Decision,
        LazyStep,
        CreateRun,
        StartRun,
        CompleteRun,
        FailRun,
        RequestCancel,
        CancelRun,
        TimeOutRun,
        SetAttributes,
        RecordProgress,
        LinkChild,
        CreateStep,
        StartStep,
        CompleteStep,
        FailStep,
        RetryStep,
        CancelStep,
        CreateWait,
        CompleteWait,
        CreateHook,
        ReceiveHook,
        DisposeHook,
    ]
)
