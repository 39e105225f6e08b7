"""PostgreSQL benchmarks: appends on one connection against a raw psycopg loop and
`eventsourcing`'s PostgreSQL recorder, and 8 concurrent writers against 8 raw connections.

The server is `RUNFOLD_BENCH_POSTGRES_DSN` (set by `python -m benchmarks --postgres DSN`),
else the local one on 127.0.0.1:5432; without a server these benchmarks report nothing. Every
contender writes into a schema of its own, dropped afterwards, with the server's default
durability (`synchronous_commit=on`). Contenders take turns, one timed run each per round, so
that a machine busy with other work slows them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from benchmarks.harness import Measurement, Result
from benchmarks.sqlite import _index_after
from benchmarks.workloads import PAYLOAD_BYTES, T0
from runfold import CreateRun, LogRecorded, RunIndex, StartRun, decide, encode_event
from runfold.stores import PostgresStore

__all__ = ["bench_postgres_append", "bench_postgres_concurrency"]

WRITERS = 8
_EVENT = LogRecorded(level="info", message="x" * PAYLOAD_BYTES)


def _interleaved(
    contenders: dict[str, Callable[[], None]], *, units: float, repeats: int
) -> dict[str, Measurement]:
    """Warm each contender up once, then time `repeats` rounds in which each runs once."""
    for work in contenders.values():
        work()
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, work in contenders.items():
            start = time.perf_counter()
            work()
            rates[name].append(units / (time.perf_counter() - start))
    return {
        name: Measurement(
            median=statistics.median(found), low=min(found), high=max(found), repeats=repeats
        )
        for name, found in rates.items()
    }


def _dsn() -> str:
    return os.environ.get(
        "RUNFOLD_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
    )


@contextlib.contextmanager
def _schema() -> Iterator[str]:
    """A fresh schema on the server, dropped afterwards."""
    name = f"runfold_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(_dsn(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def _server() -> str | None:
    """The server's version, or None (said on stderr) when there is no server."""
    try:
        with psycopg.connect(_dsn(), connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:
        print(f"  no PostgreSQL server at {_dsn()} ({exc}); skipped", file=sys.stderr)
        return None
    assert row is not None
    return str(row[0])


@contextlib.contextmanager
def _raw_loop(
    loop: asyncio.AbstractEventLoop, schema: str, count: int, writers: int
) -> Iterator[Callable[[], None]]:
    """The floor: `writers` connections, each inserting `count` events one autocommit
    statement (one transaction) at a time."""
    _, _, payload = encode_event(_EVENT)
    conns = [
        loop.run_until_complete(psycopg.AsyncConnection.connect(_dsn(), autocommit=True))
        for _ in range(writers)
    ]
    loop.run_until_complete(
        conns[0].execute(
            f'CREATE TABLE "{schema}".events (run_id text, sequence integer, type text, '
            "payload bytea, PRIMARY KEY (run_id, sequence))"
        )
    )
    insert = f'INSERT INTO "{schema}".events VALUES (%s, %s, %s, %s)'
    rounds = [0]

    async def writer(conn: psycopg.AsyncConnection[Any], run_id: str) -> None:
        for sequence in range(1, count + 1):
            await conn.execute(insert, (run_id, sequence, "log", payload))

    async def all_writers() -> None:
        rounds[0] += 1
        await asyncio.gather(*(writer(c, f"raw-{rounds[0]}-{n}") for n, c in enumerate(conns)))

    def work() -> None:
        loop.run_until_complete(all_writers())

    try:
        yield work
    finally:
        for conn in conns:
            loop.run_until_complete(conn.close())


def _store_appends(
    loop: asyncio.AbstractEventLoop, store: PostgresStore, count: int, writers: int
) -> Callable[[], None]:
    """`writers` tasks, each making `count` single-event appends to a run of its own (created
    first, in the timed run: one append more per writer); indexes precomputed, so the store's
    own cost is what is timed."""
    rounds = [0]

    async def prepare(run_id: str) -> RunIndex:
        created = decide(
            None,
            StartRun(create=CreateRun(workflow_name="bench", input=b"")),
            now=T0,
            run_id=run_id,
        )
        index = _index_after(run_id, created.events)
        await store.append_if_sequence(run_id, 0, created.events, index=index, recorded_at=T0)
        return index

    async def writer(run_id: str, index: RunIndex) -> None:
        for sequence in range(2, count + 2):
            await store.append_if_sequence(run_id, sequence, [_EVENT], index=index, recorded_at=T0)

    async def all_writers() -> None:
        rounds[0] += 1
        run_ids = [f"run-{rounds[0]}-{n}" for n in range(writers)]
        indexes = await asyncio.gather(*(prepare(r) for r in run_ids))
        await asyncio.gather(*(writer(r, i) for r, i in zip(run_ids, indexes, strict=True)))

    def work() -> None:
        loop.run_until_complete(all_writers())

    return work


@contextlib.contextmanager
def _opened(loop: asyncio.AbstractEventLoop, schema: str, size: int) -> Iterator[PostgresStore]:
    """A store on `schema` with a pool of `size` connections, closed afterwards."""
    store = loop.run_until_complete(
        PostgresStore.open(_dsn(), schema=schema, pool_min=size, pool_max=size)
    )
    try:
        yield store
    finally:
        loop.run_until_complete(store.close())


@contextlib.contextmanager
def _eventsourcing_appends(schema: str, count: int) -> Iterator[Callable[[], None]]:
    """`eventsourcing`'s PostgreSQL recorder: one aggregate event saved per transaction."""
    from eventsourcing.application import Application

    from benchmarks.es_peer import WorkflowRun

    params = conninfo_to_dict(_dsn())
    application: Application[Any] = Application(
        env={
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": str(params.get("dbname", "postgres")),
            "POSTGRES_HOST": str(params.get("host", "127.0.0.1")),
            "POSTGRES_PORT": str(params.get("port", "5432")),
            "POSTGRES_USER": str(params.get("user", "postgres")),
            "POSTGRES_PASSWORD": str(params.get("password", "")),
            "POSTGRES_SCHEMA": schema,
        }
    )

    def work() -> None:
        aggregate = WorkflowRun(workflow_name="bench", input="")
        application.save(aggregate)
        for n in range(count):
            aggregate.create_step(f"s{n}", "log", "x" * PAYLOAD_BYTES)
            application.save(aggregate)

    try:
        yield work
    finally:
        application.close()


def bench_postgres_append(quick: bool) -> list[Result]:
    """Sequential single-event appends on one connection, against the raw psycopg loop and
    `eventsourcing`'s PostgreSQL recorder."""
    server = _server()
    if server is None:
        return []
    count = 200 if quick else 1_000
    repeats = 5 if quick else 9
    loop = asyncio.new_event_loop()
    try:
        with contextlib.ExitStack() as stack:
            raw = stack.enter_context(_raw_loop(loop, stack.enter_context(_schema()), count, 1))
            store = stack.enter_context(_opened(loop, stack.enter_context(_schema()), 1))
            contenders = {
                "raw psycopg (async): one INSERT per transaction": raw,
                "runfold PostgresStore.append_if_sequence": _store_appends(loop, store, count, 1),
            }
            with contextlib.suppress(ImportError):
                es_schema = stack.enter_context(_schema())
                contenders["eventsourcing PostgreSQL recorder: save one event"] = (
                    stack.enter_context(_eventsourcing_appends(es_schema, count))
                )
            rates = _interleaved(contenders, units=count, repeats=repeats)
    finally:
        loop.close()
    floor = rates["raw psycopg (async): one INSERT per transaction"].median
    peer = rates.get("eventsourcing PostgreSQL recorder: save one event")
    results = [
        Result(
            benchmark="postgres append",
            case=f"{name}, {count:,} sequential single-event appends, one connection",
            unit="appends/s",
            value=rate,
            anchor="raw psycopg loop (target ≥ 0.8×)",
            ratio=rate.median / floor,
            note=f"PostgreSQL {server}, synchronous_commit=on",
        )
        for name, rate in rates.items()
    ]
    if peer is not None:
        ours = rates["runfold PostgresStore.append_if_sequence"]
        results.append(
            Result(
                benchmark="postgres append",
                case="runfold PostgresStore.append_if_sequence against the eventsourcing recorder",
                unit="appends/s",
                value=ours,
                anchor="eventsourcing PostgreSQL recorder (target ≥ 1×)",
                ratio=ours.median / peer.median,
            )
        )
    return results


def bench_postgres_concurrency(quick: bool) -> list[Result]:
    """8 writers appending to distinct runs, against raw psycopg with 8 connections."""
    server = _server()
    if server is None:
        return []
    count = 100 if quick else 500
    repeats = 5 if quick else 9
    loop = asyncio.new_event_loop()
    try:
        with (
            _schema() as raw_schema,
            _schema() as schema,
            _raw_loop(loop, raw_schema, count, WRITERS) as raw,
            _opened(loop, schema, WRITERS) as store,
        ):
            rates = _interleaved(
                {
                    f"raw psycopg (async), {WRITERS} connections": raw,
                    f"runfold PostgresStore, {WRITERS} tasks": _store_appends(
                        loop, store, count, WRITERS
                    ),
                },
                units=count * WRITERS,
                repeats=repeats,
            )
    finally:
        loop.close()
    floor = rates[f"raw psycopg (async), {WRITERS} connections"].median
    return [
        Result(
            benchmark="postgres concurrency",
            case=f"{name}, {count:,} single-event appends each, distinct runs",
            unit="appends/s",
            value=rate,
            anchor=f"raw psycopg, {WRITERS} connections (target ≥ 0.8×)",
            ratio=rate.median / floor,
            note=f"PostgreSQL {server}"
            + (
                "; group commit: appends that wait share a transaction" if "runfold" in name else ""
            ),
        )
        for name, rate in rates.items()
    ]
