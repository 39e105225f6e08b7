"""Queues across a fleet: real `runfold worker --queue` processes on one SQLite file or one
PostgreSQL schema, the runs started from this process on a queue.

The ledger of the bodies says how many ran at once, in all and in each process: never above
the queue's limits. A rate limit spaces the starts out; priorities order them; a deduplication
id refuses a second start while the first run lives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runfold.flow import Flow, QueueDeduplicated
from runfold.stores import EventStore, open_store
from tests.support.postgres_support import DSN, admin, schema_name
from tests.support.queue_workflows import (
    LEDGER_ENV,
    most_at_once,
    queued_run,
    read_ledger,
    sleepy_run,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgres"]
READY_SECONDS = 60.0
_SERVING = " serving ["
"""What a worker logs once it took its lease and handles SIGTERM."""


def _url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'queues.db'}"
    admin()  # skips (or fails under CI=true) without a server
    separator = "&" if "?" in DSN else "?"
    return f"{DSN}{separator}schema={schema_name('queues')}"


@contextmanager
def fleet(url: str, ledger: Path, queue: str, workers: int) -> Iterator[list[int]]:
    """`workers` worker processes serving `queue`, stopped with SIGTERM at the end."""
    runfold = Path(sys.executable).with_name("runfold")
    command = [str(runfold), "worker", "--app", "tests.support.queue_workflows", "--store", url]
    command += ["--queue", queue, "--poll", "0.05", "--grace", "5", "--concurrency", "8"]
    env = {**os.environ, LEDGER_ENV: str(ledger)}
    path = ledger.with_suffix(".log")
    serving = path.read_text().count(_SERVING) if path.exists() else 0
    with open(path, "ab") as log:
        processes = [
            subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
            for _ in range(workers)
        ]
    try:
        # Until each serves: a SIGTERM before a worker handles it (it is still starting)
        # would kill it (-15), not stop it.
        deadline = time.monotonic() + READY_SECONDS
        while path.read_text().count(_SERVING) < serving + workers:
            assert all(p.poll() is None for p in processes), path.read_text()[-2000:]
            assert time.monotonic() < deadline, f"{workers} workers did not all start"
            time.sleep(0.05)
        yield [process.pid for process in processes]
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=30) for process in processes]
        assert codes == [0] * workers, ledger.with_suffix(".log").read_text()[-2000:]


async def _start(store: EventStore, count: int, queue: str, seconds: float) -> list[str]:
    flow = Flow(store, [queued_run])
    runs = [await flow.start(queued_run, seconds, queue=queue) for _ in range(count)]
    assert {run.status for run in runs} == {"pending"}, "a run on a queue ran where it started"
    return [run.run_id for run in runs]


async def _all_done(store: EventStore, run_ids: list[str], timeout: float = 90.0) -> None:
    flow = Flow(store, [queued_run])
    for run_id in run_ids:
        done = await flow.result(run_id, wait=timeout)
        assert (done.status, done.output) == ("completed", "done"), done


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_queues_limits_hold_across_worker_processes(backend: str, tmp_path: Path) -> None:
    """3 workers, 18 runs on `emails` (3 at once in all, 2 per worker): never more."""
    url, ledger = _url(backend, tmp_path), tmp_path / "ledger"

    async def go(pids: list[int]) -> None:
        async with await open_store(url) as store:
            run_ids = await _start(store, 18, "emails", 0.15)
            await _all_done(store, run_ids)

    asyncio.run(_prepare(url))
    with fleet(url, ledger, "emails", workers=3) as pids:
        asyncio.run(go(pids))
    rows = read_ledger(ledger)
    assert len([row for row in rows if row[0] == "start"]) == 18
    assert most_at_once(rows) == 3, "the queue's concurrency not reached, or passed"
    per_worker = [most_at_once(rows, pid) for pid in pids]
    assert max(per_worker) <= 2, per_worker
    assert len({row[2] for row in rows}) >= 2, "one worker took everything"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_worker_limit_holds_while_runs_sleep_and_resume(backend: str, tmp_path: Path) -> None:
    """3 workers, 9 runs on `sleepy` (3 at once in all, 1 per worker) whose steps are
    separated by sleeps: a run resumed after its sleep counts against its new worker's limit,
    so no worker ever runs two bodies at once."""
    url, ledger = _url(backend, tmp_path), tmp_path / "ledger"

    async def go() -> None:
        async with await open_store(url) as store:
            flow = Flow(store, [sleepy_run])
            runs = [await flow.start(sleepy_run, 0.05, queue="sleepy") for _ in range(9)]
            for run in runs:
                done = await flow.result(run.run_id, wait=90)
                assert (done.status, done.output) == ("completed", "done"), done

    asyncio.run(_prepare(url))
    with fleet(url, ledger, "sleepy", workers=3) as pids:
        asyncio.run(go())
    rows = read_ledger(ledger)
    assert len([row for row in rows if row[0] == "start"]) == 27
    assert most_at_once(rows) <= 3
    assert max(most_at_once(rows, pid) for pid in pids) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rate_limit_spaces_the_starts_across_workers(backend: str, tmp_path: Path) -> None:
    """2 workers, 6 runs on `reports` (2 starts a second): 2 periods at least between the
    first start and the last, and never 3 starts within one period (less the hand-out's lag)."""
    url, ledger = _url(backend, tmp_path), tmp_path / "ledger"

    async def go() -> None:
        async with await open_store(url) as store:
            await _all_done(store, await _start(store, 6, "reports", 0.01))

    asyncio.run(_prepare(url))
    with fleet(url, ledger, "reports", workers=2):
        asyncio.run(go())
    starts = [row[3] for row in read_ledger(ledger) if row[0] == "start"]
    assert len(starts) == 6
    slack = 0.25e9  # between a hand-out and its body's start
    assert starts[-1] - starts[0] >= 2e9 - slack, "6 starts at 2 a second took under 2 seconds"
    assert all(
        late - early >= 1e9 - slack for early, late in zip(starts, starts[2:], strict=False)
    ), starts


@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_start_in_priority_order(backend: str, tmp_path: Path) -> None:
    """On `ordered` (one at a time), runs queued before any worker serves start by priority,
    0 first, then lower numbers, then the oldest of a priority."""
    url, ledger = _url(backend, tmp_path), tmp_path / "ledger"
    priorities = [5, 0, 3, 5, 1, 0]

    async def queue_them() -> list[str]:
        async with await open_store(url) as store:
            flow = Flow(store, [queued_run])
            return [
                (await flow.start(queued_run, 0.01, queue="ordered", priority=p)).run_id
                for p in priorities
            ]

    async def wait(run_ids: list[str]) -> None:
        async with await open_store(url) as store:
            await _all_done(store, run_ids)

    run_ids = asyncio.run(queue_them())
    with fleet(url, ledger, "ordered", workers=2):
        asyncio.run(wait(run_ids))
    started = [row[1] for row in read_ledger(ledger) if row[0] == "start"]
    order = sorted(range(len(priorities)), key=lambda n: (priorities[n], n))
    assert started == [run_ids[n] for n in order]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dedup_id_refuses_a_second_start_while_the_first_lives(
    backend: str, tmp_path: Path
) -> None:
    """Like DBOS: a start with the dedup id of a live run of the queue raises
    `QueueDeduplicated` and records nothing; once that run ended, the id is free again."""
    url, ledger = _url(backend, tmp_path), tmp_path / "ledger"

    async def first() -> str:
        async with await open_store(url) as store:
            flow = Flow(store, [queued_run])
            run = await flow.start(queued_run, 0.01, queue="emails", dedup_id="user-7")
            again = await flow.start(
                queued_run, 0.01, run_id=run.run_id, queue="emails", dedup_id="user-7"
            )
            assert again.run_id == run.run_id  # the same start again is idempotent
            with pytest.raises(QueueDeduplicated) as refused:
                await flow.start(
                    queued_run, 0.01, run_id="second", queue="emails", dedup_id="user-7"
                )
            assert (refused.value.queue_name, refused.value.dedup_id) == ("emails", "user-7")
            assert await store.get_runs(["second"]) == [None]
            [summary] = await store.get_runs([run.run_id])
            assert summary is not None and summary.dedup_id == "user-7"
            return run.run_id

    async def after(run_id: str) -> None:
        async with await open_store(url) as store:
            await _all_done(store, [run_id])
            flow = Flow(store, [queued_run])
            later = await flow.start(
                queued_run, 0.01, run_id="third", queue="emails", dedup_id="user-7"
            )
            assert later.status == "pending"

    run_id = asyncio.run(first())
    with fleet(url, ledger, "emails", workers=1):
        asyncio.run(after(run_id))


async def _prepare(url: str) -> None:
    store = await open_store(url)
    await store.close()


def test_an_empty_queue_name_is_a_usage_error(tmp_path: Path) -> None:
    """`runfold worker --queue ""` exits 2 naming the option, before serving anything."""
    runfold = Path(sys.executable).with_name("runfold")
    store = f"sqlite:///{tmp_path / 'q.db'}"
    finished = subprocess.run(
        [
            str(runfold),
            "worker",
            "--app",
            "tests.support.queue_workflows",
            "--queue",
            "",
            "--store",
            store,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 2, finished
    assert "--queue" in finished.stderr and "must not be empty" in finished.stderr
