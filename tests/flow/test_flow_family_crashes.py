"""Hypothesis crash schedules over parents, children and messages, through SQLite and PostgreSQL.

`crash_and_resume` compares the whole family (every child run's end and history shape) and
sends messages with `Flow.send` each round, to the parent and to its children, so a fault at any
write, in the parent's drive, a child's, a send's or a cancellation's, must leave the same runs.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings

from runfold import EventStore
from runfold.flow import recv, start_child, step, workflow
from runfold.stores import SQLiteStore
from runfold.testing import Fault, crash_and_resume
from runfold.testing.strategies import fault_schedules
from tests.support.postgres_support import suite_store


def price(item: str) -> int:
    return len(item)


def handled(note: Any) -> str:
    return f"handled {note}"


@workflow(name="test-family-line")
async def line(item: str) -> list[Any]:
    cost = await step(price, item)
    note = await recv("go")  # a message from another process, to the child
    return [item, cost, await step(handled, note)]


@workflow(name="test-family-parent")
async def parent(items: list[str]) -> list[Any]:
    handles = [await start_child(line, item) for item in items]
    ready = await recv("ship")  # a message to the parent
    return [ready, *[await handle.result() for handle in handles]]


@workflow(name="test-family-failing-parent")
async def failing_parent(item: str) -> None:
    await start_child(line, item)  # waits for a message that never comes
    if await step(price, item) > 0:
        raise RuntimeError("refused")  # the parent fails: its live child is cancelled


@asynccontextmanager
async def opened(backend: str) -> AsyncIterator[EventStore]:
    """A fresh store of `backend` for one example."""
    if backend == "postgres":
        store: EventStore = await suite_store()
        try:
            yield store
        finally:
            await store.close()
        return
    with tempfile.TemporaryDirectory() as folder:
        store = await SQLiteStore.open(Path(folder) / "runs.db")
        try:
            yield store
        finally:
            await store.close()


BACKENDS = ["sqlite", "postgres"]
Check = Callable[[str], Any]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=10, deadline=None)
@given(schedule=fault_schedules(max_write=24, max_faults=2))
async def test_a_family_with_messages_survives_any_fault_schedule(
    backend: str, schedule: tuple[Fault, ...]
) -> None:
    run_id = f"F-{uuid.uuid4().hex[:8]}"
    messages = [
        (f"{run_id}/2", "go", "second"),  # sent before the first: each child has its own
        (f"{run_id}/1", "go", "first"),
        (run_id, "ship", "now"),
    ]
    async with opened(backend) as store:
        outcome = await crash_and_resume(
            parent,
            ["pen", "ink"],
            store=store,
            schedule=schedule,
            workflows=[line],
            messages=messages,
            run_id=run_id,
        )
    assert outcome.same, outcome
    assert outcome.actual.output == [
        "now",
        ["pen", 3, "handled first"],
        ["ink", 3, "handled second"],
    ]
    assert [member[:2] for member in outcome.actual_family] == [
        (f"{run_id}/1", "completed"),
        (f"{run_id}/2", "completed"),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=8, deadline=None)
@given(schedule=fault_schedules(max_write=12, max_faults=2))
# Found by this test: the process dies after the parent's end, before its child is cancelled;
# the recovering process must cancel it.
@example(schedule=(Fault(write=3, moment="after", kind="stop"),))
async def test_a_child_is_cancelled_with_its_parent_under_any_fault_schedule(
    backend: str, schedule: tuple[Fault, ...]
) -> None:
    run_id = f"C-{uuid.uuid4().hex[:8]}"
    async with opened(backend) as store:
        outcome = await crash_and_resume(
            failing_parent,
            "pen",
            store=store,
            schedule=schedule,
            workflows=[line],
            run_id=run_id,
            same_if_failed=True,
        )
    assert outcome.same, outcome
    assert outcome.actual.status == "failed"
    assert [member[:2] for member in outcome.actual_family] == [(f"{run_id}/1", "cancelled")]
