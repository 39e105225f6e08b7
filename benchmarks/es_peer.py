"""The `eventsourcing` peer (benchmark-only import): the same step-heavy run as an aggregate,
replayed and appended through the library's documented `Application` path (no snapshots)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from benchmarks.harness import Trial
from benchmarks.workloads import PAYLOAD_BYTES

__all__ = ["POPO_ENV", "WorkflowRun", "eventsourcing_appends", "eventsourcing_replay"]

POPO_ENV = {"PERSISTENCE_MODULE": "eventsourcing.popo"}
"""The in-memory recorder's settings."""
SAVE_EVERY = 1_000
"""Events per save when an aggregate is written for a replay."""


class WorkflowRun(Aggregate):
    """A run whose steps are created, started and completed, kept in a dict as runfold does.

    Payloads are strings: the library's default transcoder has no bytes type."""

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


@contextlib.contextmanager
def _application(env: Mapping[str, str]) -> Iterator[Application[Any]]:
    application: Application[Any] = Application(env=dict(env))
    try:
        yield application
    finally:
        application.close()


@contextlib.contextmanager
def eventsourcing_replay(
    env: Mapping[str, str], size: int
) -> Iterator[tuple[Callable[[], object], int]]:
    """An application (recorder chosen by `env`) holding one aggregate of about `size` events:
    yields its replay (`repository.get`) and the aggregate's exact number of events.

    Created, then steps of three events: `size` ≡ 1 (mod 3) gives exactly `size` events."""
    with _application(env) as application:
        aggregate = WorkflowRun(workflow_name="order-fulfilment", input="x" * PAYLOAD_BYTES)
        step = 0
        while aggregate.version < size:
            step_id = f"step-{step:06d}"
            aggregate.create_step(step_id, "charge-card", "i" * PAYLOAD_BYTES)
            aggregate.start_step(step_id, 1)
            aggregate.complete_step(step_id, "o" * PAYLOAD_BYTES)
            step += 1
            # Saved in chunks, as runfold's run is written: one save of 25,000 events stalls
            # the PostgreSQL recorder (its pipelined INSERT of one huge array never finishes).
            if len(aggregate.pending_events) >= SAVE_EVERY:
                application.save(aggregate)
        application.save(aggregate)
        assert application.repository.get(aggregate.id).version == aggregate.version
        yield (lambda: application.repository.get(aggregate.id)), aggregate.version


@contextlib.contextmanager
def eventsourcing_appends(env: Mapping[str, str], count: int, batch: int) -> Iterator[Trial]:
    """Each round: a new aggregate saved (untimed), then `count` saves of `batch` new events
    each, one recorder transaction per save (timed)."""
    with _application(env) as application:
        current: list[WorkflowRun] = []

        def prepare() -> None:
            current[:] = [WorkflowRun(workflow_name="bench", input="")]
            application.save(current[0])

        def run() -> None:
            aggregate = current[0]
            for n in range(count):
                for k in range(batch):
                    aggregate.create_step(f"s{n}-{k}", "log", "x" * PAYLOAD_BYTES)
                application.save(aggregate)

        yield Trial(prepare=prepare, run=run)
