"""How the engine commits: once per step, through the handler only, for the workflows it serves.

Counts are taken with `CountingStore`, a wrapper that passes every call to the real store under
test (memory, SQLite, PostgreSQL) and counts it; crashes with `CrashingStore`, which fails the
N-th append before (or after) it reaches the store.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

import pytest

from runfold import CommandHandler, EventStore, MemoryStore, Snapshot
from runfold.engine import (
    DEFAULT_RETRY,
    Complete,
    Engine,
    RuntimeDecision,
    ScheduleStep,
    StepFailure,
    StepInvocation,
    WaitUntil,
    WorkflowInvocation,
    WorkflowNotServed,
)
from runfold.errors import StoreUnavailable
from runfold.events import RetryPolicy, StepCompleted, StepCreated, StepStarted
from runfold.kernel import Limits
from runfold.testing import SimulatedCrash
from tests.conftest import T0, Clock
from tests.engine.test_engine import HOUR, CrashingStore, Scripted, assert_one_outcome_each
from tests.handler.test_handler_batches import CountingStore

STEPS = 10


def sequential(invocation: WorkflowInvocation) -> RuntimeDecision:
    """`STEPS` steps one after the other, each fed the previous one's output."""
    run = invocation.snapshot
    previous = b"start"
    for n in range(STEPS):
        step = run.steps.get(f"s{n}")
        if step is None or step.status != "completed":
            return ScheduleStep(step_id=f"s{n}", step_name="add", input=previous)
        previous = step.output or b""
    return Complete(output=previous)


async def add(invocation: StepInvocation) -> bytes:
    return invocation.input + b"+"


class Appends(CountingStore):
    """Counts appends apart from the other calls."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.appends = 0

    async def append_if_sequence(self, *args: object, **kwargs: object) -> list:  # type: ignore[type-arg]
        self.appends += 1
        return await super().append_if_sequence(*args, **kwargs)  # type: ignore[arg-type]


async def test_a_sequential_workflow_commits_once_per_step(store: EventStore, clock: Clock) -> None:
    counting = Appends(store)
    engine = Engine(CommandHandler(counting, clock=clock), Scripted(sequential, {"add": add}))

    run = await engine.start("wf", b"", run_id="r")

    assert run.status == "completed" and run.output == b"start" + b"+" * STEPS
    # The run's creation with step 0's start; each outcome with the next start; the last
    # outcome with the run's end.
    assert counting.appends == STEPS + 1
    assert counting.calls == STEPS + 2  # and the one read that found no run
    history = await store.read("r")
    assert_one_outcome_each(history)
    firsts = [e.event for e in history[:4]]
    assert [type(e).__name__ for e in firsts[2:]] == ["StepCreated", "StepStarted"]
    assert {e.recorded_at for e in history[:4]} == {T0}


async def test_a_run_started_under_a_new_id_is_not_read_first(
    store: EventStore, clock: Clock
) -> None:
    counting = Appends(store)
    engine = Engine(CommandHandler(counting, clock=clock), Scripted(sequential, {"add": add}))

    run = await engine.start("wf", b"")

    assert run.status == "completed"
    assert counting.appends == counting.calls == STEPS + 1  # no read: the id is new
    assert_one_outcome_each(await store.read(run.run_id))


async def test_each_step_start_is_durable_before_its_body_runs(
    store: EventStore, clock: Clock
) -> None:
    seen: list[tuple[str, list[str]]] = []

    async def looks(invocation: StepInvocation) -> bytes:
        stored = await store.read(invocation.run_id)
        mine = [
            type(e.event).__name__
            for e in stored
            if isinstance(e.event, StepCreated | StepStarted | StepCompleted)
            and e.event.step_id == invocation.step_id
        ]
        seen.append((invocation.step_id, mine))
        return invocation.input + b"+"

    engine = Engine(CommandHandler(store, clock=clock), Scripted(sequential, {"add": looks}))
    await engine.start("wf", b"", run_id="r")
    assert seen == [(f"s{n}", ["StepCreated", "StepStarted"]) for n in range(STEPS)]


@pytest.mark.parametrize("after_write", [False, True], ids=["before-append", "lost-ack"])
async def test_a_crash_at_any_append_of_the_batched_path_is_recovered(
    store: EventStore, clock: Clock, after_write: bool
) -> None:
    """Every append of a sequential workflow fails in turn; `recover` in a fresh engine finishes
    the run with the same output, each step's outcome recorded once."""
    bodies = {"add": add}
    for crash_at in range(1, STEPS + 2):
        run_id = f"crash-{crash_at}"
        crashing = CrashingStore(store, crash_at, after_write=after_write)
        engine = Engine(
            CommandHandler(crashing, clock=clock, store_retry=None), Scripted(sequential, bodies)
        )
        with pytest.raises(StoreUnavailable, match="injected crash"):
            await engine.start("wf", b"", run_id=run_id)
        restarted = Engine(CommandHandler(store, clock=clock), Scripted(sequential, bodies))
        recovered: Snapshot | None
        if crash_at == 1 and not after_write:
            assert await store.read(run_id) == []  # nothing was written: start it again
            recovered = await restarted.start("wf", b"", run_id=run_id)
        else:
            left = await CommandHandler(store).snapshot(run_id)
            reports = {r.run_id: r for r in await restarted.recover()}
            if left.is_terminal:  # the last append went in, its acknowledgement did not
                assert run_id not in reports
                recovered = left
            else:
                assert reports[run_id].error is None, reports[run_id]
                recovered = reports[run_id].snapshot
        assert recovered is not None and recovered.status == "completed", f"crash {crash_at}"
        assert recovered.output == b"start" + b"+" * STEPS
        assert_one_outcome_each(await store.read(run_id))


async def test_recover_drives_interrupted_runs_and_isolates_failures(
    store: EventStore, clock: Clock
) -> None:
    crashing = CrashingStore(store, 3)
    engine = Engine(
        CommandHandler(crashing, clock=clock, store_retry=None), Scripted(sequential, {"add": add})
    )
    for run_id in ("a", "b"):
        crashing.appends, crashing.crash_at = 0, 3
        with pytest.raises(StoreUnavailable):
            await engine.start("wf", b"", run_id=run_id)

    def waits(invocation: WorkflowInvocation) -> RuntimeDecision:
        first = invocation.snapshot.waits.get("w")
        if first is not None and first.status == "completed":
            return WaitUntil(wait_id="w2", resume_at=T0 + 10 * HOUR)
        return WaitUntil(wait_id="w", resume_at=T0 + HOUR)

    handler = CommandHandler(store, clock=clock)
    await Engine(handler, Scripted(waits)).start("wf", b"", run_id="waiting")

    broken = {"b"}

    def sometimes_broken(invocation: WorkflowInvocation) -> RuntimeDecision:
        if invocation.run_id in broken:
            raise RuntimeError("a bug in the workflow")
        if invocation.run_id == "waiting":
            return waits(invocation)
        return sequential(invocation)

    reports = await Engine(handler, Scripted(sometimes_broken, {"add": add})).recover()

    by_run = {r.run_id: r for r in reports}
    assert set(by_run) == {"a", "b", "waiting"}
    assert by_run["a"].snapshot is not None and by_run["a"].snapshot.status == "completed"
    assert isinstance(by_run["b"].error, RuntimeError)
    assert by_run["waiting"].snapshot is not None and by_run["waiting"].snapshot.is_suspended
    assert (await handler.snapshot("b")).status == "running"


async def test_an_engine_never_writes_to_a_run_it_does_not_serve(
    store: EventStore, clock: Clock
) -> None:
    handler = CommandHandler(store, clock=clock)

    def waits(invocation: WorkflowInvocation) -> RuntimeDecision:
        first = invocation.snapshot.waits.get("w")
        if first is not None and first.status == "completed":
            return WaitUntil(wait_id="w2", resume_at=T0 + 10 * HOUR)
        return WaitUntil(wait_id="w", resume_at=T0 + HOUR)

    billing = Engine(handler, Scripted(waits, workflow_names={"billing"}))
    shipping = Engine(handler, Scripted(waits, workflow_names={"shipping"}))
    await billing.start("billing", b"", run_id="bill")
    await shipping.start("shipping", b"", run_id="ship")
    head = await store.head("bill")
    clock.now = T0 + 2 * HOUR

    resumed = await shipping.resume_due()

    assert [r.run_id for r in resumed] == ["ship"]
    assert await store.head("bill") == head  # its due wait untouched
    wakeup = await shipping.next_wakeup()
    assert wakeup is None or wakeup.run_id != "bill"
    with pytest.raises(WorkflowNotServed) as refused:
        await shipping.drive("bill")
    assert refused.value.run_id == "bill" and refused.value.code == "workflow_not_served"
    with pytest.raises(WorkflowNotServed):
        await shipping.start("billing", b"", run_id="new-bill")
    assert await store.read("new-bill") == []
    assert {r.run_id for r in await shipping.recover()} == {"ship"}
    assert await store.head("bill") == head


@pytest.mark.parametrize("names", [(), "wf"])
def test_a_runtime_must_declare_its_workflows(handler: CommandHandler, names: object) -> None:
    with pytest.raises(ValueError, match="workflow_names"):
        Engine(handler, Scripted(sequential, workflow_names=names))  # type: ignore[arg-type]


async def test_an_output_over_the_payload_limit_fails_the_step_for_good(
    store: EventStore, clock: Clock
) -> None:
    """The step is neither stuck running nor run again on every drive."""
    calls: list[int] = []

    async def huge(invocation: StepInvocation) -> bytes:
        calls.append(invocation.attempt)
        return b"x" * 2_000

    def one(invocation: WorkflowInvocation) -> RuntimeDecision:
        step = invocation.snapshot.steps.get("s")
        if step is not None and step.status == "failed":
            return Complete(output=b"gave up")
        return ScheduleStep(step_id="s", step_name="huge", input=b"")

    bodies: Mapping[str, object] = {"huge": huge}
    handler = CommandHandler(store, clock=clock, limits=Limits(max_payload_bytes=1_000))
    engine = Engine(handler, Scripted(one, bodies))  # type: ignore[arg-type]
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "completed" and run.output == b"gave up"
    assert run.steps["s"].status == "failed" and b"over the 1000 limit" in (
        run.steps["s"].error or b""
    )
    assert (await engine.drive("r")).status == "completed"
    assert calls == [1]


def test_a_long_running_engine_keeps_its_memory_bounded() -> None:
    """Thousands of short workflows through one engine, with retention deleting the completed
    runs as a service would: what the engine, the handler and the store hold stops growing once
    the handler's cache is full (traced allocations, not a timing)."""

    class Short:
        """One step, then the end; it keeps nothing (unlike `Scripted`, which records)."""

        workflow_names = ("wf",)

        async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
            step = invocation.snapshot.steps.get("s")
            if step is None or step.status != "completed":
                return ScheduleStep(step_id="s", step_name="add", input=b"")
            return Complete(output=step.output or b"")

        async def run_step(self, invocation: StepInvocation) -> bytes:
            return b"ok"

    async def run_many(engine: Engine, store: MemoryStore, count: int) -> None:
        for n in range(count):
            await engine.start("wf", b"", run_id=f"run-{n}-{id(engine)}-{count}")
            if n % 100 == 99:
                cutoff = engine.handler.clock() + timedelta(seconds=1)
                await store.delete_runs(terminal_before=cutoff, limit=1_000)

    async def main() -> tuple[int, int]:
        store = MemoryStore()
        engine = Engine(CommandHandler(store, cache_size=64), Short())
        await run_many(engine, store, 500)  # the cache fills up
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await run_many(engine, store, 2_000)
        gc.collect()
        return before, tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        before, after = asyncio.run(main())
    finally:
        tracemalloc.stop()
    assert after - before < 256 * 1024, f"grew by {after - before:,} bytes"


@pytest.mark.parametrize("retry", [RetryPolicy(max_attempts=2), None], ids=["policy", "default"])
async def test_a_step_interrupted_in_its_last_attempt_fails_instead_of_running_again(
    store: EventStore, clock: Clock, retry: RetryPolicy | None
) -> None:
    attempts: list[int] = []
    allowed = (retry or DEFAULT_RETRY).max_attempts

    async def dies(invocation: StepInvocation) -> bytes:
        attempts.append(invocation.attempt)
        raise SimulatedCrash  # the process dies inside the body

    def one(invocation: WorkflowInvocation) -> RuntimeDecision:
        step = invocation.snapshot.steps.get("s")
        if step is not None and step.status == "failed":
            return Complete(output=step.error or b"")
        return ScheduleStep(step_id="s", step_name="dies", input=b"", retry=retry)

    for _ in range(allowed):
        engine = Engine(CommandHandler(store, clock=clock), Scripted(one, {"dies": dies}))
        with pytest.raises(SimulatedCrash):
            await engine.start("wf", b"", run_id="r")
    restarted = Engine(CommandHandler(store, clock=clock), Scripted(one, {"dies": dies}))
    run = await restarted.drive("r")

    assert attempts == list(range(1, allowed + 1))  # no attempt past the policy
    assert run.status == "completed" and run.steps["s"].status == "failed"
    assert run.output == f"attempt {allowed} of {allowed} was interrupted".encode()


async def test_a_retry_policy_changed_by_a_deploy_applies_from_the_next_attempt(
    store: EventStore, clock: Clock
) -> None:
    """Interrupted in its only attempt, the step runs again once a deploy allows three."""
    once, thrice = RetryPolicy(max_attempts=1), RetryPolicy(max_attempts=3)

    async def dies(invocation: StepInvocation) -> bytes:
        raise SimulatedCrash  # the process dies inside the body

    async def works(invocation: StepInvocation) -> bytes:
        return f"attempt {invocation.attempt}".encode()

    def deployed(retry: RetryPolicy) -> Callable[[WorkflowInvocation], RuntimeDecision]:
        def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
            step = invocation.snapshot.steps.get("s")
            if step is not None and step.status in ("completed", "failed"):
                return Complete(output=step.output or step.error or b"")
            return ScheduleStep(step_id="s", step_name="charge", input=b"", retry=retry)

        return workflow

    before = Engine(CommandHandler(store, clock=clock), Scripted(deployed(once), {"charge": dies}))
    with pytest.raises(SimulatedCrash):
        await before.start("wf", b"", run_id="r")
    after = Engine(
        CommandHandler(store, clock=clock), Scripted(deployed(thrice), {"charge": works})
    )
    run = await after.drive("r")

    assert run.status == "completed" and run.output == b"attempt 2"
    assert (run.steps["s"].attempt, run.steps["s"].retry) == (2, thrice)
    started = [e.event for e in await store.read("r") if isinstance(e.event, StepStarted)]
    assert started == [
        StepStarted(step_id="s", attempt=1),
        StepStarted(step_id="s", attempt=2, after_interruption=True, retry=thrice),
    ]


@pytest.mark.parametrize(
    ("first", "then", "recorded"),
    [
        (RetryPolicy(max_attempts=5), None, DEFAULT_RETRY),
        (None, RetryPolicy(max_attempts=5), RetryPolicy(max_attempts=5)),
        (None, DEFAULT_RETRY, None),
        (RetryPolicy(max_attempts=5), RetryPolicy(max_attempts=5), None),
    ],
    ids=["back-to-the-default", "a-policy-at-last", "the-default-spelled-out", "unchanged"],
)
async def test_a_changed_policy_is_recorded_once_and_none_means_the_default(
    store: EventStore,
    clock: Clock,
    first: RetryPolicy | None,
    then: RetryPolicy | None,
    recorded: RetryPolicy | None,
) -> None:
    async def flaky(invocation: StepInvocation) -> bytes:
        if invocation.attempt == 1:
            raise StepFailure(b"flaky")
        return b"ok"

    policy = [first]

    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        step = invocation.snapshot.steps.get("s")
        if step is not None and step.status == "completed":
            return Complete(output=b"")
        return ScheduleStep(step_id="s", step_name="flaky", input=b"", retry=policy[0])

    engine = Engine(CommandHandler(store, clock=clock), Scripted(workflow, {"flaky": flaky}))
    run = await engine.start("wf", b"", run_id="r")
    policy[0] = then  # the deploy, while the step waits for its retry
    clock.now = run.steps["s"].retry_after or clock.now
    await engine.resume_due()

    started = [e.event for e in await store.read("r") if isinstance(e.event, StepStarted)]
    assert started == [
        StepStarted(step_id="s", attempt=1),
        StepStarted(step_id="s", attempt=2, retry=recorded),
    ]
    run = await engine.handler.snapshot("r")
    assert run.status == "completed"
    assert run.steps["s"].retry == (recorded if recorded is not None else first)


async def test_a_policy_lowered_below_the_attempts_made_fails_the_step(
    store: EventStore, clock: Clock
) -> None:
    async def flaky(invocation: StepInvocation) -> bytes:
        raise StepFailure(b"flaky")

    policy = [RetryPolicy(max_attempts=5)]

    def workflow(invocation: WorkflowInvocation) -> RuntimeDecision:
        step = invocation.snapshot.steps.get("s")
        if step is not None and step.status == "failed":
            return Complete(output=step.error or b"")
        return ScheduleStep(step_id="s", step_name="flaky", input=b"", retry=policy[0])

    engine = Engine(CommandHandler(store, clock=clock), Scripted(workflow, {"flaky": flaky}))
    run = await engine.start("wf", b"", run_id="r")
    assert run.steps["s"].status == "pending"  # attempt 1 failed; 4 more allowed
    policy[0] = RetryPolicy(max_attempts=1)
    clock.now = run.steps["s"].retry_after or clock.now
    await engine.resume_due()

    run = await engine.handler.snapshot("r")
    assert run.status == "completed" and run.output == b"attempt 1 of 1 was the last"
    assert run.steps["s"].attempt == 1


async def test_a_retry_due_at_once_runs_in_the_same_drive(store: EventStore) -> None:
    """The failed attempt's outcome is still pending (it goes with the next start) when the
    workflow schedules the step again: the step is this drive's, not "running elsewhere"."""
    ticks = iter(range(10**6))

    def ticking() -> datetime:  # a clock that moves on at every reading, as a real one does
        return T0 + timedelta(microseconds=next(ticks))

    async def once(invocation: StepInvocation) -> bytes:
        if invocation.attempt == 1:
            raise StepFailure(b"busy", code="busy")
        return b"ok"

    def retried(invocation: WorkflowInvocation) -> RuntimeDecision:
        step = invocation.snapshot.steps.get("s")
        if step is not None and step.status == "completed":
            return Complete(output=step.output or b"")
        retry = RetryPolicy(max_attempts=3, initial_interval=timedelta(0))
        return ScheduleStep(step_id="s", step_name="once", input=b"", retry=retry)

    engine = Engine(CommandHandler(store, clock=ticking), Scripted(retried, {"once": once}))
    run = await engine.start("wf", b"", run_id="r")
    assert run.status == "completed" and run.steps["s"].attempt == 2
