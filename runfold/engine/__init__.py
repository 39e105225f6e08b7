"""`runfold.engine`: the reference orchestration loop a runtime plugs its workflow code into.

`Engine(handler, runtime)` drives runs: it asks a `WorkflowRuntime` for each run's next
`RuntimeDecision`, records it through the `CommandHandler` (so the kernel decides every rule),
runs step bodies with retries, and resumes runs when timers fall due or hooks are delivered.
See `docs/reference/engine.md`.
"""

from runfold.engine.engine import Engine, EngineSummary, Resumption, Suspension, SuspensionKind
from runfold.engine.errors import (
    BaseExceptionRaised,
    EngineError,
    InvalidDecision,
    ReplayLimitExceeded,
    RunDefinitionConflict,
    StepTimedOut,
    WorkflowNotServed,
)
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

__all__ = [
    "DEFAULT_JITTER",
    "DEFAULT_RETRY",
    "DEFAULT_STEP_TIMEOUT",
    "LONGEST_RETRY_INTERVAL",
    "AwaitHook",
    "BaseExceptionRaised",
    "Cancel",
    "Complete",
    "Engine",
    "EngineError",
    "EngineObserver",
    "EngineSummary",
    "Fail",
    "InvalidDecision",
    "LinkChildOperation",
    "ReplayLimitExceeded",
    "ReportProgress",
    "Resumption",
    "RunDefinitionConflict",
    "RuntimeDecision",
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
    "WorkflowInvocation",
    "WorkflowNotServed",
    "WorkflowRuntime",
    "jitter_fraction",
    "retry_delay",
]
