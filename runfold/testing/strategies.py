"""Hypothesis strategies for crash tests and for code that reads a workflow's histories.

`fault_schedules` draws schedules for `CrashingStore`; `workflow_histories` draws the histories
a given `runfold.flow` workflow makes with a given input, through the real `Flow`, when its
steps fail and its process dies. Needs hypothesis (the `conformance` extra).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from runfold.flow import PayloadCodec, Workflow
from runfold.kernel import Envelope
from runfold.testing._record import record_history, run_sync
from runfold.testing.crash import Fault

__all__ = ["fault_schedules", "workflow_histories"]

_RUN_ID = "run-1"
_ROUNDS = 50


def fault_schedules(
    *, max_write: int = 30, max_faults: int = 3
) -> st.SearchStrategy[tuple[Fault, ...]]:
    """Schedules of up to `max_faults` faults at distinct writes 1..`max_write`, in write order.

    Each fault fails or stops the process, before or after its write; shrinking goes towards
    fewer faults at earlier writes.
    """
    if max_write < 1 or max_faults < 0:
        raise ValueError("max_write must be at least 1 and max_faults at least 0")
    fault = st.builds(
        Fault,
        write=st.integers(1, max_write),
        moment=st.sampled_from(("before", "after")),
        kind=st.sampled_from(("stop", "fail")),
    )
    return st.lists(fault, max_size=max_faults, unique_by=lambda f: f.write).map(
        lambda faults: tuple(sorted(faults, key=lambda f: f.write))
    )


@st.composite
def _workflow_histories(
    draw: st.DrawFn,
    workflow: Workflow,
    input: Any,
    events: Mapping[str, Any],
    codec: PayloadCodec | None,
    run_id: str,
    max_failures: int,
    max_faults: int,
    max_write: int,
    prefixes: bool,
) -> list[Envelope]:
    failing = draw(st.lists(st.integers(1, max_write), max_size=max_failures, unique=True))
    schedule = draw(fault_schedules(max_write=max_write, max_faults=max_faults))
    recorded = run_sync(
        lambda: record_history(
            workflow,
            input,
            run_id=run_id,
            events=events,
            codec=codec,
            failing=failing,
            schedule=schedule,
            rounds=_ROUNDS,
        )
    )
    history = recorded.history
    if prefixes and recorded.heads:
        # Shrinks towards the whole history; else the run as it stood after one of its appends.
        cut = draw(st.one_of(st.just(len(history)), st.sampled_from(recorded.heads)))
        history = history[:cut]
    return history


def workflow_histories(
    workflow: Workflow,
    input: Any,
    *,
    events: Mapping[str, Any] | None = None,
    codec: PayloadCodec | None = None,
    run_id: str = _RUN_ID,
    max_failures: int = 3,
    max_faults: int = 2,
    max_write: int = 20,
    prefixes: bool = True,
) -> st.SearchStrategy[list[Envelope]]:
    """Histories of run `run_id` of `workflow(input)` as `runfold.flow` really makes them.

    Each example runs the workflow through a `Flow` on a `MemoryStore` and returns the stored
    history. What is drawn is what a run meets in production: up to `max_failures` step
    attempts (among the first `max_write` bodies run) fail with a retryable `StepFailure`
    (`code="injected"`), so the steps' retry policies and the workflow's `StepError` handling
    play out; up to `max_faults` faults (`fault_schedules`) fail a write or stop the process
    before or after it, after which a fresh `Flow` recovers the run, so interrupted attempts
    (`after_interruption`) and replays happen. The clock moves a day per round, so every sleep
    and retry falls due, and `events` maps hook tokens to the payloads delivered once their
    `wait_for_event` is live. A run that waits for an event not in `events` stays live.

    With `prefixes`, a history is often cut after one of its appends: the run as it stood at
    that moment (pending, suspended on a sleep or a retry, with a step interrupted …). Shrinking
    goes towards the whole history with fewer, earlier failures and faults.

    Raises:
        ValueError: A bound below its minimum.
    """
    if max_failures < 0 or max_faults < 0 or max_write < 1:
        raise ValueError("max_failures and max_faults must be at least 0, max_write at least 1")
    return _workflow_histories(
        workflow,
        input,
        dict(events or {}),
        codec,
        run_id,
        max_failures,
        max_faults,
        max_write,
        prefixes,
    )
