"""The PostgreSQL backend: every contender writes into a schema of its own on one server,
dropped afterwards, with the server's default durability (`synchronous_commit=on`).

The server is `RUNFOLD_BENCH_POSTGRES_DSN` (set by `python -m benchmarks --postgres DSN`), else
the local one on 127.0.0.1:5432; without a server the benchmarks that need one report nothing
for it (and say so on stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from benchmarks.harness import Target, Trial, opened
from benchmarks.store_alone import Append
from benchmarks.targets import (
    POSTGRES_8_WRITERS_VS_RAW,
    POSTGRES_APPEND_VS_EVENTSOURCING,
    POSTGRES_APPEND_VS_RAW,
)
from benchmarks.workloads import LOG_EVENT, NEW_RUN_EVENTS, T0, seed_run
from runfold import EventStore
from runfold.kernel import encode_event, run_index
from runfold.stores import PostgresStore
from runfold.stores.postgres.plain import plain_append
from runfold.stores.postgres.request import AppendRequest
from runfold.stores.postgres.schema import quote

__all__ = ["POSTGRES", "PostgresBackend", "dsn", "fresh_schema"]


def dsn() -> str:
    return os.environ.get(
        "RUNFOLD_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
    )


class PostgresBackend:
    name = "PostgreSQL"
    floor = "raw psycopg"
    parallel_writers = True
    append_vs_raw: Target | None = POSTGRES_APPEND_VS_RAW
    append_vs_hop: Target | None = None  # psycopg runs on the event loop: no hop
    append_vs_eventsourcing = POSTGRES_APPEND_VS_EVENTSOURCING
    distinct_vs_one: Mapping[int, Target] = {}
    distinct_vs_raw: Mapping[int, Target] = {8: POSTGRES_8_WRITERS_VS_RAW}
    replay_vs_eventsourcing: Target | None = None

    def __init__(self) -> None:
        self._version: str | None = None
        self._reported = False

    def version(self) -> str | None:
        if self._version is None and not self._reported:
            try:
                with psycopg.connect(dsn(), connect_timeout=3) as conn:
                    row = conn.execute("SHOW server_version").fetchone()
                assert row is not None
                self._version = str(row[0]).split(" ")[0]
            except psycopg.Error as exc:
                self._reported = True
                print(f"  no PostgreSQL server at {dsn()} ({exc}); skipped", file=sys.stderr)
        return self._version

    def describe(self) -> str:
        return f"PostgreSQL {self.version()} on {_where()}, synchronous_commit=on"

    @contextlib.contextmanager
    def raw_through_driver(
        self, loop: asyncio.AbstractEventLoop, *, count: int
    ) -> Iterator[Callable[[], None] | None]:
        yield None  # psycopg's async connection runs on the event loop itself

    @contextlib.contextmanager
    def store(
        self, loop: asyncio.AbstractEventLoop, *, connections: int = 1
    ) -> Iterator[EventStore]:
        with fresh_schema() as schema:
            opening = PostgresStore.open(
                dsn(), schema=schema, pool_min=connections, pool_max=connections
            )
            with opened(loop, opening) as store:
                yield store

    @contextlib.contextmanager
    def raw_inserts(
        self, loop: asyncio.AbstractEventLoop, *, writers: int, count: int, batch: int
    ) -> Iterator[Callable[[], None]]:
        _, _, payload = encode_event(LOG_EVENT)
        with fresh_schema() as schema:
            conns = [
                loop.run_until_complete(psycopg.AsyncConnection.connect(dsn(), autocommit=True))
                for _ in range(writers)
            ]
            loop.run_until_complete(
                conns[0].execute(
                    f'CREATE TABLE "{schema}".events (run_id text, sequence integer, '
                    "type text, payload bytea, PRIMARY KEY (run_id, sequence))"
                )
            )
            insert = f'INSERT INTO "{schema}".events VALUES (%s, %s, %s, %s)'
            runs = itertools.count(1)

            async def writer(conn: psycopg.AsyncConnection[Any], run_id: str) -> None:
                for first in range(1, count * batch + 1, batch):
                    if batch == 1:  # autocommit: the statement is the transaction
                        await conn.execute(insert, (run_id, first, "log", payload))
                        continue
                    rows = [(run_id, s, "log", payload) for s in range(first, first + batch)]
                    async with conn.transaction(), conn.cursor() as cursor:
                        await cursor.executemany(insert, rows)

            async def all_writers() -> None:
                round_number = next(runs)
                await asyncio.gather(
                    *(writer(c, f"raw-{round_number}-{n}") for n, c in enumerate(conns))
                )

            try:
                yield lambda: loop.run_until_complete(all_writers())
            finally:
                for conn in conns:
                    loop.run_until_complete(conn.close())

    @contextlib.contextmanager
    def append_statement(
        self, loop: asyncio.AbstractEventLoop, *, count: int
    ) -> Iterator[Trial | None]:
        # The statement `PostgresStore` sends for a single-event append onto a run without hook
        # claims or wakeups, with the parameters it would send, made once per round: the
        # statement's own server cost beside the floor's plain INSERT, without runfold's client.
        with fresh_schema() as schema:
            opening = PostgresStore.open(dsn(), schema=schema, pool_min=1, pool_max=1)
            with opened(loop, opening) as store:
                conn = loop.run_until_complete(
                    psycopg.AsyncConnection.connect(dsn(), autocommit=True)
                )
                statement = plain_append(quote(schema))
                rounds = itertools.count(1)
                parameters: dict[str, Any] = {}

                def prepare() -> None:
                    run_id = f"statement-{next(rounds)}"
                    snapshot = loop.run_until_complete(seed_run(store, run_id, NEW_RUN_EVENTS))
                    append = AppendRequest(
                        run_id, NEW_RUN_EVENTS, [LOG_EVENT], run_index(snapshot), T0
                    )
                    parameters.clear()
                    parameters.update(append.plain_parameters())

                async def statements() -> None:
                    async with conn.cursor() as cursor:
                        for head in range(NEW_RUN_EVENTS, NEW_RUN_EVENTS + count):
                            parameters["expected"] = head
                            await cursor.execute(statement, parameters)
                            row = await cursor.fetchone()
                            assert row is not None and row[0] >= 0, "the statement wrote nothing"

                try:
                    yield Trial(prepare=prepare, run=lambda: loop.run_until_complete(statements()))
                finally:
                    loop.run_until_complete(conn.close())

    @contextlib.contextmanager
    def store_transactions(
        self, loop: asyncio.AbstractEventLoop, workflow: Sequence[Append], count: int
    ) -> Iterator[Trial | None]:
        yield None  # one statement per append, its server cost read by the statement ceiling

    @contextlib.contextmanager
    def eventsourcing_env(self) -> Iterator[dict[str, str]]:
        params = conninfo_to_dict(dsn())
        with fresh_schema() as schema:
            yield {
                "PERSISTENCE_MODULE": "eventsourcing.postgres",
                "POSTGRES_DBNAME": str(params.get("dbname", "postgres")),
                "POSTGRES_HOST": str(params.get("host", "127.0.0.1")),
                "POSTGRES_PORT": str(params.get("port", "5432")),
                "POSTGRES_USER": str(params.get("user", "postgres")),
                "POSTGRES_PASSWORD": str(params.get("password", "")),
                "POSTGRES_SCHEMA": schema,
            }

    @contextlib.contextmanager
    def dbos_config(self) -> Iterator[dict[str, str]]:
        with fresh_schema() as schema:
            yield {"system_database_url": dsn(), "dbos_system_schema": schema}


@contextlib.contextmanager
def fresh_schema() -> Iterator[str]:
    """A fresh schema on the server, dropped afterwards."""
    name = f"runfold_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(dsn(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def _where() -> str:
    """The server's host and port, without credentials."""
    params = conninfo_to_dict(dsn())
    return f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"


POSTGRES = PostgresBackend()
