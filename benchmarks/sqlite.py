"""SQLite benchmarks: appends against the raw `sqlite3` floor and `eventsourcing`'s SQLite
recorder, group commit under 64 concurrent tasks, and read + fold of a long run from the file.

Every contender writes to a file in the same temporary directory with `synchronous=FULL` and WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import Measurement, Result, measure
from benchmarks.workloads import PAYLOAD_BYTES, T0, step_heavy_history
from runfold import (
    CreateRun,
    Envelope,
    LogRecorded,
    RunIndex,
    StartRun,
    decide,
    encode_event,
    project_run,
    run_index,
)
from runfold.stores import SQLiteStore

__all__ = ["bench_sqlite_append", "bench_sqlite_concurrency", "bench_sqlite_replay"]


def _raw_sqlite_loop(path: Path, count: int) -> Callable[[], None]:
    """The floor: one `BEGIN IMMEDIATE; INSERT; COMMIT` per event on a bare connection."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS events (run_id TEXT, sequence INTEGER, type TEXT, "
        "payload BLOB, PRIMARY KEY (run_id, sequence)) WITHOUT ROWID"
    )
    _, _, payload = encode_event(LogRecorded(level="info", message="x" * PAYLOAD_BYTES))
    rounds = [0]

    def work() -> None:
        rounds[0] += 1
        run_id = f"raw-{rounds[0]}"
        for sequence in range(1, count + 1):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?)", (run_id, sequence, "log", payload)
            )
            conn.execute("COMMIT")

    return work


def _log_appends(
    store: SQLiteStore, loop: asyncio.AbstractEventLoop, count: int, runs: int
) -> Callable[[], None]:
    """`count` single-event appends on each of `runs` runs (run created beforehand), made by
    `runs` concurrent tasks; indexes precomputed so the store's own cost is what is timed."""
    rounds = [0]
    event = LogRecorded(level="info", message="x" * PAYLOAD_BYTES)

    def prepare(run_id: str) -> RunIndex:
        created = decide(
            None,
            StartRun(create=CreateRun(workflow_name="bench", input=b"")),
            now=T0,
            run_id=run_id,
        )
        loop.run_until_complete(
            store.append_if_sequence(
                run_id,
                0,
                created.events,
                index=_index_after(run_id, created.events),
                recorded_at=T0,
            )
        )
        return _index_after(run_id, created.events)

    def work() -> None:
        rounds[0] += 1
        run_ids = [f"run-{runs}x{count}-{rounds[0]}-{n}" for n in range(runs)]
        indexes = [prepare(run_id) for run_id in run_ids]

        async def writer(run_id: str, index: RunIndex) -> None:
            for sequence in range(2, count + 2):
                await store.append_if_sequence(
                    run_id, sequence, [event], index=index, recorded_at=T0
                )

        async def all_writers() -> None:
            await asyncio.gather(*(writer(r, i) for r, i in zip(run_ids, indexes, strict=True)))

        loop.run_until_complete(all_writers())

    return work


def _index_after(run_id: str, events: Any) -> RunIndex:
    history = [
        Envelope(run_id=run_id, sequence=n, event=e, recorded_at=T0)
        for n, e in enumerate(events, start=1)
    ]
    return run_index(project_run(history))


def _eventsourcing_appends(path: Path, count: int) -> Callable[[], None]:
    """`eventsourcing`'s SQLite recorder: one aggregate event saved per transaction."""
    from eventsourcing.application import Application

    from benchmarks.es_peer import WorkflowRun

    application: Application[Any] = Application(
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}
    )

    def work() -> None:
        aggregate = WorkflowRun(workflow_name="bench", input="")
        application.save(aggregate)
        for n in range(count):
            aggregate.create_step(f"s{n}", "log", "x" * PAYLOAD_BYTES)
            application.save(aggregate)

    return work


def bench_sqlite_append(quick: bool) -> list[Result]:
    """Sequential single-event appends, `synchronous=FULL`, against the raw floor and the peer."""
    count = 100 if quick else 1_000
    repeats = 3 if quick else 7
    directory = Path(tempfile.mkdtemp(prefix="runfold-bench-sqlite-"))
    loop = asyncio.new_event_loop()
    try:
        store = loop.run_until_complete(SQLiteStore.open(directory / "runfold.db"))
        rates: dict[str, Measurement] = {}
        rates["raw sqlite3: BEGIN IMMEDIATE / INSERT / COMMIT"] = measure(
            _raw_sqlite_loop(directory / "raw.db", count), units=count, repeats=repeats
        )
        rates["runfold SQLiteStore.append_if_sequence"] = measure(
            _log_appends(store, loop, count, 1), units=count, repeats=repeats
        )
        with contextlib.suppress(ImportError):
            rates["eventsourcing SQLite recorder: save one event"] = measure(
                _eventsourcing_appends(directory / "es.db", count), units=count, repeats=repeats
            )
        loop.run_until_complete(store.close())
    finally:
        loop.close()
        shutil.rmtree(directory, ignore_errors=True)
    floor = rates["raw sqlite3: BEGIN IMMEDIATE / INSERT / COMMIT"].median
    return [
        Result(
            benchmark="sqlite append",
            case=f"{name}, {count:,} sequential single-event appends",
            unit="appends/s",
            value=rate,
            anchor="raw sqlite3 loop (target ≥ 0.8×)",
            ratio=rate.median / floor,
        )
        for name, rate in rates.items()
    ]


def bench_sqlite_concurrency(quick: bool) -> list[Result]:
    """64 tasks appending to distinct runs (group commit) against one sequential writer."""
    count = 20 if quick else 100
    repeats = 3 if quick else 5
    directory = Path(tempfile.mkdtemp(prefix="runfold-bench-sqlite-"))
    loop = asyncio.new_event_loop()
    results = []
    try:
        store = loop.run_until_complete(SQLiteStore.open(directory / "runfold.db"))
        baseline = None
        for tasks in (1, 8, 64):
            per_task = max(count * 8 // tasks, 10) if tasks > 1 else count * 4
            rate = measure(
                _log_appends(store, loop, per_task, tasks),
                units=per_task * tasks,
                repeats=repeats,
            )
            baseline = baseline or rate.median
            results.append(
                Result(
                    benchmark="sqlite concurrency",
                    case=f"{tasks} task(s) on distinct runs, single-event appends",
                    unit="appends/s",
                    value=rate,
                    anchor="1 task (target for 64: ≥ 3×)",
                    ratio=rate.median / baseline,
                    note="includes creating each run once (not timed separately)",
                )
            )
        loop.run_until_complete(store.close())
    finally:
        loop.close()
        shutil.rmtree(directory, ignore_errors=True)
    return results


def bench_sqlite_replay(quick: bool) -> list[Result]:
    """Read + fold a long run from the file, against `eventsourcing`'s SQLite replay."""
    from benchmarks.kernel import eventsourcing_replay

    size = 1_002 if quick else 25_000
    repeats = 3 if quick else 7
    directory = Path(tempfile.mkdtemp(prefix="runfold-bench-sqlite-"))
    loop = asyncio.new_event_loop()
    try:
        store = loop.run_until_complete(SQLiteStore.open(directory / "runfold.db"))
        history = step_heavy_history(size)
        loop.run_until_complete(
            store.append_if_sequence(
                "run-bench",
                0,
                [e.event for e in history],
                index=run_index(project_run(history)),
                recorded_at=T0,
            )
        )

        def ours() -> Any:
            return project_run(loop.run_until_complete(store.read("run-bench")))

        rates = {
            "runfold: SQLiteStore.read + project_run": measure(ours, units=size, repeats=repeats)
        }
        with contextlib.suppress(ImportError):
            rates["eventsourcing: SQLite recorder, repository.get"] = measure(
                eventsourcing_replay(size, "eventsourcing.sqlite"), units=size, repeats=repeats
            )
        loop.run_until_complete(store.close())
    finally:
        loop.close()
        shutil.rmtree(directory, ignore_errors=True)
    peer = rates.get("eventsourcing: SQLite recorder, repository.get")
    return [
        Result(
            benchmark="sqlite replay",
            case=f"{name}, {size:,} events",
            unit="events/s",
            value=rate,
            anchor="eventsourcing SQLite replay (target ≥ 10×)" if peer else None,
            ratio=rate.median / peer.median if peer else None,
        )
        for name, rate in rates.items()
    ]
