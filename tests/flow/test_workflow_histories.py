"""History strategies for a given workflow: `workflow_histories` (a `runfold.flow` workflow and
its input, through the real `Flow`) and `valid_histories(workflow_name=, input=)` (the kernel's
generator, with the run's name and input fixed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from runfold import MemoryStore, Snapshot
from runfold.conformance.strategies import snapshots, valid_histories
from runfold.errors import InvalidCommand
from runfold.events import Envelope, RetryPolicy
from runfold.flow import Flow, JsonCodec, StepError, sleep, step, wait_for_event, workflow
from runfold.kernel import project_run
from runfold.testing.strategies import workflow_histories

TWICE = RetryPolicy(max_attempts=2)


def price(item: str) -> int:
    return 100 * len(item)


@workflow(name="test-histories-checkout")
async def checkout(items: list[str]) -> dict[str, Any]:
    total = 0
    for item in items:
        try:
            total += await step(price, item, retry=TWICE)
        except StepError:
            return {"status": "unpriced", "item": item}
    await sleep(timedelta(minutes=5))
    coupon = await wait_for_event("coupon", token="coupon-1")
    return {"status": "paid", "total": total - coupon}


ITEMS = ["pen", "lamp"]
EVENTS = {"coupon-1": 50}
QUICK = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def histories(**options: Any) -> st.SearchStrategy[list[Envelope]]:
    return workflow_histories(checkout, ITEMS, events=EVENTS, **options)


def agrees_with_the_code(run: Snapshot) -> None:
    """The workflow's code, replayed against `run`, meets the very calls it holds: it could have
    made this history (`FlowNonDeterminism` otherwise)."""
    flow = Flow(MemoryStore(), [checkout])
    if run.is_live:
        flow.interpreter.decide(run)


@QUICK
@given(history=histories())
def test_every_history_is_one_the_workflow_makes(history: list[Envelope]) -> None:
    run = project_run(history)
    assert run.run_id == "run-1" and run.workflow_name == "test-histories-checkout"
    assert run.input == JsonCodec().encode(ITEMS)
    assert [e.sequence for e in history] == list(range(1, len(history) + 1))
    agrees_with_the_code(run)
    if run.status == "completed":
        output = JsonCodec().decode(run.output or b"")
        assert output in ({"status": "paid", "total": 650}, *UNPRICED)


UNPRICED = [{"status": "unpriced", "item": item} for item in ITEMS]


@settings(QUICK, max_examples=10)
@given(data=st.data())
async def test_drawn_inside_an_async_test_and_whole(data: st.DataObject) -> None:
    """Drawn while an event loop runs (the Flow runs in a thread of its own), and uncut: every
    event is delivered and every sleep and retry falls due, so the run ended."""
    asyncio.get_running_loop()  # the draw below is made inside it
    history = data.draw(histories(prefixes=False))
    assert project_run(history).status == "completed"


def _found(condition: Callable[[list[Envelope]], bool], **options: Any) -> list[Envelope]:
    budget = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    return find(histories(**options), condition, settings=budget)


def _events(history: list[Envelope], kind: str) -> list[Any]:
    return [e.event for e in history if e.event.event_type == kind]


def test_histories_reach_what_a_run_meets_in_production() -> None:
    retried = _found(lambda h: bool(_events(h, "step_retrying")))
    assert project_run(retried).steps["1"].attempt >= 1
    interrupted = _found(lambda h: any(e.after_interruption for e in _events(h, "step_started")))
    agrees_with_the_code(project_run(interrupted))
    unpriced = _found(lambda h: bool(_events(h, "step_failed")), prefixes=False)
    assert JsonCodec().decode(project_run(unpriced).output or b"") in UNPRICED
    asleep = _found(lambda h: project_run(h).open_waits() != ())
    assert project_run(asleep).is_live
    paid = _found(lambda h: project_run(h).status == "completed" and not _events(h, "step_failed"))
    assert JsonCodec().decode(project_run(paid).output or b"") == {"status": "paid", "total": 650}


def test_without_faults_or_failures_the_history_is_the_clean_one() -> None:
    clean = _found(lambda h: True, max_failures=0, max_faults=0, prefixes=False)
    kinds = [e.event.event_type for e in clean]
    assert kinds.count("step_started") == 2 and "step_retrying" not in kinds
    assert kinds[-1] == "run_completed"


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="max_write"):
        workflow_histories(checkout, ITEMS, max_write=0)
    with pytest.raises(ValueError, match="max_failures"):
        workflow_histories(checkout, ITEMS, max_failures=-1)


# --- valid_histories of a given workflow name and input -----------------------------------------


@QUICK
@given(history=valid_histories(workflow_name="billing", input=b'{"plan": "pro"}'))
def test_valid_histories_of_a_named_workflow_and_input(history: list[Envelope]) -> None:
    run = project_run(history)
    assert (run.workflow_name, run.input) == ("billing", b'{"plan": "pro"}')


@QUICK
@given(run=snapshots(workflow_name="billing"))
def test_snapshots_of_a_named_workflow(run: Snapshot) -> None:
    assert run.workflow_name == "billing"


def test_a_name_or_input_no_run_can_have_is_refused_at_once() -> None:
    with pytest.raises(InvalidCommand, match="workflow_name"):
        valid_histories(workflow_name="")
    with pytest.raises(InvalidCommand, match="input"):
        snapshots(input="text, not bytes")  # type: ignore[arg-type]
