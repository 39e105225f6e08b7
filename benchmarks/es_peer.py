"""The `eventsourcing` peer (benchmark-only import): the same step-heavy run as an aggregate,
replayed and appended through the library's documented `Application` path (no snapshots)."""

from __future__ import annotations

import contextlib
import gc
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
from eventsourcing.application import Application, project_aggregate
from eventsourcing.domain import Aggregate, event

from benchmarks.harness import Trial
from benchmarks.workloads import PAYLOAD_BYTES

__all__ = [
    "POPO_ENV",
    "ReplayStages",
    "WorkflowRun",
    "eventsourcing_aggregate_bytes",
    "eventsourcing_appends",
    "eventsourcing_replay",
    "eventsourcing_stages",
]

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


def _seeded(application: Application[Any], size: int) -> WorkflowRun:
    """One aggregate of about `size` events, saved: created, then steps of three events (`size`
    ≡ 1 (mod 3) gives exactly `size` events)."""
    aggregate = WorkflowRun(workflow_name="order-fulfilment", input="x" * PAYLOAD_BYTES)
    step = 0
    while aggregate.version < size:
        step_id = f"step-{step:06d}"
        aggregate.create_step(step_id, "charge-card", "i" * PAYLOAD_BYTES)
        aggregate.start_step(step_id, 1)
        aggregate.complete_step(step_id, "o" * PAYLOAD_BYTES)
        step += 1
        # Saved in chunks, as runfold's run is written: one save of 25,000 events stalls the
        # PostgreSQL recorder (its pipelined INSERT of one huge array never finishes).
        if len(aggregate.pending_events) >= SAVE_EVERY:
            application.save(aggregate)
    application.save(aggregate)
    assert application.repository.get(aggregate.id).version == aggregate.version
    return aggregate


@contextlib.contextmanager
def eventsourcing_replay(
    env: Mapping[str, str], size: int
) -> Iterator[tuple[Callable[[], object], int]]:
    """An application (recorder chosen by `env`) holding one aggregate of about `size` events:
    yields its replay (`repository.get`) and the aggregate's exact number of events."""
    with _application(env) as application:
        aggregate = _seeded(application, size)
        yield (lambda: application.repository.get(aggregate.id)), aggregate.version


@attrs.frozen(kw_only=True)
class ReplayStages:
    """The two halves of the library's replay, each on its own (`repository.get` does both)."""

    decode: Callable[[], object]
    """The stored events of the aggregate, already selected, turned into domain events
    (`mapper.to_domain_event`)."""
    fold: Callable[[], object]
    """The domain events, already decoded, folded into the aggregate (`project_aggregate`)."""
    events: int


@contextlib.contextmanager
def eventsourcing_stages(size: int) -> Iterator[ReplayStages]:
    """The decode and the fold of the in-memory (POPO) application's replay of `size` events."""
    with _application(POPO_ENV) as application:
        aggregate = _seeded(application, size)
        stored = list(application.recorder.select_events(aggregate.id))
        to_domain_event = application.mapper.to_domain_event
        decoded = [to_domain_event(event) for event in stored]
        folded: WorkflowRun | None = project_aggregate(None, decoded)
        assert folded is not None and folded.version == aggregate.version
        yield ReplayStages(
            decode=lambda: [to_domain_event(event) for event in stored],
            fold=lambda: project_aggregate(None, decoded),
            events=aggregate.version,
        )


def eventsourcing_aggregate_bytes(size: int) -> tuple[int, int]:
    """The bytes an aggregate of `size` events replayed from the in-memory application holds
    (allocated by `repository.get` and still held after a collection, by tracemalloc), and its
    exact number of events."""
    with _application(POPO_ENV) as application:
        aggregate_id = _seeded(application, size).id
        gc.collect()
        tracemalloc.start()
        try:
            replayed: WorkflowRun = application.repository.get(aggregate_id)
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return held, replayed.version


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
