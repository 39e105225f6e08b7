"""`StepThreads`: bounded threads, outcomes back on the loop, cancelled bodies skipped, and
bodies that still run when the interpreter exits finish first."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from runfold.flow.threads import StepThreads


async def test_bodies_run_in_named_threads_at_most_size_at_once() -> None:
    pool = StepThreads(2, name="test-step")
    lock = threading.Lock()
    running = {"now": 0, "most": 0}
    names: set[str] = set()

    def body(i: int) -> int:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
            names.add(threading.current_thread().name)
        time.sleep(0.02)
        with lock:
            running["now"] -= 1
        return i * i

    try:
        results = await asyncio.gather(*(pool.run(functools.partial(body, i)) for i in range(6)))
    finally:
        pool.shutdown()
    assert results == [i * i for i in range(6)]
    assert running["most"] == 2
    assert names <= {"test-step_0", "test-step_1"} and names


async def test_a_body_that_raises_raises_on_the_loop() -> None:
    pool = StepThreads(1, name="test-step")

    def fails() -> None:
        raise KeyError("nope")

    try:
        with pytest.raises(KeyError, match="nope"):
            await pool.run(fails)
    finally:
        pool.shutdown()


async def test_a_body_cancelled_before_it_began_does_not_run() -> None:
    pool = StepThreads(1, name="test-step")
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        started.set()
        release.wait(5)
        ran.append("blocker")

    try:
        first = pool.run(blocker)
        await asyncio.to_thread(started.wait, 5)
        second = pool.run(lambda: ran.append("cancelled"))
        second.cancel()
        release.set()
        await first
        await pool.run(lambda: ran.append("after"))
    finally:
        pool.shutdown()
    assert ran == ["blocker", "after"]


def test_the_interpreter_lets_a_running_body_finish_before_it_exits(tmp_path: Path) -> None:
    mark = tmp_path / "finished"
    script = textwrap.dedent(
        f"""
        import asyncio, time
        from pathlib import Path
        from runfold.flow.threads import StepThreads

        def body():
            time.sleep(0.3)
            Path({str(mark)!r}).write_text("done")

        async def main():
            StepThreads(1, name="exiting").run(body)
            await asyncio.sleep(0.05)

        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert mark.read_text() == "done"


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        StepThreads(0, name="none")
