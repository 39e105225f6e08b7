"""A fleet: several workers on one store, each run driven by one owner at a time.

In one process here (several `Flow`s, each serving as a worker, over one store); the chaos test
with real processes under SIGKILL and SIGSTOP is `tests/engine/test_fleet_chaos.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runfold import MemoryStore
from runfold.commands import ClaimRun
from runfold.engine import Worker
from runfold.events import HookReceived, RunClaimed
from runfold.flow import Flow, sleep, step, wait_for_event, workflow
from runfold.stores import EventStore, WorkerLeases
from tests.support.fleet_workflows import (
    EXPECTED,
    LEDGER_ENV,
    fleet_run,
    overlaps,
    ran_twice,
    read_ledger,
)

RUNS = 24


async def wait_for(condition: object, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_three_workers_share_the_runs_and_run_each_body_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    store = MemoryStore()
    flows = [Flow(store, [fleet_run]) for _ in range(3)]
    serving = [
        asyncio.create_task(
            flow.serve(poll_interval=0.05, lease=timedelta(seconds=5), handle_signals=False)
        )
        for flow in flows
    ]
    await wait_for(lambda: _all_serving(flows))
    ids = []
    for n in range(RUNS):
        started = await flows[n % 3].start(fleet_run, {"work": 0.001, "sleep": 0.05})
        ids.append(started.run_id)

    async def all_done() -> bool:
        return all([(await flows[0].result(i)).status == "completed" for i in ids])

    await wait_for(all_done)
    for flow in flows:
        flow.stop()
    await asyncio.gather(*serving)
    assert {(await flows[0].result(i)).output for i in ids} == {EXPECTED}
    rows = read_ledger(ledger)
    assert len([r for r in rows if r[0] == "start"]) == RUNS * 10
    assert (ran_twice(rows), overlaps(rows)) == (0, 0)
    # The sleeps were resumed by whichever worker found them due: the work was shared.
    drives = [flow.engine for flow in flows]
    assert all(engine.lease is None for engine in drives)
    assert await store.list_leases() == []  # each worker dropped its lease on stopping


async def _all_serving(flows: list[Flow]) -> bool:
    return all(flow.worker is not None for flow in flows)


async def test_a_worker_needs_a_store_that_keeps_leases(store: EventStore) -> None:
    flow = Flow(store, [fleet_run])
    if isinstance(store, WorkerLeases):
        Worker(flow.engine)  # accepted
        return
    with pytest.raises(TypeError, match="keeps no worker leases"):
        Worker(flow.engine)


@workflow(name="test-fleet-tick", schedule="* * * * * *")
async def every_second(tick: str) -> str:
    return tick


@pytest.mark.slow
async def test_a_schedule_starts_one_run_per_tick_across_the_fleet() -> None:
    store = MemoryStore()
    flows = [Flow(store, [every_second]) for _ in range(3)]
    serving = [
        asyncio.create_task(flow.serve(poll_interval=0.05, handle_signals=False)) for flow in flows
    ]
    await asyncio.sleep(3.6)
    for flow in flows:
        flow.stop()
    await asyncio.gather(*serving)
    page = await store.list_runs(workflow_name="test-fleet-tick", limit=100)
    outputs = [(await flows[0].result(s.run_id)).output for s in page.items]
    ticks = sorted(datetime.fromisoformat(output) for output in outputs)
    assert len(ticks) >= 3, ticks
    assert len(set(ticks)) == len(ticks) == len(page.items)
    # One run per tick, none missed: consecutive seconds.
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ticks)), ticks
    assert all(s.status == "completed" for s in page.items)


def test_a_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="not a cron expression"):
        workflow(name="test-fleet-bad", schedule="every tuesday")(every_second.fn)


@workflow(name="test-fleet-long-sleep")
async def long_sleep(_: None) -> str:
    await sleep(timedelta(hours=1))
    return "woke"


async def test_a_waiting_run_of_a_dead_owner_is_taken_over_and_released() -> None:
    store = MemoryStore()
    starter = Flow(store, [long_sleep])
    run = await starter.start(long_sleep, None)
    assert run.status == "running"
    # A worker that died right after claiming the waiting run: it holds no lease.
    await starter.handler.execute(run.run_id, ClaimRun(owner_id="dead-worker"))
    assert [s.run_id for s in await store.orphaned_runs(datetime.now(UTC))] == [run.run_id]
    flow = Flow(store, [long_sleep])
    serving = asyncio.create_task(flow.serve(poll_interval=0.02, handle_signals=False))

    async def released() -> bool:
        return (await store.get_runs([run.run_id]))[0].owner_id is None  # type: ignore[union-attr]

    await wait_for(released, timeout=10)
    flow.stop()
    await serving
    kinds = [
        (type(e.event).__name__, getattr(e.event, "displaced", None))
        for e in await store.read(run.run_id)
    ]
    assert kinds[-2:] == [("RunClaimed", "dead-worker"), ("RunReleased", None)]
    assert await store.orphaned_runs(datetime.now(UTC)) == []


@workflow(name="fleet-webhook")
async def paid_order(order: str) -> str:
    payment = await wait_for_event("payment", token=f"pay-{order}")
    text: str = await step(str.upper, f"{order}:{payment}")
    return text


async def test_a_delivery_from_a_process_outside_the_fleet_is_driven_by_a_worker(
    store: EventStore,
) -> None:
    """A web process (no worker) records the delivery; a worker claims the run and drives it."""
    worker_flow, web = Flow(store, [paid_order]), Flow(store, [paid_order])
    serving = asyncio.create_task(
        worker_flow.serve(poll_interval=30.0, lease=timedelta(seconds=10), handle_signals=False)
    )
    await wait_for(lambda: _all_serving([worker_flow]))
    started = await web.start(paid_order, "o-1", queued=True)
    run_id = started.run_id

    async def waiting() -> bool:
        snapshot = (await web.result(run_id)).snapshot
        return bool(snapshot.active_hook_ids) and snapshot.owner is None

    await wait_for(waiting)  # started by the worker, released at the hook
    delivered = await web.deliver("pay-o-1", "card")
    assert delivered.status == "running"  # recorded, not driven here
    # Woken by the run signal (the worker's poll is 30 s), the worker ends the run.
    finished = await web.result(run_id, wait=20.0)
    worker_flow.stop()
    await serving
    assert (finished.status, finished.output) == ("completed", "O-1:CARD")
    history = [envelope.event for envelope in await store.read(run_id)]
    received = next(i for i, e in enumerate(history) if isinstance(e, HookReceived))
    # The next thing after the delivery is a worker's claim: nobody drove the run unowned.
    claim = history[received + 1]
    assert isinstance(claim, RunClaimed), claim
    assert claim.owner_id.startswith(socket.gethostname() or "worker")


STUBBORN_STARTED = asyncio.Event()


async def shrug_off_one_cancel() -> str:
    """A step body that swallows the first cancellation it gets and waits on for an hour."""
    STUBBORN_STARTED.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(3600)
    return "never"


@workflow(name="fleet-stubborn")
async def stubborn(_: None) -> str:
    text: str = await step(shrug_off_one_cancel)
    return text


async def test_a_stopping_worker_ends_a_drive_that_swallowed_its_cancellation() -> None:
    """A task that lost a cancellation (a body that swallows it; on Python 3.11 also an
    `asyncio.wait_for` completing as it is cancelled) is cancelled again: the worker stops
    after its grace period instead of waiting for the body's hour."""
    STUBBORN_STARTED.clear()
    store = MemoryStore()
    flow = Flow(store, [stubborn])
    serving = asyncio.create_task(flow.serve(poll_interval=0.02, grace=0.1, handle_signals=False))
    await flow.start(stubborn, None, queued=True)
    await asyncio.wait_for(STUBBORN_STARTED.wait(), timeout=60)
    flow.stop()
    done, _ = await asyncio.wait({serving}, timeout=60)
    assert serving in done, "the worker waited on the body that swallowed its cancellation"
    await serving
