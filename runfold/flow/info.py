"""`workflow_info()`: what a workflow or step body knows about the run it belongs to.

DBOS's `DBOS.workflow_id` and friends: the run's id, its workflow's name and version, the run
that started it (a child's parent) and when it started. The interpreter sets it while workflow
code runs, the `Flow` while a step body runs (on the loop or in its thread pool), so it is
the same in both and on every replay.
"""

from __future__ import annotations

from contextvars import ContextVar
from datetime import datetime
from typing import Any

import attrs

from runfold.flow.errors import NotInWorkflow
from runfold.kernel import Snapshot

__all__ = ["CONTINUED_FROM", "FIRST_RUN", "GENERATION", "WorkflowInfo", "workflow_info"]

CONTINUED_FROM = "$continued_from"
"""The successor's attribute naming the run it continues."""
FIRST_RUN = "$first_run"
"""The successor's attribute naming the chain's first run."""
GENERATION = "$generation"
"""The successor's attribute counting the continuations before it (the first run's is 0)."""


@attrs.frozen(kw_only=True)
class WorkflowInfo:
    """The run a workflow or step body belongs to."""

    run_id: str
    workflow_name: str
    workflow_version: str | None
    """The `version` of the `Flow` that started the run, if it had one."""
    parent_run_id: str | None
    """The run that started this one as a child, else None."""
    started_at: datetime
    """When the run started (its creation, for a run not started yet); the same on replays."""
    continued_from: str | None = None
    """The run this one continues (it ended with `continue_as_new`), else None."""
    first_run_id: str | None = None
    """The first run of the chain of `continue_as_new` this run belongs to (its own id if first)."""
    generation: int = 0
    """How many runs of its chain came before this one (0 for a run started by `Flow.start`)."""

    @classmethod
    def of(cls, snapshot: Snapshot) -> WorkflowInfo:
        """The info of the run `snapshot` stands for."""
        started = snapshot.started_at
        attributes = snapshot.attributes  # the links `continue_as_new` gives a successor
        return cls(
            run_id=snapshot.run_id,
            workflow_name=snapshot.workflow_name,
            workflow_version=snapshot.workflow_version,
            parent_run_id=snapshot.parent_run_id,
            started_at=started if started is not None else snapshot.created_at,
            continued_from=attributes.get(CONTINUED_FROM),
            first_run_id=attributes.get(FIRST_RUN, snapshot.run_id),
            generation=int(attributes.get(GENERATION, "0")),
        )


CURRENT_INFO: ContextVar[WorkflowInfo | None] = ContextVar("runfold_flow_info", default=None)
"""The run whose workflow code runs in this context (a session's own context holds it)."""
CURRENT_STEP: ContextVar[tuple[Any, WorkflowInfo] | None] = ContextVar(
    "runfold_flow_step", default=None
)
"""The step body running in this context: its `StepInvocation` and its run's info (one
variable, so a step sets one)."""


def workflow_info() -> WorkflowInfo:
    """The run the calling workflow code or step body belongs to.

    Raises:
        NotInWorkflow: Called outside workflow code or a step body run by a `Flow`.
    """
    found = CURRENT_INFO.get()
    if found is not None:
        return found
    step = CURRENT_STEP.get()
    if step is None:
        raise NotInWorkflow("workflow_info() is for workflow code and step bodies run by a Flow")
    return step[1]
