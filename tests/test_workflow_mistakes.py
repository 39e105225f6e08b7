"""Workflow mistakes: whatever workflow code or a step body does, the run ends or waits.

Each test is a reproduction from issue 30: before the fix the run was left `running` for ever,
or the mistake escaped `recover()` and stopped the runs behind it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from runfold import CommandHandler, EventStore
from runfold.engine import (
    BaseExceptionRaised,
    Complete,
    Engine,
    RuntimeDecision,
    ScheduleStep,
    ScheduleSteps,
    StepInvocation,
    WorkflowInvocation,
)
from runfold.flow import Flow, sleep, step, workflow
from runfold.kernel import RetryPolicy, StepFailed, StepStarted
from tests.conftest import Clock
from tests.test_engine import Scripted, echo

ONCE = RetryPolicy(max_attempts=1)

BASE_EXCEPTIONS: dict[str, BaseException] = {
    "SystemExit": SystemExit(3),
    "KeyboardInterrupt": KeyboardInterrupt(),
    "GeneratorExit": GeneratorExit(),
    "CancelledError": asyncio.CancelledError(),
}
"""What code may raise that is not an `Exception`, by class name."""

RAISING: dict[str, BaseException] = {}
"""What the workflows below raise, set by each test (workflows are defined once per process)."""

runs_of_body = 0


def counted(x: int) -> int:
    global runs_of_body
    runs_of_body += 1
    return x


def raise_it(kind: str) -> None:
    raise RAISING[kind]


@workflow(name="test-mistakes-raises")
async def raises(kind: str) -> None:
    raise RAISING[kind]


@workflow(name="test-mistakes-raises-after-sleep")
async def raises_after_sleep(kind: str) -> str:
    await sleep(timedelta(hours=1))
    if kind != "none":
        raise RAISING[kind]
    return "slept"


@workflow(name="test-mistakes-raises-after-step")
async def raises_after_step(kind: str) -> None:
    await step(counted, 7)
    raise RAISING[kind]


@workflow(name="test-mistakes-step-raises")
async def step_raises(kind: str) -> None:
    await step(raise_it, kind, retry=ONCE)


def is_base_exception_failure(error: str | None, kind: str) -> bool:
    return (
        error is not None
        and error.startswith("BaseExceptionRaised: ")
        and f"raised {kind}(" in error
        and "taken as its failure" in error
    )


@pytest.mark.parametrize("kind", sorted(BASE_EXCEPTIONS))
async def test_a_base_exception_from_workflow_code_fails_the_run(
    store: EventStore, kind: str
) -> None:
    RAISING[kind] = BASE_EXCEPTIONS[kind]
    run = await Flow(store, [raises]).start(raises, kind, run_id="r")
    assert run.status == "failed"
    assert is_base_exception_failure(run.error, kind), run.error
    assert run.snapshot.error_code == "BaseExceptionRaised"


@pytest.mark.parametrize("kind", sorted(BASE_EXCEPTIONS))
async def test_a_base_exception_after_a_sleep_never_stops_recovery(
    store: EventStore, clock: Clock, kind: str
) -> None:
    RAISING[kind] = BASE_EXCEPTIONS[kind]
    flow = Flow(store, [raises_after_sleep], clock=clock)
    await flow.start(raises_after_sleep, kind, run_id="a-raises")
    await flow.start(raises_after_sleep, "none", run_id="b-behind")
    clock.advance(timedelta(hours=2))
    # A host restarting: a fresh Flow recovers every live run, the one behind included.
    resumed = await Flow(store, [raises_after_sleep], clock=clock).recover()
    assert {r.run_id: r.error for r in resumed} == {"a-raises": None, "b-behind": None}
    failed = await flow.result("a-raises")
    assert failed.status == "failed" and is_base_exception_failure(failed.error, kind)
    assert (await flow.result("b-behind")).output == "slept"
    assert await Flow(store, [raises_after_sleep], clock=clock).recover() == ()


@pytest.mark.parametrize("kind", sorted(BASE_EXCEPTIONS))
async def test_a_base_exception_after_a_step_keeps_the_steps_result(
    store: EventStore, kind: str
) -> None:
    global runs_of_body
    RAISING[kind] = BASE_EXCEPTIONS[kind]
    runs_of_body = 0
    flow = Flow(store, [raises_after_step])
    run = await flow.start(raises_after_step, kind, run_id="r")
    assert run.status == "failed" and is_base_exception_failure(run.error, kind)
    assert run.snapshot.steps["1"].status == "completed"
    assert await Flow(store, [raises_after_step]).recover() == ()
    assert runs_of_body == 1


@pytest.mark.parametrize("kind", sorted(BASE_EXCEPTIONS))
async def test_a_base_exception_from_a_step_body_fails_the_step(
    store: EventStore, kind: str
) -> None:
    RAISING[kind] = BASE_EXCEPTIONS[kind]
    run = await Flow(store, [step_raises]).start(step_raises, kind, run_id="r")
    assert run.status == "failed"
    step_error = (run.snapshot.steps["1"].error or b"").decode()
    assert is_base_exception_failure(step_error, kind), step_error
    assert f"step 'raise_it' (id '1') of run 'r' raised {kind}(" in step_error
    assert run.error is not None and run.error.startswith("StepError: step 'raise_it' failed")


def test_base_exception_raised_is_a_documented_engine_error() -> None:
    assert BaseExceptionRaised.code == "base_exception_raised"
    error = BaseExceptionRaised("m", run_id="r", raised="SystemExit")
    assert (error.run_id, error.raised) == ("r", "SystemExit")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


MESSAGES: dict[str, tuple[Exception, str]] = {
    "lone-surrogate": (ValueError("bad \udc80 byte"), "ValueError: bad \\udc80 byte"),
    "raising-str": (Unprintable(), "Unprintable: <its message could not be read: RuntimeError>"),
}


def fails_with(case: str) -> None:
    raise MESSAGES[case][0]


@workflow(name="test-mistakes-step-message")
async def step_message(case: str) -> None:
    await step(fails_with, case, retry=RetryPolicy(max_attempts=2))


@pytest.mark.parametrize("case", sorted(MESSAGES))
async def test_a_step_error_is_recorded_whatever_its_message(
    store: EventStore, clock: Clock, case: str
) -> None:
    flow = Flow(store, [step_message], clock=clock)
    run = await flow.start(step_message, case, run_id="r")
    assert run.status == "running"  # its first attempt failed, recorded: a retry waits
    assert (run.snapshot.steps["1"].error or b"").decode() == MESSAGES[case][1]
    clock.advance(timedelta(minutes=5))
    await flow.run_until_idle()
    run = await flow.result("r")
    assert run.status == "failed" and run.error is not None
    assert run.error.endswith(MESSAGES[case][1])
    failures = [e.event for e in await store.read("r") if isinstance(e.event, StepFailed)]
    assert len(failures) == 1 and failures[0].error == MESSAGES[case][1].encode()


gate: asyncio.Event | None = None


async def held(x: int) -> int:
    if current_attempt() == 1:
        assert gate is not None
        await gate.wait()  # never set: the host cancels the drive meanwhile
    return x


def current_attempt() -> int:
    from runfold.flow import current_step

    return current_step().attempt


@workflow(name="test-mistakes-held")
async def held_workflow(x: int) -> int:
    result: int = await step(held, x)
    return result


async def test_a_cancelled_host_task_propagates_and_records_nothing(store: EventStore) -> None:
    global gate
    gate = asyncio.Event()
    flow = Flow(store, [held_workflow])
    drive = asyncio.create_task(flow.start(held_workflow, 5, run_id="r"))
    for _ in range(10_000):
        if (await store.head("r")) > 0 and (await flow.result("r")).snapshot.steps:
            break
        await asyncio.sleep(0.001)
    drive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drive
    events = [e.event for e in await store.read("r")]
    assert isinstance(events[-1], StepStarted)  # nothing recorded for the cancellation
    resumed = await Flow(store, [held_workflow]).recover()
    assert [r.error for r in resumed] == [None]
    done = await flow.result("r")
    assert done.output == 5 and done.snapshot.steps["1"].attempt == 2


def exits_on_second_look(invocation: WorkflowInvocation) -> RuntimeDecision:
    steps = invocation.snapshot.steps
    if not steps:
        return ScheduleSteps(
            steps=[ScheduleStep(step_id=i, step_name=i, input=b"", retry=ONCE) for i in "ab"]
        )
    if all(s.status in ("completed", "failed") for s in steps.values()):
        raise SystemExit("a runtime's own exit")
    return Complete(output=b"")


async def test_a_base_exception_from_a_runtime_is_reported_and_bodies_are_outcomes(
    handler: CommandHandler,
) -> None:
    async def interrupted(invocation: StepInvocation) -> bytes:
        raise KeyboardInterrupt

    runtime = Scripted(exits_on_second_look, {"a": echo, "b": interrupted})
    engine = Engine(handler, runtime)
    with pytest.raises(BaseExceptionRaised, match="run_workflow of run 'r' raised SystemExit"):
        await engine.start("wf", b"", run_id="r")
    run = await handler.snapshot("r")
    assert run.steps["a"].status == "completed"  # recorded before the runtime's exit
    assert run.steps["b"].status == "failed"
    assert b"raised KeyboardInterrupt()" in (run.steps["b"].error or b"")
    (resumed,) = await engine.recover()
    assert isinstance(resumed.error, BaseExceptionRaised) and resumed.error.raised == "SystemExit"
