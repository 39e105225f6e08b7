"""What a runtime plugs into `Engine`: the protocols, the invocations, the decisions.

That is the `WorkflowRuntime` protocol, what it is invoked with, the `RuntimeDecision` variants
it answers with, and the `EngineObserver` protocol.

A runtime's workflow code is a function of the run as it stands: given a `WorkflowInvocation`
(the run's snapshot), it returns the one next thing to do. The engine applies that
decision through the kernel, and asks again whenever the run moved, until the run ends or the
workflow waits (on a timer, a hook, or a delayed step retry). So workflow code must be
deterministic: the same run gives the same decision.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Protocol, TypeAlias

import attrs

from runfold.kernel import Envelope, RetryPolicy, Snapshot
from runfold.kernel.fast import fast_inits

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "AwaitHook",
    "Cancel",
    "CloseHook",
    "Complete",
    "EngineObserver",
    "Fail",
    "LinkChildOperation",
    "ReportProgress",
    "RuntimeDecision",
    "ScheduleStep",
    "ScheduleSteps",
    "StepFailure",
    "StepInvocation",
    "TimeOut",
    "UpdateAttributes",
    "WaitUntil",
    "WorkflowInvocation",
    "WorkflowRuntime",
]


DEFAULT_STEP_TIMEOUT = timedelta(minutes=10)
"""How long an attempt of a step body may run by default: 10 minutes.

`ScheduleStep.timeout` or the engine's `step_timeout` may say otherwise. An attempt past it
fails as timed out (`StepTimedOut`)."""


# --- invocations --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class WorkflowInvocation:
    """The run a workflow is asked to decide on, as its snapshot.

    `snapshot.cancellation` is set once a cancellation was requested: the workflow must then end
    the run with `Cancel` or `Fail` (after any cleanup steps, which need ids not used before).
    The snapshot may hold the workflow's own latest decisions before they are appended (they
    are appended with the next step's start, the wait, or the run's end); a workflow that
    needs the stored events reads them itself (`CommandHandler.history`).
    """

    snapshot: Snapshot

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.snapshot.run_id

    def hook_conflict(self, hook_id: str) -> str | None:
        """The run that held the token when this run tried to create `hook_id`, or None.

        A `hook_conflict` event is recorded instead of a hook; the snapshot has no hook then, so
        a workflow that asked for one learns why here (and must choose another hook or end).
        """
        conflict = self.snapshot.hook_conflicts.get(hook_id)
        return None if conflict is None else conflict.holder_run_id


@attrs.frozen(kw_only=True)
class StepInvocation:
    """One attempt of a step body, run at least once.

    `idempotency_key` is the same on every attempt of the step (a retry, or a new attempt after
    a crash), so a body with side effects passes it on (to a payment API, say) and the side
    effect happens once; `attempt` tells the attempts apart.
    """

    run_id: str
    step_id: str
    step_name: str
    input: bytes
    attempt: int
    previous_error: bytes | None
    """The error of the attempt before this one, if it failed."""

    @property
    def idempotency_key(self) -> str:
        """`run_id/step_id`: the same on every attempt of this step, crashes included."""
        return f"{self.run_id}/{self.step_id}"


class StepFailure(Exception):
    """Raised by a step body to fail an attempt with a chosen error payload and code.

    `retryable=False`, or a `code` listed in the step's `RetryPolicy.non_retryable_error_codes`,
    fails the step at once; otherwise the engine retries it while the policy allows. Any other
    exception from a step body is a retryable failure whose code is the exception's class name.
    """

    def __init__(self, error: bytes, *, code: str | None = None, retryable: bool = True) -> None:
        super().__init__(error.decode("utf-8", "replace"))
        self.error = error
        self.code = code
        self.retryable = retryable


# --- decisions ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Complete:
    """End the run as completed with `output` (refused by the kernel while cancelling)."""

    output: bytes


@attrs.frozen(kw_only=True)
class Fail:
    """End the run as failed with `error` and an optional `error_code`."""

    error: bytes
    error_code: str | None = None


@attrs.frozen(kw_only=True)
class Cancel:
    """End the run as cancelled, answering its cancellation request.

    The engine raises `InvalidDecision` when nobody requested one.
    """


@attrs.frozen(kw_only=True)
class TimeOut:
    """End the run as timed out (at its deadline, or now if it has none)."""

    reason: str | None = None


@attrs.frozen(kw_only=True)
class ScheduleStep:
    """Run a step (created on first use) and record its outcome; also an item of `ScheduleSteps`.

    A step already finished is skipped; one waiting for a delayed retry suspends the run until
    the retry is due.
    """

    step_id: str
    step_name: str
    input: bytes
    retry: RetryPolicy | None = None
    timeout: timedelta | None = None
    """How long one attempt of the body may run before it fails as timed out (`StepTimedOut`);
    None: the engine's `step_timeout`. Not recorded: the code's value applies to each attempt."""


def _steps(value: Iterable[ScheduleStep]) -> tuple[ScheduleStep, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ScheduleSteps:
    """Run several steps concurrently; each outcome is committed as soon as it is known."""

    steps: tuple[ScheduleStep, ...] = attrs.field(converter=_steps)


@attrs.frozen(kw_only=True)
class WaitUntil:
    """A durable timer: suspend until `resume_at`, when the wait completes and the run goes on.

    The workflow is asked again then. A wait already due completes at once.
    """

    wait_id: str
    resume_at: datetime


@attrs.frozen(kw_only=True)
class AwaitHook:
    """Create a hook (on first use) and suspend until something is delivered to its token.

    The deliveries are in `snapshot.hooks[hook_id].deliveries`; asking for the same hook again
    means "keep waiting for another one".
    """

    hook_id: str
    token: str = attrs.field(repr=False)
    metadata: bytes | None = None
    is_webhook: bool = False
    retain_token_until: datetime | None = None


@attrs.frozen(kw_only=True)
class CloseHook:
    """Dispose the active hook `hook_id`: it takes no more deliveries and frees its token.

    A workflow closes a hook it is done with (to wait on its token again, or at a time-out).
    """

    hook_id: str


@attrs.frozen(kw_only=True)
class ReportProgress:
    """Record a progress entry (once per `progress_id`)."""

    progress_id: str
    completed: int
    total: int | None = None
    message: str | None = None
    details: bytes | None = None


@attrs.frozen(kw_only=True)
class LinkChildOperation:
    """Record a link to a child operation or run (once per `reference_id`)."""

    reference_id: str
    kind: str
    operation_id: str
    child_run_id: str | None = None
    metadata: bytes | None = None


def _changes(value: Mapping[str, str | None]) -> Mapping[str, str | None]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class UpdateAttributes:
    """Set attributes (a `None` value removes the key); `write_id` makes the write happen once.

    `reserved` allows keys starting with `$`, runfold's own (a patch marker of `runfold.flow`).
    """

    changes: Mapping[str, str | None] = attrs.field(converter=_changes)
    write_id: str | None = None
    reserved: bool = False


RuntimeDecision: TypeAlias = (
    Complete
    | Fail
    | Cancel
    | TimeOut
    | ScheduleStep
    | ScheduleSteps
    | WaitUntil
    | AwaitHook
    | CloseHook
    | ReportProgress
    | LinkChildOperation
    | UpdateAttributes
)
"""Everything `WorkflowRuntime.run_workflow` may answer."""

# A workflow answers and is asked once per decision: the kernel's direct slot filling (attrs'
# keyword `__init__` otherwise), for the classes that have no converter.
fast_inits(
    [
        WorkflowInvocation,
        StepInvocation,
        Complete,
        Fail,
        Cancel,
        TimeOut,
        ScheduleStep,
        ScheduleSteps,
        WaitUntil,
        AwaitHook,
        CloseHook,
        ReportProgress,
        LinkChildOperation,
    ]
)


# --- protocols ----------------------------------------------------------------------------------


class WorkflowRuntime(Protocol):
    """Runs workflow code and step bodies for `Engine`.

    Where the code runs is the runtime's business (in process, in a worker pool, behind an RPC).
    """

    @property
    def workflow_names(self) -> Collection[str]:
        """The workflows this runtime runs, by their stable names (at least one).

        An engine starts, drives, resumes and recovers runs of these alone: services that share
        a store never write to each other's runs.
        """
        ...

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        """The next thing to do for the run in `invocation`; must be deterministic.

        An exception propagates out of the engine operation and leaves the run as it was.
        """
        ...

    async def run_step(self, invocation: StepInvocation) -> bytes:
        """Run one attempt of a step body and return its output.

        Raise `StepFailure` (or any exception) to fail the attempt; the step's `RetryPolicy`
        then decides between a delayed retry and failing the step.
        """
        ...


class EngineObserver(Protocol):
    """Sees every envelope the engine appends, in order, right after it is durable.

    An observer cannot break a run: an exception it raises is logged (logger
    `runfold.engine`) and otherwise ignored. It is awaited inline, so keep it quick. One with
    an `observed_events` attribute (a collection of event classes, read once by the `Engine`)
    is called only for envelopes of those classes.
    """

    async def on_event(self, envelope: Envelope) -> None:
        """Called once per appended envelope."""
        ...
