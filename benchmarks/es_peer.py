"""The peer: the same step-heavy run as an `eventsourcing` aggregate (benchmark-only import)."""

from __future__ import annotations

from typing import Any

from eventsourcing.domain import Aggregate, event


class WorkflowRun(Aggregate):
    """A run whose steps are created, started and completed, kept in a dict as runfold does."""

    @event("Created")
    def __init__(self, workflow_name: str, input: str) -> None:
        self.workflow_name = workflow_name
        self.input = input
        self.steps: dict[str, dict[str, Any]] = {}

    @event("StepCreated")
    def create_step(self, step_id: str, step_name: str, input: str) -> None:
        self.steps[step_id] = {"name": step_name, "input": input, "status": "pending"}

    @event("StepStarted")
    def start_step(self, step_id: str, attempt: int) -> None:
        self.steps[step_id].update(status="running", attempt=attempt)

    @event("StepCompleted")
    def complete_step(self, step_id: str, output: str) -> None:
        self.steps[step_id].update(status="completed", output=output)
