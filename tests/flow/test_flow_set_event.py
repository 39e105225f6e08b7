"""Events from workflow code: `await set_event(key, value)` and `Flow.get_event(run_id, key)`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runfold import EventStore, MemoryStore
from runfold.flow import Flow, PayloadError, continue_as_new, recv, set_event, workflow
from runfold.flow.events import EVENT_STEP_PREFIX
from runfold.kernel import RunNotFound
from runfold.stores import PostgresStore, SQLiteStore
from tests.support.cli_support import runfold_worker
from tests.support.continuation_workflows import counter, publisher, slow_publisher
from tests.support.postgres_support import DSN, admin, schema_name


async def test_get_event_waits_for_the_latest_value(store: EventStore) -> None:
    flow = Flow(store, [publisher])
    await flow.start(publisher, 2, run_id="p")
    assert await flow.get_event("p", "stage", timeout=0) is None  # not set yet
    waiting = asyncio.create_task(flow.get_event("p", "stage", timeout=30))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # it blocks until the run sets the key
    await flow.send("p", "go", topic="go")
    assert await waiting == {"stage": 1}
    await flow.send("p", "go", topic="go")
    assert await flow.get_event("p", "stage") == {"stage": 2}  # the latest value per key
    assert await flow.get_event("p", "done") is True
    # Each set is one recorded step of the run, named after its key.
    names = [s.step_name for s in (await flow.result("p")).snapshot.steps.values()]
    assert names == [EVENT_STEP_PREFIX + "stage"] * 2 + [EVENT_STEP_PREFIX + "done"]


async def test_get_event_gives_none_after_its_timeout_or_the_run_s_end(store: EventStore) -> None:
    @workflow(name="test-event-silent")
    async def silent(_: None) -> str:
        await recv("go")
        return "ended"

    flow = Flow(store, [silent])
    await flow.start(silent, None, run_id="s")
    assert await flow.get_event("s", "never", timeout=0.05) is None
    waiting = asyncio.create_task(flow.get_event("s", "never", timeout=None))
    await asyncio.sleep(0.05)
    await flow.send("s", "go", topic="go")
    assert await waiting is None  # the run ended without setting it: no wait for ever
    with pytest.raises(RunNotFound):
        await flow.get_event("nobody", "k", timeout=0)
    with pytest.raises(ValueError, match="negative"):
        await flow.get_event("s", "k", timeout=-1)


async def test_set_event_replays_without_recording_again(store: EventStore) -> None:
    flow = Flow(store, [publisher])
    await flow.start(publisher, 3, run_id="r")
    await flow.send("r", "go", topic="go")
    before = await store.read("r")
    fresh = Flow(store, [publisher])  # a new process: the run is replayed from its history
    await fresh.recover()
    assert len(await store.read("r")) == len(before)
    await fresh.send("r", "go", topic="go")
    await fresh.send("r", "go", topic="go")
    assert await fresh.get_event("r", "stage") == {"stage": 3}
    steps = (await fresh.result("r")).snapshot.steps
    assert [s.step_id for s in steps.values()] == ["2", "4", "6", "7"]


async def test_events_follow_a_chain_of_continue_as_new(store: EventStore) -> None:
    @workflow(name="test-event-chain")
    async def chained(n: int) -> int:
        if n == 0:
            await set_event("first", "from the first run")
        await set_event("n", n)
        if n < 2:
            await continue_as_new(n + 1)
        return n

    flow = Flow(store, [chained])
    assert (await flow.start(chained, 0, run_id="ch")).run_id == "ch~2"
    assert await flow.get_event("ch", "n", timeout=0) == 2  # the last run that set it
    assert await flow.get_event("ch", "first", timeout=0) == "from the first run"
    assert await flow.get_event("ch~1", "n", timeout=0) == 2


async def test_bad_keys_and_values_are_typed_errors_at_the_call() -> None:
    @workflow(name="test-event-bad")
    async def bad(key: str) -> str:
        try:
            await set_event(key, "v")
        except ValueError as exc:
            return f"key: {exc}"
        try:
            await set_event("k", object())
        except PayloadError as exc:
            return f"value: {'cannot be encoded' in str(exc)}"
        return "set"

    flow = Flow(MemoryStore(), [bad])
    assert (await flow.start(bad, "ok")).output == "value: True"
    for key in ("", "x" * 201, "a\nb", "\ud800"):
        output = (await flow.start(bad, key)).output
        assert output.startswith("key: "), (key, output)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_get_event_sees_a_value_set_in_another_process(tmp_path: Path, backend: str) -> None:
    store: EventStore
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'events.db'}"
        store = await SQLiteStore.open(tmp_path / "events.db")
    else:
        admin()  # skips (or fails under CI) without a server
        schema = schema_name("events")
        url = f"{DSN}?schema={schema}"
        store = await PostgresStore.open(DSN, schema=schema, pool_max=2)
    async with store:
        await Flow(store, [slow_publisher]).start(slow_publisher, 0.5, run_id="x", queued=True)
        flow = Flow(store, [counter])  # serves not the publisher: only the worker drives it
        with runfold_worker("tests.support.continuation_workflows", url):
            assert await flow.get_event("x", "ready", timeout=60) == {"after": 0.5}
            done = await flow.result("x", wait=60)
            assert (done.status, done.output) == ("completed", "published")
