"""Workflow mistakes: whatever workflow code or a step body does, the run ends or waits.

Each test is a reproduction from issue 30: before the fix the run was left `running` for ever,
or the mistake escaped `recover()` and stopped the runs behind it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runfold import CommandHandler, EventStore, MemoryStore
from runfold.engine import (
    DEFAULT_STEP_TIMEOUT,
    BaseExceptionRaised,
    Complete,
    Engine,
    RuntimeDecision,
    ScheduleStep,
    ScheduleSteps,
    StepInvocation,
    UpdateAttributes,
    WorkflowInvocation,
)
from runfold.flow import Flow, PayloadError, StepError, sleep, step, wait_for_event, workflow
from runfold.kernel import Limits, RetryPolicy, StepFailed, StepStarted
from tests.conftest import Clock
from tests.engine.test_engine import Scripted, echo

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


# --- a run always ends or waits -----------------------------------------------------------------

BIG = "x" * (3 * 1024 * 1024)
"""Over the 2 MiB payload limit once encoded."""


def keep(value: object) -> object:
    return value


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def returns_a_set() -> object:
    return {1, 2}


def returns_big() -> str:
    return BIG


async def never_returns() -> None:
    await asyncio.Event().wait()


MISTAKES: dict[str, Any] = {}
"""Each mistake's workflow body, by name: `test-mistakes-case` runs `MISTAKES[input]`."""


def mistake(fn: Any) -> Any:
    MISTAKES[fn.__name__.replace("_", "-")] = fn
    return fn


@mistake
async def unencodable_return() -> object:
    return {1, 2}


@mistake
async def deeply_nested_return() -> object:
    return nested(100_000)


@mistake
async def output_over_the_limit() -> object:
    return BIG


@mistake
async def step_name_too_long() -> object:
    return await step(keep, 1, name="n" * 1000)


@mistake
async def step_name_with_a_newline() -> object:
    return await step(keep, 1, name="charge\ncard")


@mistake
async def step_name_with_a_lone_surrogate() -> object:
    return await step(keep, 1, name="charge\udc80")


@mistake
async def asyncio_sleep_in_workflow_code() -> object:
    await asyncio.sleep(0)
    return 1


@mistake
async def step_arguments_unencodable() -> object:
    return await step(keep, {1, 2})


@mistake
async def step_arguments_over_the_limit() -> object:
    return await step(keep, BIG)


@mistake
async def step_result_unencodable() -> object:
    return await step(returns_a_set, retry=ONCE)


@mistake
async def step_result_over_the_limit() -> object:
    return await step(returns_big)


@mistake
async def empty_hook_token() -> object:
    return await wait_for_event("approval", token="")


@mistake
async def hook_token_too_long() -> object:
    return await wait_for_event("approval", token="t" * 5000)


@mistake
async def step_body_never_returns() -> object:
    return await step(never_returns, timeout=0.05, retry=ONCE)


@workflow(name="test-mistakes-case")
async def mistaken(case: str) -> object:
    return await MISTAKES[case]()


ENDS: dict[str, tuple[str, str]] = {
    "unencodable-return": (
        "PayloadError",
        "PayloadError: the workflow's return value cannot be encoded: cannot encode a set",
    ),
    "deeply-nested-return": (
        "PayloadError",
        "PayloadError: the workflow's return value cannot be encoded: cannot encode a list",
    ),
    "output-over-the-limit": ("InvalidDecision", "output is 3145730 bytes, over the 2097152 limit"),
    "step-name-too-long": ("InvalidDecision", "step_name is 1000 characters, over the 256 limit"),
    "step-name-with-a-newline": (
        "InvalidDecision",
        "step_name 'charge\\ncard' contains a control character (the decision: "
        "ScheduleStep(step_id='1'",
    ),
    "step-name-with-a-lone-surrogate": ("InvalidDecision", "step_name is not valid unicode"),
    "asyncio-sleep-in-workflow-code": (
        "UnsupportedAwait",
        "UnsupportedAwait: workflow code awaited None after call 0",
    ),
    "step-arguments-unencodable": (
        "PayloadError",
        "PayloadError: the arguments of step 'keep' (call 1) cannot be encoded",
    ),
    "step-arguments-over-the-limit": ("InvalidDecision", "input is 3145732 bytes"),
    "step-result-unencodable": ("StepError", "failed: PayloadError: cannot encode a set as JSON"),
    "step-result-over-the-limit": ("StepError", "output is 3145730 bytes, over the 2097152 limit"),
    "empty-hook-token": ("InvalidDecision", "hook token must be a non-empty string"),
    "hook-token-too-long": ("InvalidDecision", "hook token is over the 1024 character limit"),
    "step-body-never-returns": (
        "StepError",
        "StepTimedOut: step 'never_returns' (id '1') of run 'r' did not return within "
        "0:00:00.050000 (attempt 1)",
    ),
}


@pytest.mark.parametrize("case", sorted(ENDS))
async def test_a_workflow_mistake_fails_the_run_with_a_runfold_error(
    store: EventStore, case: str
) -> None:
    code, text = ENDS[case]
    run = await Flow(store, [mistaken]).start(mistaken, case, run_id="r")
    assert run.status == "failed", run
    assert run.snapshot.error_code == code
    assert run.error is not None and run.error.startswith(f"{code}: ") and text in run.error
    assert await Flow(store, [mistaken]).recover() == ()  # nothing is left to pick up


def test_every_mistake_is_checked() -> None:
    assert set(ENDS) == set(MISTAKES)


@workflow(name="test-mistakes-catches-its-arguments")
async def catches_its_arguments(_: None) -> str:
    try:
        await step(keep, {1, 2})
    except PayloadError as exc:
        return f"caught: {exc}"
    return "not caught"


async def test_step_arguments_the_codec_refuses_are_raised_at_the_call(store: EventStore) -> None:
    run = await Flow(store, [catches_its_arguments]).start(catches_its_arguments, None)
    assert run.status == "completed"
    assert run.output.startswith("caught: the arguments of step 'keep' (call 1) cannot be encoded")


@workflow(name="test-mistakes-sleeps-for-ever")
async def sleeps_for_ever(_: None) -> None:
    await sleep(timedelta.max)


async def test_a_sleep_past_the_last_date_waits_until_it(store: EventStore) -> None:
    run = await Flow(store, [sleeps_for_ever]).start(sleeps_for_ever, None, run_id="r")
    assert run.status == "running"
    assert run.snapshot.waits["1"].resume_at == datetime.max.replace(tzinfo=UTC)


@workflow(name="test-mistakes-long")
async def long_one(n: int) -> int:
    total = 0
    for i in range(n):
        total = await step(keep, total + i)
    return total


async def test_a_run_past_the_history_limit_fails_saying_so(store: EventStore) -> None:
    flow = Flow(store, [long_one])
    flow.handler.limits = Limits(max_events_per_run=30)
    run = await flow.start(long_one, 100, run_id="r")
    assert run.status == "failed" and run.snapshot.error_code == "HistoryLimitExceeded"
    assert run.error is not None
    assert run.error.startswith("HistoryLimitExceeded: run 'r' holds 29 events")
    assert "limit of 30" in run.error
    assert run.snapshot.last_sequence == 30


async def slow(x: int) -> int:
    await asyncio.sleep(0.05)
    return x


async def own_timeout() -> None:
    raise TimeoutError("the payment API timed out")


@workflow(name="test-mistakes-timeouts")
async def timeouts(_: None) -> str:
    try:
        await step(own_timeout, retry=ONCE)
    except StepError as exc:
        first = exc.step_error
    await step(slow, 1, timeout=timedelta(seconds=30))  # its own bound, over the engine's
    return first


async def test_the_engine_step_timeout_is_a_default_a_step_may_lift(store: EventStore) -> None:
    flow = Flow(store, [timeouts])
    assert flow.engine.step_timeout == DEFAULT_STEP_TIMEOUT == timedelta(minutes=10)
    flow.engine.step_timeout = timedelta(milliseconds=1)
    run = await flow.start(timeouts, None, run_id="r")
    assert run.status == "completed"
    assert run.output == "TimeoutError: the payment API timed out"  # a body's own: not a timeout
    with pytest.raises(ValueError, match="positive"):
        step(slow, 1, timeout=0)
    with pytest.raises(ValueError, match="step_timeout"):
        Engine(flow.handler, flow, step_timeout=timedelta(0))


# --- long runs ----------------------------------------------------------------------------------


async def test_a_drive_goes_on_until_the_run_ends_not_for_a_count_of_steps() -> None:
    """`Flow.start` raised `ReplayLimitExceeded` after 1,024 steps, and nothing drove on."""
    flow = Flow(MemoryStore(), [long_one])
    run = await flow.start(long_one, 2_000, run_id="r")
    assert run.status == "completed" and run.output == sum(range(2_000))
    assert flow.engine.max_replay_iterations is None


async def test_a_workflow_that_never_settles_fails_at_the_history_limit(
    handler: CommandHandler,
) -> None:
    def chatty(invocation: WorkflowInvocation) -> RuntimeDecision:
        return UpdateAttributes(changes={"n": str(invocation.snapshot.last_sequence)})

    handler.limits = Limits(max_events_per_run=50)
    run = await Engine(handler, Scripted(chatty)).start("wf", b"", run_id="r")
    assert run.status == "failed" and run.error_code == "HistoryLimitExceeded"
    assert run.last_sequence == 51  # its end may always take one event past the limit
