"""What benchmarks work on: step-heavy histories (as a workflow engine writes them), runs
written into a store, and the event and workflow shapes the write benchmarks use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from runfold import EventStore, MemoryStore, Snapshot
from runfold.events import (
    Envelope,
    Event,
    LogRecorded,
    RunCreated,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepStarted,
)
from runfold.kernel import apply, project_run, run_index

__all__ = [
    "LOG_EVENT",
    "NEW_RUN_EVENTS",
    "PAYLOAD_BYTES",
    "T0",
    "WORKFLOW_STEPS",
    "memory_store",
    "seed_run",
    "step_events",
    "step_heavy_history",
]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAYLOAD_BYTES = 64
"""Size of every step input and output: a small serialized JSON document."""
NEW_RUN_EVENTS = 2
"""Events of a run just created and started (`run_created`, `run_started`)."""


def step_events(first_step: int, count: int) -> list[Event]:
    """`count` events of steps numbered from `first_step`: created, started, completed, …"""
    events: list[Event] = []
    step = first_step
    while len(events) < count:
        step_id = f"step-{step:06d}"
        events += [
            StepCreated(step_id=step_id, step_name="charge-card", input=b"i" * PAYLOAD_BYTES),
            StepStarted(step_id=step_id, attempt=1),
            StepCompleted(step_id=step_id, output=b"o" * PAYLOAD_BYTES),
        ]
        step += 1
    return events[:count]


def step_heavy_history(events: int, run_id: str = "run-bench") -> list[Envelope]:
    """A run of `events` events: created, started, then steps created/started/completed.

    Times follow how a handler writes: each command's events share one `recorded_at`, and a
    lazily started step is one command (`step_created` + `step_started`), its completion another.
    """
    body: list[Event] = [
        RunCreated(workflow_name="order-fulfilment", input=b"x" * PAYLOAD_BYTES),
        RunStarted(),
    ]
    body += step_events(0, events - len(body))
    history = []
    recorded_at = T0
    for index, event in enumerate(body, start=1):
        if not isinstance(event, StepStarted):  # a new command, a new time
            recorded_at = T0 + timedelta(milliseconds=index)
        history.append(
            Envelope(run_id=run_id, sequence=index, event=event, recorded_at=recorded_at)
        )
    return history


LOG_EVENT = LogRecorded(level="info", message="x" * PAYLOAD_BYTES)
"""What write benchmarks append: one event that changes nothing but the run's head."""


async def seed_run(store: EventStore, run_id: str, size: int, *, chunk: int = 1_000) -> Snapshot:
    """Write a step-heavy run of `size` events into `store`, `chunk` events per append."""
    events = [envelope.event for envelope in step_heavy_history(size, run_id)]
    snapshot: Snapshot | None = None
    for start in range(0, size, chunk):
        batch = [
            Envelope(run_id=run_id, sequence=sequence, event=event, recorded_at=T0)
            for sequence, event in enumerate(events[start : start + chunk], start=start + 1)
        ]
        snapshot = apply(snapshot, batch) if snapshot is not None else project_run(batch)
        await store.append_if_sequence(
            run_id, start, [e.event for e in batch], index=run_index(snapshot), recorded_at=T0
        )
    assert snapshot is not None
    return snapshot


@contextlib.contextmanager
def memory_store(loop: asyncio.AbstractEventLoop) -> Iterator[EventStore]:
    """A fresh `MemoryStore`, closed afterwards (the in-memory counterpart of a backend's)."""
    store = MemoryStore()
    try:
        yield store
    finally:
        loop.run_until_complete(store.close())


WORKFLOW_STEPS = 10
"""Steps of the workflow benchmark's sequential workflow; each passes its output to the next."""
