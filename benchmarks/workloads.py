"""The histories benchmarks replay: step-heavy runs, as a workflow engine writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from runfold import (
    Envelope,
    Event,
    RunCreated,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepStarted,
)

__all__ = ["PAYLOAD_BYTES", "T0", "step_events", "step_heavy_history"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PAYLOAD_BYTES = 64
"""Size of every step input and output: a small serialized JSON document."""


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
