"""A plain `def` step body runs in the Flow's threads: a slow one stalls no other run."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from runfold import EventStore, MemoryStore
from runfold.flow import Flow, step, workflow

SLEEPING = threading.Event()
MARKS: dict[str, float] = {}


def slow() -> str:
    MARKS["slow started"] = time.monotonic()
    SLEEPING.set()
    time.sleep(1)  # blocking: on the event loop it would stall every run
    MARKS["slow ended"] = time.monotonic()
    return "slept"


async def after_the_slow_one_started(i: int) -> int:
    while not SLEEPING.is_set():
        await asyncio.sleep(0.001)
    MARKS[f"quick {i}"] = time.monotonic()
    return i


@workflow(name="test-slow")
async def slow_run(_: None) -> str:
    done: str = await step(slow)
    return done


@workflow(name="test-quick")
async def quick_run(n: int) -> int:
    return sum([await step(after_the_slow_one_started, i) for i in range(n)])


async def test_a_sleeping_def_step_does_not_delay_another_runs_steps(store: EventStore) -> None:
    SLEEPING.clear()
    MARKS.clear()
    flow = Flow(store, [slow_run, quick_run])
    slow_done, quick_done = await asyncio.gather(
        flow.start(slow_run, None, run_id="slow"), flow.start(quick_run, 5, run_id="quick")
    )
    assert (slow_done.output, quick_done.output) == ("slept", 10)
    # Every step of the quick run ran while the slow body slept, not after it.
    order = sorted(MARKS, key=MARKS.__getitem__)
    assert order == ["slow started", *(f"quick {i}" for i in range(5)), "slow ended"], MARKS


def test_step_threads_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="step_threads"):
        Flow(MemoryStore(), [slow_run], step_threads=-1)


async def test_no_step_threads_runs_def_bodies_on_the_loop() -> None:
    @workflow(name="test-on-the-loop")
    async def on_the_loop(_: None) -> str:
        name: str = await step(lambda: threading.current_thread().name, name="thread")
        return name

    done = await Flow(MemoryStore(), [on_the_loop], step_threads=0).start(on_the_loop, None)
    assert done.output == threading.current_thread().name


class _Body:
    """A callable step body that cannot be hashed (it defines `__eq__` alone)."""

    def __init__(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Body) and other.asynchronous == self.asynchronous

    def __call__(self) -> str:
        return threading.current_thread().name


async def _on_the_loop() -> str:
    return threading.current_thread().name


async def test_each_body_runs_where_its_kind_says_hashable_or_not() -> None:
    @workflow(name="test-body-kinds")
    async def kinds(_: None) -> list[str]:
        names: list[str] = []
        for _round in range(2):  # the second time, the kinds are remembered
            names.append(await step(_Body(False), name="unhashable"))
            names.append(await step(_on_the_loop))
        return names

    done = await Flow(MemoryStore(), [kinds]).start(kinds, None)
    loop_thread = threading.current_thread().name
    assert [name == loop_thread for name in done.output] == [False, True, False, True]
