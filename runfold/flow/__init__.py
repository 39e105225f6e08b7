"""`runfold.flow`: durable functions — `@workflow`, `await step(...)`, `sleep`, events.

Write a workflow as an `async def` that awaits `step(fn, *args)`, `sleep(delay)`,
`wait_for_event(hook_id, token=...)`, `set_event(key, value)`, `continue_as_new(input)`;
run it with `Flow(store).start(workflow, input)`. Each
call is recorded through the reference `Engine` (one commit per step), so a run survives any
crash: `Flow.recover()` in a fresh process carries every live run on from its history. See
`docs/tutorials/durable-functions.md`.
"""

from runfold.engine import Queue, QueueDeduplicated
from runfold.flow.bodies import current_step
from runfold.flow.calls import (
    ChildHandle,
    child,
    recv,
    report_progress,
    set_attributes,
    sleep,
    start_child,
    step,
    wait_for_event,
)
from runfold.flow.continuation import continue_as_new
from runfold.flow.definition import Workflow, registered_workflows, workflow
from runfold.flow.encoding import JsonCodec, PayloadCodec
from runfold.flow.errors import (
    ChildWorkflowError,
    ContinueAsNewError,
    DuplicateWorkflow,
    FlowError,
    FlowNonDeterminism,
    ForkRefused,
    NotInWorkflow,
    PayloadError,
    StepError,
    TokenInUse,
    UnknownWorkflow,
    UnsupportedAwait,
)
from runfold.flow.events import set_event
from runfold.flow.flow import Flow
from runfold.flow.info import WorkflowInfo, workflow_info
from runfold.flow.outcome import FlowRun
from runfold.flow.patches import deprecated_patch, patched
from runfold.flow.replay import Divergence, ReplayChecker, ReplayResult
from runfold.flow.sending import get_event, send
from runfold.flow.versions import code_version

__all__ = [
    "ChildHandle",
    "ChildWorkflowError",
    "ContinueAsNewError",
    "Divergence",
    "DuplicateWorkflow",
    "Flow",
    "FlowError",
    "FlowNonDeterminism",
    "FlowRun",
    "ForkRefused",
    "JsonCodec",
    "NotInWorkflow",
    "PayloadCodec",
    "PayloadError",
    "Queue",
    "QueueDeduplicated",
    "ReplayChecker",
    "ReplayResult",
    "StepError",
    "TokenInUse",
    "UnknownWorkflow",
    "UnsupportedAwait",
    "Workflow",
    "WorkflowInfo",
    "child",
    "code_version",
    "continue_as_new",
    "current_step",
    "deprecated_patch",
    "get_event",
    "patched",
    "recv",
    "registered_workflows",
    "report_progress",
    "send",
    "set_attributes",
    "set_event",
    "sleep",
    "start_child",
    "step",
    "wait_for_event",
    "workflow",
    "workflow_info",
]
