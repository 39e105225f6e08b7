"""`continue_as_new`: a chain of runs finishes a workflow of any length, once, through crashes."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from runfold import EventStore, MemoryStore
from runfold.flow import (
    ContinueAsNewError,
    Flow,
    FlowNonDeterminism,
    PayloadError,
    Workflow,
    child,
    continue_as_new,
    recv,
    sleep,
    start_child,
    step,
    workflow,
    workflow_info,
)
from runfold.flow.continuation import CONTINUE_KIND, successor_run_id
from runfold.kernel import CancelRequested, HookReceived, RunCompleted, RunCreated
from runfold.stores import PostgresStore, SQLiteStore
from runfold.testing import Fault, SimulatedCrash, crash_and_resume
from runfold.testing.strategies import fault_schedules
from tests.conftest import Clock
from tests.support.child_workers import spawn_worker
from tests.support.cli_support import runfold_worker
from tests.support.continuation_workflows import counter
from tests.support.meanwhile import AroundCreation, BeforeEvent
from tests.support.postgres_support import DSN, admin, schema_name

ROOT = Path(__file__).resolve().parents[2]


async def chain_of(store: EventStore, first: str) -> list[Any]:
    """The runs of the chain that began with `first`, in order, as their snapshots."""
    flow = Flow(store, [counter])
    runs = [await flow.handler.snapshot(first)]
    while (successor := flow.report(runs[-1]).continued_as) is not None:
        runs.append(await flow.handler.snapshot(successor))
    return runs


@pytest.mark.slow
async def test_ten_thousand_steps_finish_as_a_hundred_runs(store: EventStore) -> None:
    if type(store) is MemoryStore:
        pytest.skip("the long chain is for the durable stores")
    flow = Flow(store, [counter], step_threads=0)
    run = await flow.start(counter, {"n": 0, "target": 10_000}, run_id="c")
    # The chain's last run answers for the first: 100 runs of 100 steps.
    assert (run.run_id, run.status) == ("c~99", "completed")
    assert run.output == {"n": 10_000, "generation": 99, "first": "c"}
    assert (await flow.result("c")).output == run.output
    runs = await chain_of(store, "c")
    assert [r.run_id for r in runs] == ["c"] + [f"c~{g}" for g in range(1, 100)]
    assert all(r.status == "completed" for r in runs)
    assert [len(r.steps) for r in runs] == [100] * 100
    first = flow.report(runs[0])
    assert (first.output, first.continued_as) == (None, "c~1")
    # Linked both ways in the records: the link in the run, the attributes of the successor.
    link = list(runs[0].children.values())[-1]
    assert (link.kind, link.child_run_id) == (CONTINUE_KIND, "c~1")
    assert json.loads(link.metadata or b"") == {"n": 100, "target": 10_000}
    assert dict(runs[1].attributes) == {
        "$continued_from": "c",
        "$first_run": "c",
        "$generation": "1",
    }
    assert runs[2].attributes["$continued_from"] == "c~1"


async def test_a_continued_run_replays_to_the_same_successor(
    store: EventStore, clock: Clock
) -> None:
    @workflow(name="test-continue-sleepy")
    async def sleepy(n: int) -> int:
        await step(str, n)
        await sleep(timedelta(hours=1))
        if n < 3:
            await continue_as_new(n + 1)
        return n

    flow = Flow(store, [sleepy], clock=clock)
    started = await flow.start(sleepy, 0, run_id="s")
    assert (started.run_id, started.status) == ("s", "running")
    for generation in range(1, 4):
        clock.advance(timedelta(hours=2))
        # A fresh process each time: it replays the run from its history.
        await Flow(store, [sleepy], clock=clock).run_until_idle()
        found = await flow.result("s")
        assert found.run_id == f"s~{generation}"
    clock.advance(timedelta(hours=2))
    await Flow(store, [sleepy], clock=clock).run_until_idle()
    done = await flow.result("s")
    assert (done.status, done.output) == ("completed", 3)
    runs = [await flow.handler.snapshot(r) for r in ("s", "s~1", "s~2", "s~3")]
    assert [flow.report(r).continued_as for r in runs] == ["s~1", "s~2", "s~3", None]
    # A replay of an ended run's code decides nothing new: the same link, the same end.
    again = Flow(store, [sleepy], clock=clock)
    for run in runs[:3]:
        decided = again.interpreter.decide(run)
        assert type(decided).__name__ == "Complete"
        assert decided.output == run.output  # type: ignore[union-attr]


async def test_code_that_continues_otherwise_is_non_deterministic(clock: Clock) -> None:
    store = MemoryStore()

    @workflow(name="test-continue-changed")
    async def changed(n: int) -> int:
        if n < 1:
            await continue_as_new(n + 1)
        return n

    flow = Flow(store, [changed], clock=clock)
    await flow.start(changed, 0, run_id="x")
    first = await flow.handler.snapshot("x")

    async def changed_again(n: int) -> int:  # the code deployed since: another input
        if n < 1:
            await continue_as_new(n + 2)
        return n

    deployed = Workflow(name="test-continue-changed", fn=changed_again)
    with pytest.raises(FlowNonDeterminism, match="continue_as_new"):
        Flow(store, [deployed], clock=clock).interpreter.decide(first)


async def test_workflow_info_names_the_chain(store: EventStore) -> None:
    seen: list[tuple[Any, ...]] = []

    @workflow(name="test-continue-info")
    async def info(n: int) -> int:
        i = workflow_info()
        seen.append((i.run_id, i.continued_from, i.first_run_id, i.generation))
        if n < 2:
            await continue_as_new(n + 1)
        return n

    run = await Flow(store, [info]).start(info, 0, run_id="i")
    assert run.output == 2
    assert sorted(set(seen)) == [
        ("i", None, "i", 0),
        ("i~1", "i", "i", 1),
        ("i~2", "i~1", "i", 2),
    ]


async def test_the_deadline_carries_over_to_the_successor(store: EventStore, clock: Clock) -> None:
    @workflow(name="test-continue-deadline")
    async def slow(n: int) -> int:
        await sleep(timedelta(minutes=30))
        await continue_as_new(n + 1)
        return n

    flow = Flow(store, [slow], clock=clock)
    first = await flow.start(slow, 0, run_id="d", timeout=timedelta(hours=1))
    deadline = first.snapshot.deadline
    assert deadline is not None
    clock.advance(timedelta(minutes=31))
    await flow.run_until_idle()
    successor = await flow.handler.snapshot("d~1")
    assert successor.deadline == deadline
    clock.advance(timedelta(minutes=31))  # past the chain's deadline
    await flow.run_until_idle()
    assert (await flow.result("d")).status == "timed_out"


async def test_a_child_that_continues_answers_its_parent_with_the_chain_end(
    store: EventStore,
) -> None:
    @workflow(name="test-continue-child")
    async def kid(n: int) -> int:
        if n < 3:
            await continue_as_new(n + 1)
        return n * 10

    @workflow(name="test-continue-parent")
    async def parent(_: None) -> int:
        result: int = await child(kid, 0)
        return result + 1

    flow = Flow(store, [kid, parent])
    run = await flow.start(parent, None, run_id="p")
    assert (run.status, run.output) == ("completed", 31)
    last = await flow.handler.snapshot("p/1~3")
    assert (last.parent_run_id, last.status) == ("p", "completed")


async def test_cancelling_a_parent_cancels_its_child_chain_s_live_run(store: EventStore) -> None:
    @workflow(name="test-continue-waiting-kid")
    async def waiting_kid(n: int) -> None:
        if n < 1:
            await continue_as_new(n + 1)
        await recv("never")

    @workflow(name="test-continue-waiting-parent")
    async def waiting_parent(_: None) -> None:
        handle = await start_child(waiting_kid, 0)
        await handle.result()

    flow = Flow(store, [waiting_kid, waiting_parent])
    await flow.start(waiting_parent, None, run_id="wp")
    assert (await flow.handler.snapshot("wp/1~1")).status == "running"
    await flow.cancel("wp")
    assert (await flow.handler.snapshot("wp/1~1")).status == "cancelled"


async def test_send_reaches_the_chain_s_live_run_and_a_continuing_run_s_children_end(
    store: EventStore,
) -> None:
    @workflow(name="test-continue-idle")
    async def idle(_: None) -> None:
        await recv("never")

    @workflow(name="test-continue-inbox")
    async def inbox(n: int) -> list[Any]:
        if n == 0:
            await start_child(idle, None)  # left live: ended with its parent's run
            await continue_as_new(1)
        return [await recv("m")]

    flow = Flow(store, [idle, inbox])
    assert (await flow.start(inbox, 0, run_id="b")).run_id == "b~1"
    assert (await flow.handler.snapshot("b/1")).status == "cancelled"
    done = await flow.send("b", "hello", topic="m")  # addressed to the first run
    assert (done.run_id, done.output) == ("b~1", ["hello"])


async def test_bad_continuations_are_typed_errors_at_the_call(store: EventStore) -> None:
    @workflow(name="test-continue-bad")
    async def bad(kind: str) -> str:
        try:
            await continue_as_new(object())
        except PayloadError as exc:
            return f"payload: {'continue_as_new' in str(exc)}"
        return "continued"

    run = await Flow(store, [bad]).start(bad, "x", run_id="bad")
    assert run.output == "payload: True"

    @workflow(name="test-continue-long-id")
    async def long_id(n: int) -> int:
        if n == 0:
            await continue_as_new(1)
        return n

    failed = await Flow(store, [long_id]).start(long_id, 0, run_id="é" * 200)
    assert failed.status == "failed"
    assert failed.snapshot.error_code == ContinueAsNewError.__name__
    assert "at most 256 bytes" in (failed.error or "")


def test_successor_ids_are_derived_and_bounded() -> None:
    assert successor_run_id("order-1", 7) == "order-1~7"
    long = successor_run_id("x" * 256, 1)
    assert long.startswith("continued_") and len(long) <= 256
    assert long == successor_run_id("x" * 256, 1) != successor_run_id("x" * 256, 2)


@pytest.mark.slow
async def test_a_fleet_worker_process_claims_each_successor(tmp_path: Path) -> None:
    path = tmp_path / "fleet.db"
    async with await SQLiteStore.open(path) as store:
        flow = Flow(store, [counter])
        await flow.start(counter, {"n": 0, "target": 450}, run_id="f", queued=True)
        with runfold_worker("tests.support.continuation_workflows", f"sqlite:///{path}"):
            run = await flow.result("f", wait=60)
        assert (run.run_id, run.output) == ("f~4", {"n": 450, "generation": 4, "first": "f"})
        runs = await chain_of(store, "f")
        assert [r.owner_epoch for r in runs] == [1] * 5  # each claimed once, as a queued run


@settings(max_examples=25, deadline=None)
@given(schedule=fault_schedules())
async def test_a_chain_survives_any_fault_schedule(schedule: tuple[Fault, ...]) -> None:
    outcome = await crash_and_resume(
        counter, {"n": 0, "target": 250}, store=MemoryStore(), schedule=schedule, run_id="z"
    )
    assert outcome.same, outcome


async def killed_then_recovered(args: dict[str, Any], store: EventStore) -> None:
    killed = spawn_worker(
        "continuation_worker", {**args, "kill_at": args["kill_at"], "generation": 2, "target": 500}
    )
    out, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, (out, err)
    # The successor exists, not started yet; the run ended with its link (one append) or not.
    assert [type(e.event) for e in await store.read("c~2")] == [RunCreated]
    ended = isinstance((await store.read("c~1"))[-1].event, RunCompleted)
    assert ended == (args["kill_at"] == "linked")
    recovered = spawn_worker("continuation_worker", {**args, "kill_at": None, "generation": 0})
    out, err = recovered.communicate(timeout=120)
    assert recovered.returncode == 0, err
    reported = json.loads(out.strip().splitlines()[-1])
    assert reported == {
        "run_id": "c~4",
        "status": "completed",
        "output": {"n": 500, "generation": 4, "first": "c"},
    }
    # Exactly one successor per generation, each created once and ended once.
    runs = await chain_of(store, "c")
    assert [r.run_id for r in runs] == ["c", "c~1", "c~2", "c~3", "c~4"]
    page = await store.list_runs(limit=100)
    assert sorted(s.run_id for s in page.items) == ["c", "c~1", "c~2", "c~3", "c~4"]
    for run in runs[:4]:
        links = [link for link in run.children.values() if link.kind == CONTINUE_KIND]
        assert len(links) == 1


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["created", "linked"])
async def test_a_sigkill_inside_a_continuation_continues_once_on_sqlite(
    tmp_path: Path, kill_at: str
) -> None:
    path = tmp_path / "chain.db"
    async with await SQLiteStore.open(path) as store:
        args = {"backend": "sqlite", "path": str(path), "kill_at": kill_at}
        await killed_then_recovered(args, store)


@pytest.mark.postgres
@pytest.mark.parametrize("kill_at", ["created", "linked"])
async def test_a_sigkill_inside_a_continuation_continues_once_on_postgres(kill_at: str) -> None:
    admin()  # skips (or fails under CI) without a server
    schema = schema_name("chainkill")
    args = {"backend": "postgres", "dsn": DSN, "schema": schema, "kill_at": kill_at}
    store = await PostgresStore.open(DSN, schema=schema, pool_max=2)
    try:
        await killed_then_recovered(args, store)
    finally:
        await store.close()


def test_the_worker_is_importable_without_pytest() -> None:
    source = (ROOT / "tests" / "support" / "continuation_worker.py").read_text()
    assert "pytest" not in source.split('"""', 2)[2]


async def test_waiting_for_the_first_run_waits_for_the_chain(store: EventStore) -> None:
    @workflow(name="test-continue-gated")
    async def gated(n: int) -> int:
        await recv("go")
        if n < 2:
            await continue_as_new(n + 1)
        return n

    flow = Flow(store, [gated])
    await flow.start(gated, 0, run_id="g")

    async def feed() -> None:
        for _ in range(3):
            await asyncio.sleep(0.05)
            await flow.send("g", "go", topic="go")

    feeding = asyncio.create_task(feed())
    run = await flow.result("g", wait=30)
    await feeding
    assert (run.run_id, run.status, run.output) == ("g~2", "completed", 2)


async def test_a_successor_id_taken_by_another_run_fails_the_run(store: EventStore) -> None:
    @workflow(name="test-continue-taken")
    async def taken(n: int) -> int:
        if n == 0:
            await continue_as_new(1)
        return n

    @workflow(name="test-continue-squatter")
    async def squatter(_: None) -> str:
        return "here first"

    flow = Flow(store, [taken, squatter])
    await flow.start(squatter, None, run_id="t~1")
    run = await flow.start(taken, 0, run_id="t")
    assert (run.run_id, run.status, run.snapshot.error_code) == (
        "t",
        "failed",
        "RunDefinitionConflict",
    )
    assert "exists as another run" in (run.error or "")


async def test_code_that_no_longer_continues_is_told_what_was_recorded() -> None:
    store = MemoryStore()

    @workflow(name="test-continue-dropped")
    async def dropped(n: int) -> int:
        if n == 0:
            await continue_as_new(1)
        return n

    flow = Flow(store, [dropped])
    await flow.start(dropped, 0, run_id="y")
    first = await flow.handler.snapshot("y")

    async def stepping(n: int) -> int:  # the code deployed since: a step where it continued
        return int(await step(str, n))

    deployed = Workflow(name="test-continue-dropped", fn=stepping)
    with pytest.raises(FlowNonDeterminism, match="recorded continue_as_new as"):
        Flow(store, [deployed]).interpreter.decide(first)


@workflow(name="test-continue-then-idle")
async def continue_then_idle(n: int) -> None:
    if n == 0:
        await continue_as_new(1)
    await recv("never")


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
async def test_a_successor_created_while_its_run_is_cancelled_is_cancelled(
    store: EventStore, before: bool
) -> None:
    elsewhere = Flow(store, [continue_then_idle])  # another process cancels the run

    async def run_cancelled() -> None:
        cancelled = await elsewhere.cancel("z", reason="gave up")
        assert (cancelled.run_id, cancelled.status) == ("z", "cancelled")

    wrapped = AroundCreation(store, "z~1", run_cancelled, before=before)
    flow = Flow(wrapped, [continue_then_idle])
    await flow.start(continue_then_idle, 0, run_id="z", queued=True)
    await flow.recover()  # the run, recorded first, is driven: it makes its successor
    assert wrapped.meanwhile is None
    ended = await flow.handler.snapshot("z")
    assert ended.status == "cancelled" and not ended.children
    # The run ended without continuing: its successor, made all the same, does not live on.
    left = await flow.handler.snapshot("z~1")
    assert left.status == "cancelled", left.status


async def test_recover_cancels_a_successor_left_by_two_processes_that_died(
    store: EventStore,
) -> None:
    elsewhere = Flow(store, [continue_then_idle])

    async def cancelled_then_both_die() -> None:
        # Another process cancels the run and dies before its follow-up looks for a successor;
        # this one dies too, with the successor made and not linked.
        await elsewhere.engine.request_cancel("d", reason="gave up")
        raise SimulatedCrash("the process died")

    wrapped = AroundCreation(store, "d~1", cancelled_then_both_die, before=False)
    flow = Flow(wrapped, [continue_then_idle])
    await flow.start(continue_then_idle, 0, run_id="d", queued=True)
    with pytest.raises(SimulatedCrash):
        await flow.recover()  # the run is driven: it makes its successor, then dies
    assert (await flow.handler.snapshot("d")).status == "cancelled"
    assert (await flow.handler.snapshot("d~1")).status == "pending"
    await Flow(store, [continue_then_idle]).recover()
    left = await elsewhere.handler.snapshot("d~1")
    assert left.status == "cancelled", left.status
    assert left.cancellation is not None and "'d' ended cancelled" in (
        left.cancellation.reason or ""
    )


@workflow(name="test-continue-on-go")
async def continue_on_go(n: int) -> None:
    if n == 0:
        await recv("go")
        await continue_as_new(1)
    await recv("never")


@workflow(name="test-continue-on-go-parent")
async def continue_on_go_parent(_: None) -> None:
    handle = await start_child(continue_on_go, 0)
    await recv("stop")
    await handle.cancel("stopped")
    await recv("never")


async def test_cancelling_a_run_as_it_continues_cancels_its_successor(store: EventStore) -> None:
    elsewhere = Flow(store, [continue_on_go])  # another process: the run continues meanwhile

    async def continues() -> None:
        await elsewhere.send("g", "now", topic="go")
        assert (await elsewhere.result("g")).run_id == "g~1"

    wrapped = BeforeEvent(store, "g", CancelRequested, continues)
    flow = Flow(wrapped, [continue_on_go])
    await flow.start(continue_on_go, 0, run_id="g")
    cancelled = await flow.cancel("g", reason="gave up")  # it reads "g" live, then asks
    assert wrapped.meanwhile is None
    assert (cancelled.run_id, cancelled.status) == ("g~1", "cancelled")


async def test_a_child_cancelled_through_its_handle_as_it_continues_is_cancelled(
    store: EventStore,
) -> None:
    elsewhere = Flow(store, [continue_on_go])

    async def continues() -> None:
        await elsewhere.send("h/1", "now", topic="go")
        assert (await elsewhere.result("h/1")).run_id == "h/1~1"

    wrapped = BeforeEvent(store, "h/1", CancelRequested, continues)
    flow = Flow(wrapped, [continue_on_go, continue_on_go_parent])
    await flow.start(continue_on_go_parent, None, run_id="h")
    await flow.send("h", "now", topic="stop")
    assert wrapped.meanwhile is None
    assert (await flow.result("h/1")).status == "cancelled"  # the chain's last run, h/1~1


@workflow(name="test-continue-on-go-awaiting-parent")
async def continue_on_go_awaiting_parent(_: None) -> None:
    await (await start_child(continue_on_go, 0)).result()


async def test_a_parent_ending_as_its_child_continues_cancels_the_successor(
    store: EventStore,
) -> None:
    elsewhere = Flow(store, [continue_on_go])

    async def continues() -> None:  # after the parent's end listed its children
        await elsewhere.send("a/1", "now", topic="go")
        assert (await elsewhere.result("a/1")).run_id == "a/1~1"

    wrapped = BeforeEvent(store, "a/1", CancelRequested, continues)
    flow = Flow(wrapped, [continue_on_go, continue_on_go_awaiting_parent])
    await flow.start(continue_on_go_awaiting_parent, None, run_id="a")
    assert (await flow.cancel("a")).status == "cancelled"
    assert wrapped.meanwhile is None
    assert (await flow.result("a/1")).status == "cancelled"  # the chain's last run, a/1~1


async def test_a_message_sent_as_the_run_continues_reaches_its_successor(
    store: EventStore,
) -> None:
    elsewhere = Flow(store, [continue_on_go])

    async def continues() -> None:  # after the sender read the chain's last run
        await elsewhere.send("m", "now", topic="go")
        assert (await elsewhere.result("m")).run_id == "m~1"

    wrapped = BeforeEvent(store, "m", HookReceived, continues)
    flow = Flow(wrapped, [continue_on_go])
    await flow.start(continue_on_go, 0, run_id="m")
    done = await flow.send("m", "late", topic="never")
    assert wrapped.meanwhile is None
    assert (done.run_id, done.status) == ("m~1", "completed")
