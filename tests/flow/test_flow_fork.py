"""`Flow.fork` and `Flow.restart`: a new run reusing a run's outcomes, checked with a ledger of
side effects, on every store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runfold import EventStore
from runfold.flow import (
    Flow,
    ForkRefused,
    StepError,
    Workflow,
    patched,
    recv,
    set_attributes,
    sleep,
    step,
)
from runfold.flow.fork import FORKED_AT, FORKED_FROM
from runfold.kernel import RetryPolicy, RunNotFound
from tests.conftest import Clock

LEDGER: list[tuple[str, int]] = []
BROKEN: set[int] = set()  # the steps that fail now (the bug a deploy fixes)
ONCE = RetryPolicy(max_attempts=1)


def effect(run: str, n: int) -> int:
    LEDGER.append((run, n))
    if n in BROKEN:
        raise RuntimeError(f"step {n} is broken")
    return n * 10


async def _ten_steps(run: str) -> list[int]:
    return [await step(effect, run, n, name=f"s{n}", retry=ONCE) for n in range(1, 11)]


TEN = Workflow(name="test-fork-ten", fn=_ten_steps)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    LEDGER.clear()
    BROKEN.clear()


async def test_a_fork_from_step_7_runs_7_to_10_only(store: EventStore) -> None:
    flow = Flow(store, [TEN])
    done = await flow.start(TEN, "a", run_id="a")
    assert done.output == [n * 10 for n in range(1, 11)]
    assert [("a", n) for n in range(1, 11)] == LEDGER
    LEDGER.clear()
    forked = await flow.fork("a", from_step=7, new_run_id="a-7")
    assert (forked.status, forked.output) == ("completed", done.output)
    assert [("a", n) for n in range(7, 11)] == LEDGER  # steps 1-6 were not run again
    attributes = dict(forked.snapshot.attributes)
    assert (attributes[FORKED_FROM], attributes[FORKED_AT]) == ("a", "7")
    kinds = [e.event.event_type for e in await store.read("a-7")]
    assert kinds.count("step_completed") == 10
    assert forked.snapshot.steps["6"].output == done.snapshot.steps["6"].output


async def test_a_failed_run_is_restarted_where_it_failed_on_fixed_code(store: EventStore) -> None:
    flow = Flow(store, [TEN])
    BROKEN.add(4)
    failed = await flow.start(TEN, "b", run_id="b")
    assert failed.status == "failed"
    BROKEN.clear()  # the fix is deployed
    LEDGER.clear()
    restarted = await flow.restart("b", new_run_id="b-again")
    assert restarted.status == "completed"
    assert [("b", n) for n in range(4, 11)] == LEDGER
    assert dict(restarted.snapshot.attributes)[FORKED_AT] == "4"
    with pytest.raises(ForkRefused, match="only a failed or cancelled run"):
        await flow.restart("b-again")


async def test_a_cancelled_run_is_restarted_after_its_last_completed_call(
    store: EventStore, clock: Clock
) -> None:
    async def waits(run: str) -> int:
        first: int = await step(effect, run, 1, name="s1")
        await sleep(timedelta(hours=1))
        second: int = await step(effect, run, 2, name="s2")
        return first + second

    slow = Workflow(name="test-fork-sleepy", fn=waits)
    flow = Flow(store, [slow], clock=clock)
    await flow.start(slow, "c", run_id="c")
    cancelled = await flow.cancel("c")
    assert cancelled.status == "cancelled"
    LEDGER.clear()
    restarted = await flow.restart("c", new_run_id="c-again")
    assert restarted.status == "running"  # the sleep is made anew: it was cancelled
    assert dict(restarted.snapshot.attributes)[FORKED_AT] == "2"
    clock.advance(timedelta(hours=2))
    await flow.run_until_idle()
    assert (await flow.result("c-again")).output == 30
    assert LEDGER == [("c", 2)]


async def test_a_fork_past_a_call_it_cannot_reuse_is_refused_and_writes_nothing(
    store: EventStore,
) -> None:
    flow = Flow(store, [TEN])
    BROKEN.add(3)
    await flow.start(TEN, "d", run_id="d")
    with pytest.raises(ForkRefused, match=r"call 3 is step 's3' \(failed\)") as caught:
        await flow.fork("d", from_step=5, new_run_id="d-5")
    assert caught.value.code == "fork_refused"
    assert await store.read("d-5") == []
    BROKEN.clear()
    await flow.start(TEN, "d", run_id="d-ok")
    with pytest.raises(ForkRefused, match="call 11 is nothing: the run never reached it"):
        await flow.fork("d-ok", from_step=12)
    assert (await flow.fork("d-ok", from_step=11)).output == [n * 10 for n in range(1, 11)]
    with pytest.raises(ValueError, match="call 1 or later"):
        await flow.fork("d", from_step=0)
    with pytest.raises(RunNotFound):
        await flow.fork("nobody", from_step=1)


async def test_a_fork_keeps_the_records_and_patches_made_before_its_step(
    store: EventStore,
) -> None:
    async def recorded(run: str) -> list[object]:
        await set_attributes({"stage": "one"})
        took = await patched("early")
        first = await step(effect, run, 1, name="s1")
        await set_attributes({"stage": "two"})
        late = await patched("late")
        second = await step(effect, run, 2, name="s2")
        return [took, first, late, second]

    flow = Flow(store, [Workflow(name="test-fork-records", fn=recorded)])
    done = await flow.start(flow.workflows["test-fork-records"], "e", run_id="e")
    assert done.output == [True, 10, True, 20]
    forked = await flow.fork("e", from_step=3, new_run_id="e-3")
    assert forked.output == done.output
    attributes = dict(forked.snapshot.attributes)
    assert attributes["stage"] == "two"
    assert "$patch:early" in attributes and "$patch:late" in attributes
    forked_early = await flow.fork("e", from_step=2, new_run_id="e-2")
    assert forked_early.output == [True, 10, True, 20]


async def test_step_errors_stay_with_the_old_run(store: EventStore) -> None:
    async def catches(run: str) -> str:
        try:
            await step(effect, run, 1, name="s1", retry=ONCE)
        except StepError:
            return "caught"
        return "fine"

    flow = Flow(store, [Workflow(name="test-fork-catches", fn=catches)])
    BROKEN.add(1)
    done = await flow.start(flow.workflows["test-fork-catches"], "f", run_id="f")
    assert done.output == "caught"
    with pytest.raises(ForkRefused):
        await flow.fork("f", from_step=2)
    BROKEN.clear()
    assert (await flow.fork("f", from_step=1)).output == "fine"


async def test_no_wait_of_a_run_with_a_mailbox_is_reused(store: EventStore, clock: Clock) -> None:
    async def listens(run: str) -> object:
        first = await step(effect, run, 1, name="s1")
        message = await recv("news", timeout=timedelta(minutes=1))
        return [first, message, await step(effect, run, 2, name="s2")]

    flow = Flow(store, [Workflow(name="test-fork-listens", fn=listens)], clock=clock)
    await flow.start(flow.workflows["test-fork-listens"], "g", run_id="g")
    clock.advance(timedelta(minutes=2))
    await flow.run_until_idle()
    done = await flow.result("g")
    assert done.output == [10, None, 20]
    with pytest.raises(ForkRefused, match="call 2 is a sleep or a recv's timer"):
        await flow.fork("g", from_step=3)
    assert (await flow.fork("g", from_step=2, new_run_id="g-2")).status == "running"
