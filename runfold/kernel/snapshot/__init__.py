"""The snapshot of a run and the reducer that builds it: `project_run` and `apply`.

A `Snapshot` is where a run stands after its last event, immutable; `project_run` folds a whole
history into one, and `apply` catches one up with the events that follow it, in time
proportional to those events.

One idea per module: `states` (the snapshot and its entities' states, frozen, as every reader
sees them), `reducer` (the fold: `project_run` and `apply`), `replay` (stored rows folded
straight into a snapshot: `project_rows`), and the reducer's private parts,
`_builder` (the mutable state of one fold, and how it becomes a snapshot), `_records` (a step,
wait or hook while folds change it, copied on write) and `_handlers` (what each event type does
to a run, and the laws of a valid history it checks).
"""

from __future__ import annotations

from runfold.kernel.snapshot.reducer import apply, project_run
from runfold.kernel.snapshot.states import (
    LIVE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    Cancellation,
    Delivery,
    HookState,
    HookStatus,
    Ownership,
    RunStatus,
    Snapshot,
    StepState,
    StepStatus,
    WaitState,
    WaitStatus,
    WakeupDue,
)

__all__ = [
    "LIVE_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "Cancellation",
    "Delivery",
    "HookState",
    "HookStatus",
    "Ownership",
    "RunStatus",
    "Snapshot",
    "StepState",
    "StepStatus",
    "WaitState",
    "WaitStatus",
    "WakeupDue",
    "apply",
    "project_run",
]
