"""`Engine`: every operation on every backend with a scripted runtime; races between engines,
crashes injected between any two appends, retry timing and jitter, at-least-once steps,
non-determinism, and observers that misbehave.

The runtime is scripted: the workflow is a plain function of the invocation and the step bodies
a table by step name; both record what they were asked. Time is the hand-driven `clock`, so no
test sleeps or reads the wall clock.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import pytest

from runfold import CommandHandler, EventStore, Snapshot
from runfold.commands import CreateRun
from runfold.engine import (
    DEFAULT_JITTER,
    DEFAULT_RETRY,
    LONGEST_RETRY_INTERVAL,
    AwaitHook,
    Cancel,
    Complete,
    Engine,
    Fail,
    LinkChildOperation,
    ReplayLimitExceeded,
    ReportProgress,
    RunDefinitionConflict,
    RuntimeDecision,
    ScheduleStep,
    ScheduleSteps,
    StepFailure,
    StepInvocation,
    Suspension,
    TimeOut,
    UpdateAttributes,
    WaitUntil,
    WorkflowInvocation,
    jitter_fraction,
    retry_delay,
)
from runfold.errors import (
    HookNotFound,
    InvalidCommand,
    NonDeterministic,
    RunNotFound,
    StoreUnavailable,
    TerminalState,
    WaitNotFound,
)
from runfold.events import (
    Envelope,
    HookConflict,
    RetryPolicy,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunTimedOut,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
)
from runfold.kernel import Wakeup
from runfold.store_retry import StoreRetry
from tests.conftest import T0, Clock
from tests.handler.test_handler import DelegatingStore

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
RETRY = RetryPolicy(
    max_attempts=5,
    initial_interval=timedelta(seconds=10),
    max_interval=timedelta(minutes=5),
    non_retryable_error_codes=("fatal",),
)
TOKEN = "tok-"

Workflow = Callable[[WorkflowInvocation], RuntimeDecision]
Body = Callable[[StepInvocation], Awaitable[bytes]]


WORKFLOWS = frozenset({"wf", "order", "fan", "late", "listener", "quick", "retrier", "sleeper"})
"""The workflow names this module's runs use: what a `Scripted` runtime serves by default."""


class Scripted:
    """A `WorkflowRuntime` whose workflow is a function and whose step bodies are a table."""

    def __init__(
        self,
        workflow: Workflow,
        bodies: Mapping[str, Body] | None = None,
        *,
        workflow_names: Collection[str] = WORKFLOWS,
    ) -> None:
        self.workflow_names = workflow_names
        self.workflow = workflow
        self.bodies = dict(bodies or {})
        self.decisions = 0
        self.steps: list[StepInvocation] = []

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        self.decisions += 1
        await asyncio.sleep(0)  # a real runtime awaits something: let other tasks in
        return self.workflow(invocation)

    async def run_step(self, invocation: StepInvocation) -> bytes:
        self.steps.append(invocation)
        return await self.bodies.get(invocation.step_name, echo)(invocation)


async def echo(invocation: StepInvocation) -> bytes:
    await asyncio.sleep(0)
    return b"out:" + invocation.input


async def flaky(invocation: StepInvocation) -> bytes:
    """Fails its first attempt with a retryable error, then succeeds."""
    await asyncio.sleep(0)
    if invocation.attempt == 1:
        raise StepFailure(b"timeout", code="timeout")
    return b"paid"


def order(invocation: WorkflowInvocation) -> RuntimeDecision:
    """Every decision kind: attributes, parallel steps (one flaky), progress, a child link, a
    timer, a hook, completion; on cancellation a cleanup step, then `Cancel`."""
    run = invocation.snapshot
    if run.cancellation is not None:
        refund = run.steps.get("refund")
        if refund is None or refund.status not in ("completed", "failed"):
            return ScheduleStep(step_id="refund", step_name="refund", input=b"r")
        return Cancel()
    if "customer" not in run.attributes:
        return UpdateAttributes(changes={"customer": "acme"}, write_id="tags")
    batch = [
        ScheduleStep(step_id=name, step_name=name, input=name.encode(), retry=RETRY)
        for name in ("reserve", "charge", "notify")
    ]
    states = [run.steps.get(call.step_id) for call in batch]
    for state in states:
        if state is not None and state.status == "failed":
            return Fail(error=state.error or b"", error_code="step_failed")
    if not all(s is not None and s.status == "completed" for s in states):
        return ScheduleSteps(steps=batch)
    if "paid" not in run.progress:
        return ReportProgress(progress_id="paid", completed=1, total=2, message="charged")
    if "invoice" not in run.children:
        return LinkChildOperation(
            reference_id="invoice", kind="run", operation_id="op-1", child_run_id="child-1"
        )
    cool = run.waits.get("cool")
    if cool is None or cool.status == "waiting":
        return WaitUntil(wait_id="cool", resume_at=run.created_at + MINUTE)
    hook = run.hooks.get("shipped")
    if hook is None or not hook.deliveries:
        return AwaitHook(hook_id="shipped", token=TOKEN + run.run_id)
    return Complete(output=b"done:" + hook.deliveries[0].payload)


def order_runtime() -> Scripted:
    return Scripted(order, {"charge": flaky})


async def finish(engine: Engine, clock: Clock, run_id: str) -> Snapshot:
    """Host an `order` run to its end: start (idempotent), then advance the clock to each
    wakeup and `resume_due`, delivering the hook when the run waits for it."""
    run = await engine.start("order", b"in", run_id=run_id)
    for _ in range(50):
        if run.is_terminal:
            return run
        hook = run.hooks.get("shipped")
        if hook is not None and hook.status == "active" and not hook.deliveries:
            run = await engine.deliver(TOKEN + run_id, b"parcel", delivery_id="d-1")
            continue
        clock.now = max(clock.now, min(w.due_at for w in run.wakeups()))
        for resumed in await engine.resume_due():
            if resumed.error is not None:
                raise resumed.error
        run = await engine.handler.snapshot(run_id)
    raise AssertionError(f"run {run_id} did not finish")


def final_state(run: Snapshot) -> object:
    """What a run ended with, leaving out what a crash may change (attempt counts, errors)."""
    return (
        run.status,
        run.output,
        dict(run.attributes),
        {k: (s.status, s.output) for k, s in run.steps.items()},
        {k: w.status for k, w in run.waits.items()},
        {k: (h.status, [d.payload for d in h.deliveries]) for k, h in run.hooks.items()},
        sorted(run.progress),
        sorted(run.children),
    )


def types(history: Sequence[Envelope]) -> list[str]:
    return [e.event.event_type for e in history]


def assert_one_outcome_each(history: Sequence[Envelope]) -> None:
    """Every step has exactly one outcome and the run exactly one end."""
    created = {e.event.step_id for e in history if isinstance(e.event, StepCreated)}
    outcomes = Counter(
        e.event.step_id for e in history if isinstance(e.event, StepCompleted | StepFailed)
    )
    assert outcomes == dict.fromkeys(created, 1)
    ends = (RunCompleted, RunFailed, RunCancelled, RunTimedOut)
    assert sum(isinstance(e.event, ends) for e in history) == 1


class CrashingStore(DelegatingStore):
    """Counts appends; the `crash_at`-th raises `StoreUnavailable`, before writing or, for a
    lost acknowledgement, after."""

    def __init__(
        self, inner: EventStore, crash_at: int | None = None, *, after_write: bool = False
    ) -> None:
        super().__init__(inner)
        self.crash_at = crash_at
        self.after_write = after_write
        self.appends = 0

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        self.appends += 1
        crash = self.appends == self.crash_at
        if crash and not self.after_write:
            raise StoreUnavailable("injected crash before the append")
        envelopes = await super()._append_if_sequence(*call)
        if crash:
            raise StoreUnavailable("injected crash after the append")
        return envelopes


class Recorder:
    """An observer that keeps what it saw."""

    def __init__(self) -> None:
        self.seen: list[Envelope] = []

    async def on_event(self, envelope: Envelope) -> None:
        self.seen.append(envelope)


class Boom:
    """An observer that always raises."""

    async def on_event(self, envelope: Envelope) -> None:
        raise RuntimeError(f"observer broke on {envelope.sequence}")


# --- a whole run ----------------------------------------------------------------------------------


async def test_a_run_goes_from_start_to_completion(
    handler: CommandHandler, clock: Clock, store: EventStore
) -> None:
    runtime = order_runtime()
    engine = Engine(handler, runtime)
    run = await engine.start("order", b"in", run_id="r1")

    # The charge failed once: the run waits for its delayed retry; the other steps finished.
    assert run.status == "running" and run.is_suspended
    assert run.attributes == {"customer": "acme"}
    assert {k: s.status for k, s in run.steps.items()} == {
        "reserve": "completed",
        "charge": "pending",
        "notify": "completed",
    }
    delay = retry_delay(RETRY, run_id="r1", step_id="charge", attempt=1)
    assert run.steps["charge"].retry_after == T0 + delay
    assert await engine.next_wakeup() == Wakeup(
        run_id="r1", kind="retry", subject_id="charge", due_at=T0 + delay
    )

    clock.now = T0 + delay
    [resumed] = await engine.resume_due()
    run = await handler.snapshot("r1")
    assert resumed.run_id == "r1" and resumed.snapshot == run
    assert run.steps["charge"].status == "completed" and run.steps["charge"].attempt == 2
    assert run.progress["paid"].completed == 1 and run.children["invoice"].operation_id == "op-1"
    assert run.open_waits()[0].resume_at == T0 + MINUTE

    clock.now = T0 + MINUTE
    await engine.resume_due()
    run = await handler.snapshot("r1")
    assert run.waits["cool"].status == "completed" and [h.hook_id for h in run.active_hooks()] == [
        "shipped"
    ]

    run = await engine.deliver(TOKEN + "r1", b"parcel", delivery_id="d-1")
    assert run.status == "completed" and run.output == b"done:parcel"
    history = await store.read("r1")
    assert_one_outcome_each(history)
    assert types(history)[:3] == ["run_created", "run_started", "attributes_set"]
    assert types(history)[-3:] == ["hook_created", "hook_received", "run_completed"]
    assert [s.idempotency_key for s in runtime.steps if s.step_id == "charge"] == [
        "r1/charge",
        "r1/charge",
    ]
    assert runtime.steps[-1].previous_error == b"timeout"


async def test_parallel_steps_are_started_before_any_finishes(handler: CommandHandler) -> None:
    started: list[str] = []
    gate = asyncio.Event()

    async def held(invocation: StepInvocation) -> bytes:
        started.append(invocation.step_id)
        await gate.wait()
        return b"ok"

    def three(invocation: WorkflowInvocation) -> RuntimeDecision:
        steps = [ScheduleStep(step_id=f"s{i}", step_name="held", input=b"") for i in range(3)]
        found = [invocation.snapshot.steps.get(s.step_id) for s in steps]
        if all(s is not None and s.status == "completed" for s in found):
            return Complete(output=b"")
        return ScheduleSteps(steps=steps)

    engine = Engine(handler, Scripted(three, {"held": held}))
    driving = asyncio.create_task(engine.start("wf", b"", run_id="r"))
    for _ in range(10_000):
        if len(started) == 3:
            break
        await asyncio.sleep(0.001)
    assert sorted(started) == ["s0", "s1", "s2"]  # all three bodies run at once
    gate.set()
    assert (await driving).status == "completed"


# --- start --------------------------------------------------------------------------------------


async def test_start_is_idempotent_for_the_same_definition(
    handler: CommandHandler, clock: Clock, store: EventStore
) -> None:
    runtime = Scripted(lambda inv: Complete(output=b"ok"))
    engine = Engine(handler, runtime)
    first = await engine.start("wf", b"in", run_id="r", attributes={"a": "1"})
    again = await engine.start("wf", b"in", run_id="r", attributes={"a": "1"})
    assert first.status == "completed" and again == first
    assert runtime.decisions == 1  # an ended run is returned, not asked again
    assert await store.head("r") == 3


@pytest.mark.parametrize(
    "change",
    [
        {"workflow_name": "other"},
        {"input": b"other"},
        {"workflow_version": "2"},
        {"attributes": {"a": "2"}},
        {"deadline": T0 + HOUR},
    ],
    ids=["name", "input", "version", "attributes", "deadline"],
)
async def test_start_with_another_definition_is_a_conflict(
    handler: CommandHandler, store: EventStore, change: dict[str, object]
) -> None:
    engine = Engine(handler, Scripted(lambda inv: WaitUntil(wait_id="w", resume_at=T0 + HOUR)))
    await engine.start("wf", b"in", run_id="r", attributes={"a": "1"})
    definition: dict[str, object] = {
        "workflow_name": "wf",
        "input": b"in",
        "attributes": {"a": "1"},
    }
    definition.update(change)
    with pytest.raises(RunDefinitionConflict, match="another definition") as raised:
        await engine.start(run_id="r", **definition)  # type: ignore[arg-type]
    assert raised.value.run_id == "r" and raised.value.code == "run_definition_conflict"
    assert await store.head("r") == 3  # created, started, wait created: nothing more


async def test_start_refuses_a_malformed_definition_before_writing(
    handler: CommandHandler, store: EventStore
) -> None:
    engine = Engine(handler, Scripted(lambda inv: Complete(output=b"")))
    too_long = "r" * 300
    with pytest.raises(InvalidCommand):
        await engine.start("wf", b"in", run_id=too_long)
    assert await store.head(too_long) == 0


async def test_start_without_a_run_id_makes_one(handler: CommandHandler) -> None:
    engine = Engine(handler, Scripted(lambda inv: Complete(output=b"")))
    run = await engine.start("wf", b"in")
    assert run.run_id.startswith("run_") and run.status == "completed"


async def test_drive_starts_a_pending_run(handler: CommandHandler) -> None:
    await handler.execute("r", CreateRun(workflow_name="wf", input=b""))
    engine = Engine(handler, Scripted(lambda inv: Complete(output=b"x")))
    assert (await engine.drive("r")).status == "completed"
    history = await handler.history("r")
    assert types(history) == ["run_created", "run_started", "run_completed"]


async def test_drive_of_an_unknown_run_is_run_not_found(handler: CommandHandler) -> None:
    engine = Engine(handler, Scripted(lambda inv: Complete(output=b"")))
    with pytest.raises(RunNotFound):
        await engine.drive("nope")


# --- waits, hooks, resume -----------------------------------------------------------------------


def waits_then_completes(invocation: WorkflowInvocation) -> RuntimeDecision:
    wait = invocation.snapshot.waits.get("w")
    if wait is None or wait.status == "waiting":
        return WaitUntil(wait_id="w", resume_at=T0 + HOUR)
    return Complete(output=b"woke")


async def test_resume_wait_completes_a_wait_before_it_is_due(handler: CommandHandler) -> None:
    engine = Engine(handler, Scripted(waits_then_completes))
    assert (await engine.start("wf", b"", run_id="r")).status == "running"
    run = await engine.resume_wait("r", "w")  # the host decides when: not due yet
    assert run.status == "completed" and run.output == b"woke"
    assert (await engine.resume_wait("r", "w")) == run  # already completed: a no-op
    with pytest.raises(WaitNotFound):
        await engine.resume_wait("r", "other")


async def test_a_wait_already_due_completes_at_once(handler: CommandHandler, clock: Clock) -> None:
    clock.now = T0 + 2 * HOUR
    engine = Engine(handler, Scripted(waits_then_completes))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "completed" and run.waits["w"].status == "completed"


async def test_resume_due_resumes_waits_retries_and_deadlines_in_one_query(
    store: EventStore, clock: Clock
) -> None:
    class Counting(DelegatingStore):
        queries = 0

        async def due_wakeups(
            self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
        ) -> list[Wakeup]:
            self.queries += 1
            return await super().due_wakeups(now, limit=limit, workflow_names=workflow_names)

    counting = Counting(store)
    handler = CommandHandler(counting, clock=clock)

    async def fails_once(invocation: StepInvocation) -> bytes:
        if invocation.attempt == 1:
            raise StepFailure(b"later")
        return b"ok"

    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        run = invocation.snapshot
        if run.workflow_name == "sleeper":
            return waits_then_completes(invocation)
        if run.workflow_name == "retrier":
            step = run.steps.get("s")
            if step is None or step.status != "completed":
                return ScheduleStep(step_id="s", step_name="fails_once", input=b"", retry=RETRY)
            return Complete(output=b"retried")
        return AwaitHook(hook_id="h", token="never-delivered")

    engine = Engine(handler, Scripted(workflow, {"fails_once": fails_once}))
    await engine.start("sleeper", b"", run_id="a")
    await engine.start("retrier", b"", run_id="b")
    await engine.start("late", b"", run_id="c", deadline=T0 + 30 * MINUTE)
    assert [r.run_id for r in await engine.resume_due()] == []  # nothing due yet

    clock.now = T0 + 2 * HOUR
    counting.queries = 0
    resumed = await engine.resume_due()
    assert counting.queries == 1
    assert {r.run_id: [w.kind for w in r.wakeups] for r in resumed} == {
        "c": ["deadline"],
        "b": ["retry"],
        "a": ["wait"],
    }
    statuses = {r.run_id: r.snapshot.status for r in resumed if r.snapshot is not None}
    assert statuses == {"a": "completed", "b": "completed", "c": "timed_out"}
    assert (await handler.snapshot("c")).deadline == T0 + 30 * MINUTE
    assert await engine.next_wakeup() is None


async def test_resume_due_at_a_later_time_settles_waits_and_deadlines_it_finds_due(
    handler: CommandHandler, clock: Clock
) -> None:
    runtime = Scripted(lambda inv: WaitUntil(wait_id="w", resume_at=T0 + HOUR))
    engine = Engine(handler, runtime)
    await engine.start("wf", b"", run_id="sleeper")
    await engine.start("wf", b"", run_id="late", deadline=T0 + 2 * HOUR)
    runtime.workflow = waits_then_completes
    resumed = await engine.resume_due(T0 + 3 * HOUR)  # the host's "now", ahead of the clock
    assert {r.run_id: r.snapshot.status for r in resumed if r.snapshot} == {
        "sleeper": "completed",
        "late": "timed_out",
    }
    assert clock.now == T0


async def test_resume_due_keeps_going_when_one_run_fails(
    handler: CommandHandler, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        wait = invocation.snapshot.waits.get("w")
        if wait is not None and wait.status == "completed" and invocation.run_id == "bad":
            raise RuntimeError("workflow bug")
        return waits_then_completes(invocation)

    engine = Engine(handler, Scripted(workflow))
    for run_id in ("bad", "good"):
        await engine.start("wf", b"", run_id=run_id)
    clock.now = T0 + HOUR
    with caplog.at_level(logging.WARNING, logger="runfold.engine"):
        resumed = {r.run_id: r for r in await engine.resume_due()}
    assert isinstance(resumed["bad"].error, RuntimeError) and resumed["bad"].snapshot is None
    good = resumed["good"].snapshot
    assert resumed["good"].error is None and good is not None and good.status == "completed"
    assert "workflow bug" in caplog.text


async def test_deliver_resumes_the_run_holding_the_token(
    handler: CommandHandler, store: EventStore
) -> None:
    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        hook = invocation.snapshot.hooks.get("h")
        if hook is None or not hook.deliveries:
            return AwaitHook(hook_id="h", token="secret", metadata=b"m")
        return Complete(output=hook.deliveries[0].payload)

    engine = Engine(handler, Scripted(workflow))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "running" and run.hooks["h"].metadata == b"m"
    with pytest.raises(HookNotFound):
        await engine.deliver("wrong", b"x")
    run = await engine.deliver("secret", b"payload", delivery_id="d")
    assert run.status == "completed" and run.output == b"payload"
    assert types(await store.read("r")).count("hook_received") == 1


async def test_a_hook_token_held_by_another_run_is_reported_to_the_workflow(
    handler: CommandHandler,
) -> None:
    def stubborn(invocation: WorkflowInvocation) -> RuntimeDecision:
        return AwaitHook(hook_id="h", token="shared")

    def careful(invocation: WorkflowInvocation) -> RuntimeDecision:
        holder = invocation.hook_conflict("h")
        if holder is not None:
            return Fail(error=f"token held by {holder}".encode(), error_code="hook_conflict")
        return AwaitHook(hook_id="h", token="shared")

    await Engine(handler, Scripted(stubborn)).start("wf", b"", run_id="holder")
    stuck = await Engine(handler, Scripted(stubborn)).start("wf", b"", run_id="second")
    assert stuck.status == "failed" and stuck.error_code == "InvalidDecision"
    assert b"'holder' held its token" in (stuck.error or b"")
    history = await handler.history("second")
    assert isinstance(history[-2].event, HookConflict)
    run = await Engine(handler, Scripted(careful)).start("wf", b"", run_id="third")
    assert run.status == "failed" and run.error == b"token held by holder"


# --- cancellation and time-outs -----------------------------------------------------------------


async def test_request_cancel_lets_the_workflow_clean_up_then_cancel(
    handler: CommandHandler, clock: Clock, store: EventStore
) -> None:
    runtime = order_runtime()
    engine = Engine(handler, runtime)
    await engine.start("order", b"in", run_id="r")  # waits for the charge's retry
    run = await engine.request_cancel("r", reason="customer changed their mind")
    assert run.status == "cancelled"
    assert run.steps["charge"].status == "cancelled" and run.steps["refund"].status == "completed"
    assert run.cancellation is not None and run.cancellation.reason == "customer changed their mind"
    history = types(await store.read("r"))
    assert history[history.index("cancel_requested") :] == [
        "cancel_requested",
        "step_created",
        "step_started",
        "step_completed",
        "run_cancelled",
    ]
    assert await engine.next_wakeup() is None


async def test_a_workflow_that_completes_while_cancelling_is_refused(
    handler: CommandHandler,
) -> None:
    engine = Engine(handler, Scripted(waits_then_completes))
    await engine.start("wf", b"", run_id="r")
    engine.runtime = Scripted(lambda inv: Complete(output=b"ignored the request"))
    with pytest.raises(TerminalState, match="cancelling run ends as cancelled"):
        await engine.request_cancel("r")
    assert (await handler.snapshot("r")).status == "cancelling"
    assert (await engine.cancel("r", reason="forced")).status == "cancelled"
    assert (await engine.cancel("r", reason="forced")).status == "cancelled"  # idempotent


async def test_cancel_and_time_out_end_a_run_without_asking_the_workflow(
    handler: CommandHandler, clock: Clock
) -> None:
    runtime = Scripted(waits_then_completes)
    engine = Engine(handler, runtime)
    await engine.start("wf", b"", run_id="a")
    await engine.start("wf", b"", run_id="b", deadline=T0 + 2 * HOUR)
    asked = runtime.decisions
    clock.advance(MINUTE)
    cancelled = await engine.cancel("a")
    timed_out = await engine.time_out("b", reason="operator")
    assert cancelled.status == "cancelled" and timed_out.status == "timed_out"
    history = await handler.history("b")
    assert history[-1].event == RunTimedOut(deadline=T0 + 2 * HOUR, reason="operator")
    assert runtime.decisions == asked
    with pytest.raises(TerminalState):
        await engine.time_out("a")


async def test_a_run_past_its_deadline_times_out_when_driven(
    handler: CommandHandler, clock: Clock
) -> None:
    engine = Engine(handler, Scripted(waits_then_completes))
    await engine.start("wf", b"", run_id="r", deadline=T0 + MINUTE)
    clock.now = T0 + MINUTE
    run = await engine.drive("r")
    assert run.status == "timed_out" and run.completed_at == T0 + MINUTE


async def test_a_workflow_may_time_its_run_out(handler: CommandHandler) -> None:
    engine = Engine(handler, Scripted(lambda inv: TimeOut(reason="gave up")))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "timed_out"
    history = await handler.history("r")
    assert history[-1].event == RunTimedOut(deadline=T0, reason="gave up")


# --- looking around -----------------------------------------------------------------------------


async def test_open_suspensions_summary_and_next_wakeup(
    handler: CommandHandler, clock: Clock
) -> None:
    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        name = invocation.snapshot.workflow_name
        if name == "sleeper":
            return waits_then_completes(invocation)
        if name == "listener":
            return AwaitHook(hook_id="h", token=f"t-{invocation.run_id}")
        if name == "retrier":
            return ScheduleStep(step_id="s", step_name="flaky", input=b"", retry=RETRY)
        return Complete(output=b"")

    engine = Engine(handler, Scripted(workflow, {"flaky": flaky}))
    await engine.start("sleeper", b"", run_id="a")
    await engine.start("listener", b"", run_id="b")
    await engine.start("retrier", b"", run_id="c")
    await engine.start("quick", b"", run_id="d")
    retry_at = T0 + retry_delay(RETRY, run_id="c", step_id="s", attempt=1)

    assert await engine.open_suspensions() == (
        Suspension(run_id="a", kind="wait", subject_id="w", due_at=T0 + HOUR, due=False),
        Suspension(run_id="b", kind="hook", subject_id="h", due_at=None, due=False),
        Suspension(run_id="c", kind="retry", subject_id="s", due_at=retry_at, due=False),
    )
    assert await engine.next_wakeup() == Wakeup(
        run_id="c", kind="retry", subject_id="s", due_at=retry_at
    )
    summary = await engine.summary(now=T0 + HOUR)
    assert summary.runs == 4 and summary.by_status == {"completed": 1, "running": 3}
    assert (summary.open_waits, summary.active_hooks, summary.delayed_retries) == (1, 1, 1)
    assert summary.due == 2
    assert [s.due for s in await engine.open_suspensions(T0 + HOUR)] == [True, False, True]


# --- steps: retries, backoff, at-least-once -----------------------------------------------------


def one_step(retry: RetryPolicy | None) -> Workflow:
    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        step = invocation.snapshot.steps.get("s")
        if step is not None and step.status == "failed":
            return Fail(error=step.error or b"", error_code="s_failed")
        if step is not None and step.status == "completed":
            return Complete(output=step.output or b"")
        return ScheduleStep(step_id="s", step_name="body", input=b"in", retry=retry)

    return workflow


async def test_each_retry_waits_its_backoff_from_the_failure_time(
    handler: CommandHandler, clock: Clock, store: EventStore
) -> None:
    failed_at: dict[int, datetime] = {}

    async def slow_failure(invocation: StepInvocation) -> bytes:
        clock.advance(timedelta(seconds=7))  # the attempt took a while before it failed
        failed_at[invocation.attempt] = clock.now
        raise StepFailure(b"boom", code="timeout")

    runtime = Scripted(one_step(RETRY), {"body": slow_failure})
    engine = Engine(handler, runtime)
    run = await engine.start("wf", b"", run_id="r")
    for attempt in range(1, RETRY.max_attempts):
        due = failed_at[attempt] + retry_delay(RETRY, run_id="r", step_id="s", attempt=attempt)
        assert run.steps["s"].retry_after == due
        clock.now = due - timedelta(microseconds=1)
        assert await engine.drive("r") == run  # not due: nothing runs
        assert len(runtime.steps) == attempt
        clock.now = due
        await engine.resume_due()
        run = await handler.snapshot("r")
    assert run.status == "failed" and run.steps["s"].attempt == RETRY.max_attempts
    last = [e.event for e in await store.read("r") if isinstance(e.event, StepFailed)]
    assert last == [StepFailed(step_id="s", error=b"boom", retryable=True)]
    retries = [e.event for e in await store.read("r") if isinstance(e.event, StepRetrying)]
    delays = [r.retry_after - failed_at[n] for n, r in enumerate(retries, start=1) if r.retry_after]
    assert delays == sorted(delays) and delays[-1] <= RETRY.max_interval  # type: ignore[operator]


async def test_a_body_waiting_past_its_timeout_fails_the_attempt_as_timed_out(
    handler: CommandHandler,
) -> None:
    async def stuck(invocation: StepInvocation) -> bytes:
        await asyncio.sleep(60)
        return b"never"

    once = RetryPolicy(max_attempts=1)
    runtime = Scripted(one_step(once), {"body": stuck})
    engine = Engine(handler, runtime, step_timeout=timedelta(milliseconds=20))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "failed" and run.error_code == "s_failed"
    assert (run.steps["s"].error or b"").startswith(b"StepTimedOut: step 'body' (id 's')")


async def test_a_step_timeout_counts_from_the_body_first_suspension(
    handler: CommandHandler,
) -> None:
    async def busy_then_quick(invocation: StepInvocation) -> bytes:
        time.sleep(0.05)  # past the limit, but before the body waits on anything
        await asyncio.sleep(0.001)
        return b"done"

    runtime = Scripted(one_step(RetryPolicy(max_attempts=1)), {"body": busy_then_quick})
    engine = Engine(handler, runtime, step_timeout=timedelta(milliseconds=20))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "completed" and run.output == b"done"
    assert run.steps["s"].attempt == 1


async def test_a_cancelled_drive_is_no_timeout_of_its_waiting_body(
    handler: CommandHandler,
) -> None:
    started = asyncio.Event()

    async def waits(invocation: StepInvocation) -> bytes:
        started.set()
        await asyncio.sleep(60)
        return b"never"

    runtime = Scripted(one_step(RetryPolicy(max_attempts=1)), {"body": waits})
    engine = Engine(handler, runtime, step_timeout=timedelta(seconds=30))
    drive = asyncio.create_task(engine.start("wf", b"", run_id="r"))
    await started.wait()
    drive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drive
    run = await handler.snapshot("r")
    assert run.steps["s"].status == "running" and run.steps["s"].error is None


async def test_without_jitter_a_retry_waits_exactly_the_backoff(
    handler: CommandHandler, clock: Clock
) -> None:
    engine = Engine(handler, Scripted(one_step(RETRY), {"body": flaky}), jitter=0)
    run = await engine.start("wf", b"", run_id="r")
    assert run.steps["s"].retry_after == T0 + RETRY.initial_interval


@pytest.mark.parametrize(
    ("failure", "policy"),
    [
        (StepFailure(b"declined", code="fatal"), RETRY),
        (StepFailure(b"declined", retryable=False), RETRY),
        (KeyError("gone"), RetryPolicy(non_retryable_error_codes=("KeyError",))),
    ],
    ids=["listed-code", "not-retryable", "exception-class-name"],
)
async def test_a_non_retryable_failure_fails_the_step_at_once(
    handler: CommandHandler, store: EventStore, failure: Exception, policy: RetryPolicy
) -> None:
    async def refuses(invocation: StepInvocation) -> bytes:
        raise failure

    engine = Engine(handler, Scripted(one_step(policy), {"body": refuses}))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "failed" and run.steps["s"].attempt == 1
    [failed] = [e.event for e in await store.read("r") if isinstance(e.event, StepFailed)]
    assert failed.retryable is False


async def test_any_exception_is_a_retryable_failure_and_no_policy_means_the_default(
    handler: CommandHandler, clock: Clock
) -> None:
    async def broken(invocation: StepInvocation) -> bytes:
        raise ValueError(f"attempt {invocation.attempt}")

    engine = Engine(handler, Scripted(one_step(None), {"body": broken}))
    run = await engine.start("wf", b"", run_id="r")
    assert run.steps["s"].error == b"ValueError: attempt 1"
    while not run.is_terminal:
        clock.now = min(w.due_at for w in run.wakeups())
        await engine.resume_due()
        run = await handler.snapshot("r")
    assert run.status == "failed" and run.steps["s"].attempt == DEFAULT_RETRY.max_attempts


async def test_a_step_interrupted_by_a_crash_runs_again_as_a_new_attempt(
    store: EventStore, clock: Clock
) -> None:
    keys: list[str] = []

    async def charge(invocation: StepInvocation) -> bytes:
        keys.append(invocation.idempotency_key)
        return b"charged"

    # Append 1: the run created, started and its step started; 2: the outcome with the run's end.
    crashing = CrashingStore(store, crash_at=2)
    engine = Engine(
        CommandHandler(crashing, clock=clock, store_retry=None),
        Scripted(one_step(RETRY), {"body": charge}),
    )
    with pytest.raises(StoreUnavailable):
        await engine.start("wf", b"", run_id="r")
    assert (await CommandHandler(store).snapshot("r")).steps["s"].status == "running"

    restarted = Engine(
        CommandHandler(store, clock=clock), Scripted(one_step(RETRY), {"body": charge})
    )
    run = await restarted.drive("r")
    assert run.status == "completed" and run.steps["s"].attempt == 2
    assert keys == ["r/s", "r/s"]  # at least once, every attempt with the step's one key


def test_retry_delay_is_exponential_capped_and_jittered_replay_stably() -> None:
    policy = RetryPolicy(
        initial_interval=timedelta(seconds=10),
        backoff_coefficient=2.0,
        max_interval=timedelta(seconds=60),
    )
    for attempt, base in [(1, 10), (2, 20), (3, 40), (4, 60), (9, 60)]:
        delay = retry_delay(policy, run_id="r", step_id="s", attempt=attempt)
        fraction = jitter_fraction("r", "s", attempt)
        assert delay == timedelta(seconds=base * (1 - DEFAULT_JITTER * fraction))
        assert timedelta(seconds=base * (1 - DEFAULT_JITTER)) <= delay <= timedelta(seconds=base)
        assert delay == retry_delay(policy, run_id="r", step_id="s", attempt=attempt)
    assert retry_delay(policy, run_id="r", step_id="s", attempt=1, jitter=0) == timedelta(
        seconds=10
    )
    # Pinned: changing how the jitter is derived would move every scheduled retry on replay.
    assert jitter_fraction("run-1", "charge", 1) == 0.4692520087450593
    fractions = [jitter_fraction("r", f"step-{i}", 1) for i in range(200)]
    assert len(set(fractions)) == 200 and min(fractions) < 0.1 and max(fractions) > 0.9
    assert jitter_fraction("r", "s", 1) != jitter_fraction("r", "s", 2)
    endless = retry_delay(RetryPolicy(), run_id="r", step_id="s", attempt=100_000)
    assert LONGEST_RETRY_INTERVAL * (1 - DEFAULT_JITTER) <= endless <= LONGEST_RETRY_INTERVAL
    with pytest.raises(ValueError, match="attempt"):
        retry_delay(policy, run_id="r", step_id="s", attempt=0)
    with pytest.raises(ValueError, match="jitter"):
        retry_delay(policy, run_id="r", step_id="s", attempt=1, jitter=1.5)


# --- what a workflow may not do -----------------------------------------------------------------


FAR = T0 + 24 * HOUR


def idle() -> RuntimeDecision:
    return WaitUntil(wait_id="idle", resume_at=FAR)


REDEFINITIONS: dict[str, tuple[Callable[[Snapshot], bool], RuntimeDecision, RuntimeDecision]] = {
    "step": (
        lambda run: "s" in run.steps,
        ScheduleStep(step_id="s", step_name="n", input=b"1"),
        ScheduleStep(step_id="s", step_name="n", input=b"2"),
    ),
    "wait": (
        lambda run: "w" in run.waits,
        WaitUntil(wait_id="w", resume_at=FAR),
        WaitUntil(wait_id="w", resume_at=FAR + HOUR),
    ),
    "progress": (
        lambda run: "p" in run.progress,
        ReportProgress(progress_id="p", completed=1),
        ReportProgress(progress_id="p", completed=2),
    ),
    "child": (
        lambda run: "c" in run.children,
        LinkChildOperation(reference_id="c", kind="run", operation_id="1"),
        LinkChildOperation(reference_id="c", kind="run", operation_id="2"),
    ),
    "hook": (
        lambda run: "h" in run.hooks,
        AwaitHook(hook_id="h", token="t1"),
        AwaitHook(hook_id="h", token="t2"),
    ),
}


@pytest.mark.parametrize("kind", sorted(REDEFINITIONS))
async def test_reissuing_an_id_with_another_definition_is_non_deterministic(
    handler: CommandHandler, kind: str
) -> None:
    exists, first, second = REDEFINITIONS[kind]
    version = [1]

    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        if version[0] == 2:
            return second
        return idle() if exists(invocation.snapshot) else first

    engine = Engine(handler, Scripted(workflow))
    await engine.start("wf", b"", run_id="r")
    version[0] = 2
    with pytest.raises(NonDeterministic):
        await engine.drive("r")


INVALID: dict[str, tuple[Workflow, str]] = {
    "no-progress": (
        lambda inv: ReportProgress(progress_id="p", completed=1),
        "changed nothing",
    ),
    "finished-steps": (
        lambda inv: ScheduleStep(step_id="s", step_name="n", input=b""),
        "only finished steps",
    ),
    "repeated-step": (
        lambda inv: ScheduleSteps(steps=[ScheduleStep(step_id="s", step_name="n", input=b"")] * 2),
        "scheduled twice",
    ),
    "empty-batch": (lambda inv: ScheduleSteps(steps=[]), "at least one step"),
    "finished-wait": (
        lambda inv: WaitUntil(wait_id="w", resume_at=T0 - MINUTE),
        "already completed",
    ),
    "uninvited-cancel": (lambda inv: Cancel(), "no cancellation was requested"),
    "not-a-decision": (lambda inv: cast(RuntimeDecision, "complete"), "not a RuntimeDecision"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
async def test_a_decision_the_engine_cannot_apply_fails_the_run(
    handler: CommandHandler, case: str
) -> None:
    workflow, message = INVALID[case]
    engine = Engine(handler, Scripted(workflow))
    run = await engine.start("wf", b"", run_id="r")  # asking again would give the same answer
    assert run.status == "failed" and run.error_code == "InvalidDecision"
    assert run.error is not None and run.error.startswith(b"InvalidDecision: ")
    assert message.encode() in run.error


async def test_a_drive_that_never_settles_stops_at_the_replay_limit(
    handler: CommandHandler, store: EventStore
) -> None:
    def chatty(invocation: WorkflowInvocation) -> RuntimeDecision:
        return UpdateAttributes(changes={"n": str(invocation.snapshot.last_sequence)})

    engine = Engine(handler, Scripted(chatty), max_replay_iterations=5)
    with pytest.raises(ReplayLimitExceeded, match="drive it again"):
        await engine.start("wf", b"", run_id="r")
    assert await store.head("r") == 2 + 5
    with pytest.raises(ReplayLimitExceeded):
        await engine.drive("r")
    assert await store.head("r") == 2 + 10  # driving again continues where it stopped


@pytest.mark.parametrize(
    "arguments", [{"max_replay_iterations": 0}, {"jitter": -0.1}, {"jitter": 1.1}]
)
def test_the_engine_refuses_nonsense_settings(
    handler: CommandHandler, arguments: dict[str, float]
) -> None:
    with pytest.raises(ValueError):
        Engine(handler, Scripted(idle_workflow), **arguments)  # type: ignore[arg-type]


def idle_workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
    return idle()


# --- observers ----------------------------------------------------------------------------------


async def test_observers_see_every_appended_envelope_and_cannot_break_a_run(
    handler: CommandHandler, clock: Clock, store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    engine = Engine(handler, order_runtime(), [Boom(), recorder])
    with caplog.at_level(logging.ERROR, logger="runfold.engine"):
        run = await finish(engine, clock, "r")
    assert run.status == "completed"
    assert recorder.seen == await store.read("r")
    assert caplog.text.count("observer") >= run.last_sequence
    assert "observer broke on 1" in caplog.text


class Selective(Recorder):
    """An observer of step completions and run ends only (`observed_events`)."""

    observed_events = frozenset({StepCompleted, RunCompleted})


async def test_an_observer_naming_its_events_sees_those_only(
    handler: CommandHandler, clock: Clock, store: EventStore
) -> None:
    selective, everything = Selective(), Recorder()
    engine = Engine(handler, order_runtime(), [selective, everything])
    run = await finish(engine, clock, "r")
    assert run.status == "completed"
    assert everything.seen == await store.read("r")
    wanted = [e for e in everything.seen if type(e.event) in Selective.observed_events]
    assert selective.seen == wanted
    assert len(wanted) < len(everything.seen) and any(type(e.event) is RunCompleted for e in wanted)


# --- concurrency --------------------------------------------------------------------------------


def fan_out(invocation: WorkflowInvocation) -> RuntimeDecision:
    """Four parallel steps (two fail once and retry at once), progress, completion."""
    run = invocation.snapshot
    if "tag" not in run.attributes:
        return UpdateAttributes(changes={"tag": "x"}, write_id="tag")
    retry = RetryPolicy(max_attempts=20, initial_interval=timedelta(0))
    batch = [
        ScheduleStep(
            step_id=f"s{i}", step_name="flaky" if i % 2 else "echo", input=b"%d" % i, retry=retry
        )
        for i in range(4)
    ]
    steps = [run.steps.get(call.step_id) for call in batch]
    if not all(s is not None and s.status == "completed" for s in steps):
        return ScheduleSteps(steps=batch)
    if "done" not in run.progress:
        return ReportProgress(progress_id="done", completed=4, total=4)
    return Complete(output=b",".join(s.output or b"" for s in steps if s is not None))


@pytest.mark.parametrize("seed", range(4))
async def test_two_engines_racing_on_one_run_record_each_outcome_once(
    store: EventStore, clock: Clock, seed: int
) -> None:
    rng = random.Random(seed)

    class Jittery(DelegatingStore):
        async def pause(self) -> None:
            for _ in range(rng.randrange(4)):
                await asyncio.sleep(0)

    async def jittery_flaky(invocation: StepInvocation) -> bytes:
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        return await flaky(invocation)

    engines = [
        Engine(
            CommandHandler(Jittery(store), clock=clock),
            Scripted(fan_out, {"flaky": jittery_flaky}),
        )
        for _ in range(2)
    ]
    ends = await asyncio.gather(*(e.start("fan", b"", run_id="race") for e in engines))
    history = await store.read("race")
    assert [end.status for end in ends] == ["completed", "completed"]
    assert_one_outcome_each(history)
    assert ends[0].output == b"out:0,paid,out:2,paid"
    assert types(history).count("attributes_set") == types(history).count("progress_recorded") == 1


async def test_one_engine_driving_a_run_twice_at_once_runs_each_step_once(
    handler: CommandHandler,
) -> None:
    gate = asyncio.Event()

    async def held(invocation: StepInvocation) -> bytes:
        if invocation.attempt == 1:  # a second attempt would be a double run: let it show
            await gate.wait()
        return b"ok"

    runtime = Scripted(fan_out, {"flaky": held, "echo": held})
    engine = Engine(handler, runtime)
    first = asyncio.create_task(engine.start("fan", b"", run_id="r"))
    for _ in range(10_000):
        if len(runtime.steps) == 4:
            break
        await asyncio.sleep(0.001)
    second = await engine.drive("r")  # the steps are in flight here: it leaves them be
    assert second.status == "running" and {s.status for s in second.steps.values()} == {"running"}
    gate.set()
    assert (await first).status == "completed"
    assert len(runtime.steps) == 4


async def test_a_drive_cancelled_mid_step_is_picked_up_by_the_next_drive(
    handler: CommandHandler,
) -> None:
    gate = asyncio.Event()

    async def held(invocation: StepInvocation) -> bytes:
        if invocation.attempt == 1:
            await gate.wait()  # never set: the first attempts are cut short
        return b"ok"

    runtime = Scripted(fan_out, {"flaky": held, "echo": held})
    engine = Engine(handler, runtime)
    first = asyncio.create_task(engine.start("fan", b"", run_id="r"))
    for _ in range(10_000):
        if len(runtime.steps) == 4:
            break
        await asyncio.sleep(0.001)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    run = await engine.drive("r")  # nothing is left claimed: the attempts run again
    assert run.status == "completed"
    assert {s.attempt for s in run.steps.values()} == {2}


@pytest.mark.parametrize("after_write", [False, True], ids=["before-append", "lost-ack"])
async def test_a_crash_between_any_two_appends_recovers_to_the_same_final_state(
    store: EventStore, clock: Clock, after_write: bool
) -> None:
    counting = CrashingStore(store)
    reference = await finish(
        Engine(CommandHandler(counting, clock=clock), order_runtime()), clock, "ref"
    )
    expected = final_state(reference)
    for crash_at in range(1, counting.appends + 1):
        run_id = f"crash-{crash_at}"
        crashing = CrashingStore(store, crash_at, after_write=after_write)
        with pytest.raises(StoreUnavailable, match="injected crash"):
            await finish(
                Engine(CommandHandler(crashing, clock=clock, store_retry=None), order_runtime()),
                clock,
                run_id,
            )
        restarted = Engine(CommandHandler(store, clock=clock), order_runtime())
        recovered = await finish(restarted, clock, run_id)
        assert final_state(recovered) == expected, f"crash at append {crash_at}"
        assert_one_outcome_each(await store.read(run_id))


@pytest.mark.parametrize("after_write", [False, True], ids=["before-append", "lost-ack"])
async def test_a_failed_append_anywhere_is_ridden_through_as_if_it_never_happened(
    store: EventStore, clock: Clock, after_write: bool
) -> None:
    counting = CrashingStore(store)
    reference = await finish(
        Engine(CommandHandler(counting, clock=clock), order_runtime()), clock, "ref"
    )
    expected = final_state(reference)
    fast = StoreRetry(first_pause=0.001, max_pause=0.002)
    for crash_at in range(1, counting.appends + 1):
        run_id = f"fault-{crash_at}"
        crashing = CrashingStore(store, crash_at, after_write=after_write)
        engine = Engine(CommandHandler(crashing, clock=clock, store_retry=fast), order_runtime())
        finished = await finish(engine, clock, run_id)  # no error reaches the engine's caller
        assert final_state(finished) == expected, f"fault at append {crash_at}"
        attempts = {k: s.attempt for k, s in finished.steps.items()}
        assert attempts == {k: s.attempt for k, s in reference.steps.items()}, crash_at
        assert_one_outcome_each(await store.read(run_id))
