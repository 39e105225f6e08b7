"""The errors `Engine` raises for misuse.

A runtime's decision it cannot apply, a start that contradicts an existing run, a drive that
will not settle.

Each is a `RunfoldError` with a stable `code` and an HTTP-like `status`, and names the run.
Rules about a run are the kernel's: a decision the kernel refuses surfaces as the kernel's own
`Rejection` (for example `NonDeterministic` or `TerminalState`), unchanged.
"""

from __future__ import annotations

from datetime import timedelta

from runfold.kernel import RunfoldError

__all__ = [
    "BaseExceptionRaised",
    "EngineError",
    "InvalidDecision",
    "QueueDeduplicated",
    "ReplayLimitExceeded",
    "RunDefinitionConflict",
    "StepTimedOut",
    "WorkflowNotServed",
]


class EngineError(RunfoldError):
    """Base of the errors the engine raises itself; `run_id` names the run."""

    code = "engine_error"
    status = 500

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class BaseExceptionRaised(EngineError):
    """Workflow code or a step body raised a `BaseException` that is not an `Exception`.

    `SystemExit`, `KeyboardInterrupt`, `GeneratorExit` or `asyncio.CancelledError` raised by the
    code itself is its failure like any other exception: recorded as this error, it fails the
    step's attempt (retried while the step's policy allows) or the run. `raised` is the class
    name of what was raised. A cancellation of the task driving the run, from outside, is not
    the code's: it propagates, and nothing is recorded for it.
    """

    code = "base_exception_raised"
    status = 500

    def __init__(self, message: str, *, run_id: str, raised: str) -> None:
        super().__init__(message, run_id=run_id)
        self.raised = raised


class QueueDeduplicated(EngineError):
    """`Engine.start` on a queue with a deduplication id that a live run of the queue holds.

    As DBOS refuses such an enqueue: nothing was recorded for the new run. `queue_name` and
    `dedup_id` name what was held; `run_id` is the id the refused start asked for. Once the
    holding run ends, the id is free again.
    """

    code = "queue_deduplicated"
    status = 409

    def __init__(self, message: str, *, run_id: str, queue_name: str, dedup_id: str) -> None:
        super().__init__(message, run_id=run_id)
        self.queue_name = queue_name
        self.dedup_id = dedup_id


class RunDefinitionConflict(EngineError):
    """`Engine.start` was given the id of a run created with another definition.

    The definition is the workflow name, version, deployment, input, context, attributes,
    parent and deadline.
    """

    code = "run_definition_conflict"
    status = 409


class InvalidDecision(EngineError):
    """The runtime returned a decision the engine cannot apply.

    That is one that changes nothing (the workflow would be asked the same question forever),
    reuses a finished wait or hook, cancels a run nobody asked to cancel, or repeats a step id
    within one decision.
    """

    code = "invalid_decision"
    status = 500


class ReplayLimitExceeded(EngineError):
    """One `drive` asked the runtime `max_replay_iterations` times and the run never settled.

    Only with a bound set on the `Engine` (by default a drive has none).

    Settling is ending or suspending. Everything decided so far is durable: driving again
    continues from there.
    """

    code = "replay_limit_exceeded"
    status = 508


class StepTimedOut(EngineError):
    """An attempt of a step body did not return within its timeout.

    The timeout is `ScheduleStep.timeout`, else the engine's `step_timeout` (default
    `DEFAULT_STEP_TIMEOUT`). Recorded as the attempt's failure, retried while the step's policy
    allows; `step_id` names the step and `timeout` is the bound it passed.
    """

    code = "step_timed_out"
    status = 504

    def __init__(self, message: str, *, run_id: str, step_id: str, timeout: timedelta) -> None:
        super().__init__(message, run_id=run_id)
        self.step_id = step_id
        self.timeout = timeout


class WorkflowNotServed(EngineError):
    """The run's workflow is not one the engine's runtime declares (`workflow_names`).

    Services sharing one store each serve their own workflows; an engine never writes to a run
    of another's, so it neither starts, drives, resumes nor recovers one.
    """

    code = "workflow_not_served"
    status = 404
