"""The errors `runfold.flow` raises: misuse of the decorator, of the calls, and non-determinism.

Each is a `RunfoldError` with a stable `code` and an HTTP-like `status`. `StepError` is the one
workflow code meets in normal operation: `await step(...)` raises it when a step failed for good.
"""

from __future__ import annotations

from runfold.kernel import RunfoldError

__all__ = [
    "ChildWorkflowError",
    "ContinueAsNewError",
    "DuplicateWorkflow",
    "FlowError",
    "FlowNonDeterminism",
    "ForkRefused",
    "NotInWorkflow",
    "PayloadError",
    "StepError",
    "TokenInUse",
    "UnknownWorkflow",
    "UnsupportedAwait",
]


class FlowError(RunfoldError):
    """Base of the errors `runfold.flow` raises itself."""

    code = "flow_error"
    status = 500


class DuplicateWorkflow(FlowError):
    """Two different functions were registered under one workflow name."""

    code = "duplicate_workflow"
    status = 409


class UnknownWorkflow(FlowError):
    """A run's workflow name is not one this `Flow` serves."""

    code = "unknown_workflow"
    status = 404


class NotInWorkflow(FlowError):
    """`step`, `sleep` or `wait_for_event` was awaited outside a workflow run by a `Flow`."""

    code = "not_in_workflow"
    status = 500


class UnsupportedAwait(FlowError):
    """Workflow code awaited something that is not a `runfold.flow` call.

    An asyncio sleep or a socket, say: everything a workflow waits on must be durable, so it
    must be a step, a `sleep` or a `wait_for_event`. Also raised for what cannot be replayed
    alike: an `asyncio.TaskGroup` (or `asyncio.create_task`) task of anything but a step, and
    the event loop's timers; the run fails with it, whatever the code does with the error.
    """

    code = "unsupported_await"
    status = 500


class PayloadError(FlowError):
    """A value could not be encoded or decoded by the `Flow`'s payload codec."""

    code = "payload_error"
    status = 422


class FlowNonDeterminism(FlowError):
    """The workflow code asked, at one call, for something other than what the run recorded.

    `call` is the call's position (1 for the workflow's first `step`, `sleep` or
    `wait_for_event`), `recorded` describes what the history holds there and `asked` what the
    code asks now. It happens when code changed under live runs (a step added, removed,
    renamed or given another input before a recorded one), or when workflow code is not
    deterministic (it read the clock, drew random numbers, iterated a set). Hook tokens are
    never shown.
    """

    code = "flow_non_deterministic"
    status = 409

    def __init__(self, *, run_id: str, call: int, recorded: str, asked: str) -> None:
        super().__init__(
            f"run {run_id!r} is not deterministic at call {call}: the history recorded "
            f"{recorded}, the workflow code now asks for {asked}"
        )
        self.run_id = run_id
        self.call = call
        self.recorded = recorded
        self.asked = asked


class StepError(FlowError):
    """Raised into workflow code by `await step(...)` when the step failed for good.

    `step_name` names the step and `step_error` is its last attempt's error as recorded.
    Uncaught, it fails the run.
    """

    code = "step_failed"
    status = 500

    def __init__(self, step_name: str, message: str) -> None:
        super().__init__(f"step {step_name!r} failed: {message}")
        self.step_name = step_name
        self.step_error = message


class TokenInUse(FlowError):
    """Raised into workflow code by `await wait_for_event(...)`: a live hook holds the token.

    `holder_run_id` is the run whose hook holds it: another run, or (in a history recorded
    before runfold closed a finished `wait_for_event`'s hook for the next one) this run. The
    hook was not created. Uncaught, it fails the run.
    """

    code = "token_in_use"
    status = 409

    def __init__(self, hook_id: str, holder_run_id: str | None = None, *, run_id: str = "") -> None:
        if holder_run_id is not None and holder_run_id == run_id:
            holder = f"an earlier wait_for_event of this run ({run_id!r})"
        elif holder_run_id is not None:
            holder = f"a hook of run {holder_run_id!r}"
        else:
            holder = "another run"
        super().__init__(f"the token of wait_for_event({hook_id!r}) is held by {holder}")
        self.hook_id = hook_id
        self.holder_run_id = holder_run_id


class ChildWorkflowError(FlowError):
    """Raised into workflow code by `await handle.result()`: the child run did not complete.

    `child_run_id` is the child, `child_status` how it ended (failed, cancelled or timed_out)
    and `child_error` its recorded error, if any. Uncaught, it fails the parent.
    """

    code = "child_workflow_failed"
    status = 500

    def __init__(self, child_run_id: str, child_status: str, child_error: str) -> None:
        detail = f": {child_error}" if child_error else ""
        super().__init__(f"child run {child_run_id!r} ended {child_status}{detail}")
        self.child_run_id = child_run_id
        self.child_status = child_status
        self.child_error = child_error


class ContinueAsNewError(FlowError):
    """Raised into workflow code by `await continue_as_new(...)`: the run cannot continue.

    The chain's first run id is longer than an attribute value may be (256 bytes in UTF-8), so
    its successors could not name it. Nothing was recorded; uncaught, it fails the run.
    """

    code = "continue_as_new_failed"
    status = 422


class ForkRefused(FlowError):
    """`Flow.fork` or `Flow.restart` was refused; nothing was written.

    The old run holds, before the fork's call, a call whose outcome a new run cannot reuse (a
    `wait_for_event`, a child, a step that failed or is still running, a call never reached),
    or a restart was asked of a run that neither failed nor was cancelled.
    """

    code = "fork_refused"
    status = 409
