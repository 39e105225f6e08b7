"""runfold.flow: durable functions on the engine, on every store."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from runfold import EventStore, MemoryStore
from runfold.engine import RunDefinitionConflict
from runfold.flow import (
    DuplicateWorkflow,
    Flow,
    FlowNonDeterminism,
    JsonCodec,
    NotInWorkflow,
    PayloadError,
    StepError,
    TokenInUse,
    UnknownWorkflow,
    UnsupportedAwait,
    current_step,
    registered_workflows,
    sleep,
    step,
    wait_for_event,
    workflow,
)
from runfold.kernel import RetryPolicy, StepStarted
from runfold.testing import DelegatingStore, SimulatedCrash
from tests.conftest import Clock
from tests.support.flow_workflows import chain, order

ORDER = {"id": "A1", "items": ["book", "pen"], "amount": 42}


async def finish_order(flow: Flow, clock: Clock, run_id: str, answer: str = "yes") -> Any:
    clock.advance(timedelta(seconds=5))  # the payment retry is due
    await flow.run_until_idle()
    clock.advance(timedelta(hours=2))  # the sleep is due
    await flow.run_until_idle()
    return await flow.deliver(f"approve-{run_id}", answer)


async def test_order_runs_to_completion(store: EventStore, clock: Clock) -> None:
    flow = Flow(store, [order], clock=clock)
    started = await flow.start(order, ORDER, run_id="A1")
    assert started.status == "running"
    done = await finish_order(flow, clock, "A1")
    assert done.status == "completed"
    assert done.output == {
        "order": "A1",
        "reservation": "reservation-2",
        "payment": {"charged": 42},
        "parcel": "parcel-A1",
    }
    kinds = [e.event.event_type for e in await store.read("A1")]
    assert kinds.count("step_retrying") == 1 and kinds[-1] == "run_completed"
    assert flow.interpreter.replays == 1  # one coroutine carried the run through


async def test_a_fresh_flow_carries_the_run_on(store: EventStore, clock: Clock) -> None:
    await Flow(store, [order], clock=clock).start(order, ORDER, run_id="A1")
    later = Flow(store, [order], clock=clock)
    done = await finish_order(later, clock, "A1", answer="no")
    assert done.output == {"order": "A1", "status": "rejected"}


async def test_cost_per_step_is_flat(store: EventStore) -> None:
    entered = 0
    real = chain.fn

    async def counting(n: int) -> int:
        nonlocal entered
        entered += 1
        result: int = await real(n)
        return result

    counted = workflow(name="counted-chain")(counting)
    flow = Flow(store, [counted])
    done = await flow.start(counted, 60, run_id="c")
    assert done.output == sum(range(60))
    assert entered == 1  # never re-run from the start while the process lives
    # Replayed in a fresh Flow, the function runs once more and no step body runs again.
    fresh = Flow(store, [counted])
    again = await fresh.start(counted, 60, run_id="c")
    assert again.output == sum(range(60)) and entered == 1  # ended: nothing to replay


class CountingStore(DelegatingStore):
    """Counts appends and every other call."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.calls = 0
        self.appends = 0

    async def pause(self) -> None:
        self.calls += 1

    async def append_if_sequence(self, *args: Any, **kwargs: Any) -> Any:
        self.appends += 1
        return await super().append_if_sequence(*args, **kwargs)


async def test_a_new_run_costs_one_append_per_step_and_no_read(store: EventStore) -> None:
    counting = CountingStore(store)
    flow = Flow(counting, [chain])

    done = await flow.start(chain, 5)

    assert done.output == sum(range(5))
    # The creation with the first step's start, each outcome with the next start, the last
    # outcome with the end; nothing read: the run is new and its coroutine lives on.
    assert counting.calls == counting.appends == 6


async def test_replay_feeds_recorded_results_without_running_steps(store: EventStore) -> None:
    ran: list[int] = []

    def record(i: int) -> int:
        ran.append(i)
        return i * 10

    @workflow(name="gate")
    async def gate(_: None) -> list[int]:
        first = await step(record, 1)
        token = await wait_for_event("go", token="gate-token")
        second = await step(record, 2)
        return [first, token, second]

    await Flow(store, [gate]).start(gate, None, run_id="g")
    assert ran == [1]
    done = await Flow(store, [gate]).deliver("gate-token", 7)
    assert done.output == [10, 7, 20]
    assert ran == [1, 2]


async def test_changed_code_is_reported_with_the_call(store: EventStore) -> None:
    def a() -> str:
        return "a"

    def b() -> str:
        return "b"

    @workflow(name="drift")
    async def before(_: None) -> None:
        await step(a)
        await wait_for_event("e", token="drift-token")

    await Flow(store, [before]).start(before, None, run_id="d")

    @workflow(name="drift")  # type: ignore[no-redef]  # the same function redeployed
    async def before(_: None) -> None:
        await step(b)
        await wait_for_event("e", token="drift-token")

    with pytest.raises(FlowNonDeterminism) as caught:
        await Flow(store, [before]).deliver("drift-token", 1)
    assert (caught.value.call, caught.value.recorded, caught.value.asked) == (
        1,
        "step 'test_changed_code_is_reported_with_the_call.<locals>.a'",
        "step 'test_changed_code_is_reported_with_the_call.<locals>.b'",
    )
    assert "drift-token" not in str(caught.value)


async def test_a_sleep_where_a_step_was_is_reported(store: EventStore) -> None:
    @workflow(name="kinds")
    async def kinds(_: None) -> None:
        await sleep(timedelta(days=1))

    await Flow(store, [kinds]).start(kinds, None, run_id="k")

    @workflow(name="kinds")  # type: ignore[no-redef]  # the same function redeployed
    async def kinds(_: None) -> None:
        await step(str)

    with pytest.raises(FlowNonDeterminism) as caught:
        await Flow(store, [kinds]).engine.drive("k")
    assert (caught.value.recorded, caught.value.asked) == ("a sleep", "step 'str'")


async def test_a_failed_step_raises_into_the_workflow(store: EventStore) -> None:
    def broken() -> None:
        raise ValueError("no stock")

    @workflow(name="catches")
    async def catches(_: None) -> str:
        try:
            await step(broken, retry=RetryPolicy(max_attempts=1))
        except StepError as exc:
            return exc.step_error
        return "unreachable"

    done = await Flow(store, [catches]).start(catches, None)
    assert done.output == "ValueError: no stock"

    @workflow(name="uncaught")
    async def uncaught(_: None) -> None:
        await step(broken, retry=RetryPolicy(max_attempts=1))

    failed = await Flow(store, [uncaught]).start(uncaught, None)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.startswith("StepError: step")


async def test_a_token_held_elsewhere_raises_token_in_use(store: EventStore) -> None:
    @workflow(name="holder")
    async def holder(_: None) -> str:
        try:
            await wait_for_event("e", token="shared-token")
        except TokenInUse as exc:
            return exc.hook_id
        return "delivered"

    flow = Flow(store, [holder])
    assert (await flow.start(holder, None, run_id="h1")).status == "running"
    assert (await flow.start(holder, None, run_id="h2")).output == "e"


async def test_misuse_is_typed(store: EventStore) -> None:
    @workflow(name="bad-await")
    async def bad(_: None) -> None:
        await asyncio.sleep(0)

    run = await Flow(store, [bad]).start(bad, None)  # the run fails: it would never move on
    assert run.status == "failed" and run.snapshot.error_code == UnsupportedAwait.__name__
    assert run.error is not None and run.error.startswith("UnsupportedAwait: workflow code awaited")
    with pytest.raises(NotInWorkflow):
        await step(str)
    with pytest.raises(UnknownWorkflow):
        await Flow(store, [order]).start(chain, 1)
    flow = Flow(store, [chain])
    await flow.start(chain, 1, run_id="same")
    with pytest.raises(RunDefinitionConflict):
        await flow.start(chain, 2, run_id="same")


def test_workflow_names() -> None:
    async def plain(_: None) -> None:
        return None

    assert workflow(plain).name == "test_workflow_names.<locals>.plain"
    assert workflow(name="orders.v1")(plain).name == "orders.v1"

    async def other(_: None) -> None:
        return None

    with pytest.raises(DuplicateWorkflow):
        workflow(name="orders.v1")(other)
    with pytest.raises(ValueError):
        workflow(name="")(other)


def test_json_codec_passes_bytes_through() -> None:
    codec = JsonCodec()
    assert codec.encode(b"\x00\xffraw") == b"\x00\x00\xffraw"
    assert codec.decode(codec.encode(b"\x00\xffraw")) == b"\x00\xffraw"
    assert codec.decode(codec.encode({"b": [1, "x"], "a": None})) == {"a": None, "b": [1, "x"]}
    assert codec.encode({"b": 1, "a": 2}) == b'{"a":2,"b":1}'
    with pytest.raises(PayloadError):
        codec.encode(object())
    with pytest.raises(PayloadError):
        codec.decode(b"not json")


async def test_each_run_runs_the_function_its_code_passed(store: EventStore) -> None:
    # Two workflows name different functions "work"; run at once, neither runs the other's.
    def one() -> str:
        return "one"

    def two() -> str:
        return "two"

    @workflow(name="uses-one")
    async def uses_one(_: None) -> list[str]:
        return [await step(one, name="work") for _ in range(3)]

    @workflow(name="uses-two")
    async def uses_two(_: None) -> list[str]:
        return [await step(two, name="work") for _ in range(3)]

    flow = Flow(store, [uses_one, uses_two])
    both = (uses_one, uses_two)
    runs = await asyncio.gather(
        *(flow.start(w, None, run_id=f"{w.name}-{i}") for i in range(4) for w in both)
    )
    assert {tuple(r.output) for r in runs} == {("one",) * 3, ("two",) * 3}
    assert all(set(r.output) == {r.run_id.split("-")[1]} for r in runs)


def test_a_flow_serves_every_defined_workflow_by_default() -> None:
    served = Flow(MemoryStore()).workflow_names
    assert {"test-order", "test-chain"} <= set(served)
    assert set(served) == {w.name for w in registered_workflows()}


class Yielding(DelegatingStore):
    """Lets other tasks in before every store call, so two Flows' drives interleave."""

    async def pause(self) -> None:
        await asyncio.sleep(0)


async def test_two_flows_racing_on_one_run_agree_with_the_history(store: EventStore) -> None:
    # Each Flow's step bodies answer with the Flow's own name, so whichever outcome the store
    # kept, a coroutine that went on with the other one would return a mismatching output.
    def who(flow_name: str) -> Any:
        async def body(i: int) -> str:
            for _ in range(3):  # let the other Flow's drive in while this body runs
                await asyncio.sleep(0)
            return f"{flow_name}{i}"

        body.__qualname__ = "body"
        return body

    bodies = {"A": who("A"), "B": who("B")}

    def make(flow_name: str) -> Any:
        @workflow(name="racing")
        async def racing(_: None) -> list[str]:
            await wait_for_event("go", token="racing-go")
            return [await step(bodies[flow_name], i) for i in range(6)]

        return racing

    shared = Yielding(store)
    a, b = Flow(shared, [make("A")]), Flow(shared, [make("B")])
    await a.start(a.workflows["racing"], None, run_id="race")
    await b.engine.drive("race")  # B holds a live coroutine too
    await store_deliver(a, "racing-go")
    await asyncio.gather(a.engine.drive("race"), b.engine.drive("race"))
    done = await a.result("race")
    recorded = [done.snapshot.steps[str(i)].output for i in range(2, 8)]
    assert done.status == "completed"
    assert [f'"{x}"'.encode() for x in done.output] == recorded


async def store_deliver(flow: Flow, token: str) -> None:
    """Record the delivery without driving the run (the race drives it)."""
    await flow.handler.deliver(token, flow.codec.encode(True))


async def test_one_undrivable_run_does_not_block_recovery(store: EventStore) -> None:
    def a() -> str:
        return "a"

    @workflow(name="recovering")
    async def recovering(n: int) -> int:
        await step(a)
        await wait_for_event("e", token=f"recovering-{n}")
        return n

    flow = Flow(store, [recovering])
    for n in range(3):
        await flow.start(recovering, n, run_id=f"r{n}")
    for n in range(3):  # delivered, not yet driven: recovery has work to do
        await flow.handler.deliver(f"recovering-{n}", flow.codec.encode(None))

    @workflow(name="recovering")  # type: ignore[no-redef]  # redeployed with a change
    async def recovering(n: int) -> int:
        await step(str if n == 1 else a)  # run r1 recorded step 'a' where it now asks 'str'
        await wait_for_event("e", token=f"recovering-{n}")
        return n

    resumed = await Flow(store, [recovering]).recover()
    by_run = {r.run_id: r for r in resumed}
    assert isinstance(by_run["r1"].error, FlowNonDeterminism)
    assert by_run["r0"].error is None and by_run["r2"].error is None
    assert (await flow.result("r2")).output == 2


async def test_a_retry_changed_between_crash_and_resume_applies_from_the_next_attempt(
    store: EventStore,
) -> None:
    """The process dies in the step's only attempt; the deploy that follows allows three."""
    attempts: list[int] = []

    def charge(amount: int) -> dict[str, int]:
        attempts.append(current_step().attempt)
        if len(attempts) == 1:
            raise SimulatedCrash("the process dies inside the body")
        return {"charged": amount}

    @workflow(name="redeployed")
    async def redeployed(amount: int) -> Any:
        return await step(charge, amount, retry=RetryPolicy(max_attempts=1))

    with pytest.raises(SimulatedCrash):
        await Flow(store, [redeployed]).start(redeployed, 42, run_id="pay")
    assert (await Flow(store, [redeployed]).result("pay")).snapshot.steps["1"].status == "running"

    thrice = RetryPolicy(max_attempts=3, initial_interval=timedelta(seconds=5))

    @workflow(name="redeployed")  # type: ignore[no-redef]  # the deploy changed the retry
    async def redeployed(amount: int) -> Any:
        return await step(charge, amount, retry=thrice)

    flow = Flow(store, [redeployed])
    [resumed] = await flow.recover()
    assert resumed.error is None
    done = await flow.result("pay")
    assert done.status == "completed" and done.output == {"charged": 42}
    assert attempts == [1, 2]
    assert done.snapshot.steps["1"].retry == thrice
    [*_, last_start] = [
        e.event for e in await store.read("pay") if e.event.event_type == "step_started"
    ]
    assert last_start == StepStarted(step_id="1", attempt=2, after_interruption=True, retry=thrice)
