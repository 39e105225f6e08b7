"""`workflow_info()` in workflow code and step bodies, on every store."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import pytest

from runfold import EventStore
from runfold.flow import Flow, NotInWorkflow, step, wait_for_event, workflow, workflow_info
from tests.conftest import T0, Clock


def info_here() -> dict[str, Any]:
    found = workflow_info()
    return {
        "run": found.run_id,
        "name": found.workflow_name,
        "version": found.workflow_version,
        "parent": found.parent_run_id,
        "started": found.started_at.isoformat(),
        "thread": threading.current_thread().name.startswith("runfold-step"),
    }


async def async_info_here() -> dict[str, Any]:
    return {**info_here(), "thread": threading.current_thread().name.startswith("runfold-step")}


@workflow(name="test-info")
async def informed(_: None) -> list[Any]:
    first = workflow_info()
    in_step = await step(info_here)
    await wait_for_event("go", token=f"info-{first.run_id}")
    in_async_step = await step(async_info_here)
    again = workflow_info()  # after a replay in a fresh Flow: the same
    return [first.run_id, first.workflow_name, again == first, in_step, in_async_step]


async def test_workflow_info_in_workflow_code_and_steps(store: EventStore, clock: Clock) -> None:
    await Flow(store, [informed], clock=clock, version="v7").start(informed, None, run_id="i1")
    clock.advance()
    done = await Flow(store, [informed], clock=clock).deliver("info-i1", None)  # a replay
    expected = {
        "run": "i1",
        "name": "test-info",
        "version": "v7",
        "parent": None,
        "started": T0.isoformat(),
    }
    assert done.status == "completed", done.error
    assert done.output == [
        "i1",
        "test-info",
        True,
        {**expected, "thread": True},  # a `def` body runs in the Flow's threads
        {**expected, "thread": False},  # an `async def` on the loop
    ]


def test_workflow_info_outside_a_run_is_typed() -> None:
    with pytest.raises(NotInWorkflow):
        workflow_info()


_MARK: contextvars.ContextVar[str] = contextvars.ContextVar("test_flow_info_mark", default="unset")


async def mark_seen() -> str:
    return _MARK.get()


@workflow(name="test-info-context")
async def marking(_: None) -> list[str]:
    before = _MARK.get()
    _MARK.set("set by the code")
    in_step = await step(mark_seen)  # the body runs in the engine's context, not the code's
    return [before, in_step, _MARK.get()]


async def test_workflow_code_keeps_its_own_context(store: EventStore, clock: Clock) -> None:
    _MARK.set("the caller's")
    done = await Flow(store, [marking], clock=clock).start(marking, None)
    assert done.status == "completed", done.error
    # The code sees its starter's variables, and what it sets lasts across its awaits...
    assert done.output == ["the caller's", "the caller's", "set by the code"]
    # ... without reaching the caller's context.
    assert _MARK.get() == "the caller's"
