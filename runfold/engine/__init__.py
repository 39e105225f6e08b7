"""`runfold.engine`: the reference orchestration loop a runtime plugs its workflow code into.

`Engine(handler, runtime)` drives runs: it asks a `WorkflowRuntime` for each run's next
`RuntimeDecision`, records it through the `CommandHandler` (so the kernel decides every rule),
runs step bodies with retries, and resumes runs when timers fall due or hooks are delivered.
See `docs/reference/engine.md`.
"""

from runfold.engine.engine import Engine
from runfold.engine.errors import (
    BaseExceptionRaised,
    EngineError,
    InvalidDecision,
    ReplayLimitExceeded,
    RunDefinitionConflict,
    StepTimedOut,
    WorkflowNotServed,
)
from runfold.engine.lease import DEFAULT_LEASE, Lease, new_worker_id
from runfold.engine.retry import (
    DEFAULT_JITTER,
    DEFAULT_RETRY,
    LONGEST_RETRY_INTERVAL,
    jitter_fraction,
    retry_delay,
)
from runfold.engine.runtime import (
    DEFAULT_STEP_TIMEOUT,
    AwaitHook,
    Cancel,
    CloseHook,
    Complete,
    EngineObserver,
    Fail,
    LinkChildOperation,
    ReportProgress,
    RuntimeDecision,
    ScheduleStep,
    ScheduleSteps,
    StepFailure,
    StepInvocation,
    TimeOut,
    UpdateAttributes,
    WaitUntil,
    WorkflowInvocation,
    WorkflowRuntime,
)
from runfold.engine.schedule import Schedule
from runfold.engine.suspensions import EngineSummary, Resumption, Suspension, SuspensionKind
from runfold.engine.worker import Worker, WorkerCounts

__all__ = [
    "DEFAULT_JITTER",
    "DEFAULT_LEASE",
    "DEFAULT_RETRY",
    "DEFAULT_STEP_TIMEOUT",
    "LONGEST_RETRY_INTERVAL",
    "AwaitHook",
    "BaseExceptionRaised",
    "Cancel",
    "CloseHook",
    "Complete",
    "Engine",
    "EngineError",
    "EngineObserver",
    "EngineSummary",
    "Fail",
    "InvalidDecision",
    "Lease",
    "LinkChildOperation",
    "ReplayLimitExceeded",
    "ReportProgress",
    "Resumption",
    "RunDefinitionConflict",
    "RuntimeDecision",
    "Schedule",
    "ScheduleStep",
    "ScheduleSteps",
    "StepFailure",
    "StepInvocation",
    "StepTimedOut",
    "Suspension",
    "SuspensionKind",
    "TimeOut",
    "UpdateAttributes",
    "WaitUntil",
    "Worker",
    "WorkerCounts",
    "WorkflowInvocation",
    "WorkflowNotServed",
    "WorkflowRuntime",
    "jitter_fraction",
    "new_worker_id",
    "retry_delay",
]
