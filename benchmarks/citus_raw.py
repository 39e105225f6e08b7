"""What any store can reach through Citus on this machine: bare psycopg, no runfold.

Eight connections, each appending to a run of its own, one row per call, against a schema of
two small tables (`runs`, `events`, keyed as the store's) on a plain server and the same schema
distributed by run through the coordinator:

- `insert`: one single-row `INSERT` of an event, autocommit. Through the coordinator Citus
  plans it, routes it to the run's worker and commits it there in one phase: one round trip
  from the coordinator, one commit. The ceiling of a routed statement.
- `pushed`: a function doing that `INSERT`, distributed with the run id as its distribution
  argument and colocated with the tables, so that Citus sends the whole call to the run's
  worker (`create_distributed_function`). The ceiling of an append run on the worker.
- `append_on_worker`: the lead of running the whole append there: the head moved (checked) and
  the event inserted by one pushed-down call, its position from the worker's transaction id (so
  not one store-wide feed: see `docs/scaling.md`).
- `append_xact`: the same call inside a transaction that first takes a transaction id on the
  coordinator and passes it in as the position (`force_delegation`): what keeps one integer
  position.
- `append_routed`: the head moved and the event inserted by a function run on the coordinator,
  each statement routed to the worker, the position from the coordinator's transaction id: what
  `PostgresStore` did on a cluster before its one-statement append, without the store around it.
- `append_one`: the whole append as one `INSERT ... SELECT` of the event from the run's previous
  one, autocommit: the head checked by that event's presence (and, with the primary key, by
  the next one's absence), no runs row moved, the position from the coordinator's transaction
  id (Citus evaluates the function there and sends the value). Routed to the run's worker and
  committed there in one phase, as `insert` is: the ceiling of an append in one statement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

__all__ = ["SCHEMA_SQL", "RawSchema", "raw_appends"]

PAYLOAD = b"x" * 100
"""About the size of the store benchmark's log event."""

_APPEND = """CREATE FUNCTION {{s}}.{name}(p_run_id text, p_sequence integer, p_payload bytea
        {xact_argument}) RETURNS bigint LANGUAGE plpgsql AS $fn$
    DECLARE
        v_position bigint := coalesce({xact}, pg_current_xact_id()::text::bigint) * 1000000 + 1;
    BEGIN
        UPDATE {{s}}.runs SET head = p_sequence, head_position = v_position
        WHERE run_id = p_run_id AND head = p_sequence - 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'RF001', MESSAGE = 'sequence conflict';
        END IF;
        INSERT INTO {{s}}.events VALUES (p_run_id, p_sequence, p_payload, v_position);
        RETURN v_position;
    END $fn$"""
"""An append of one event: the run's head moved (checked), the event inserted, its position
from the transaction id `xact` (NULL: the id of the node that runs it)."""

SCHEMA_SQL = (
    "CREATE SCHEMA {s}",
    'CREATE TABLE {s}.runs (run_id text COLLATE "C" PRIMARY KEY, head integer NOT NULL, '
    "head_position bigint NOT NULL)",
    'CREATE TABLE {s}.events (run_id text COLLATE "C", sequence integer, payload bytea, '
    "position bigint NOT NULL, PRIMARY KEY (run_id, sequence))",
    """CREATE FUNCTION {s}.insert_event(p_run_id text, p_sequence integer, p_payload bytea)
    RETURNS bigint LANGUAGE plpgsql AS $fn$
    BEGIN
        INSERT INTO {s}.events VALUES (p_run_id, p_sequence, p_payload, p_sequence);
        RETURN p_sequence;
    END $fn$""",
    _APPEND.format(name="append_at", xact_argument=", p_xact bigint", xact="p_xact"),
    # The same, but not distributed: run on the coordinator, each statement routed.
    _APPEND.format(name="append_routed", xact_argument="", xact="NULL"),
)
"""The raw schema, one statement each; `{s}` is the quoted schema name."""

DISTRIBUTE_SQL = (
    "SELECT create_distributed_table('{s}.runs', 'run_id', colocate_with => 'none')",
    "SELECT create_distributed_table('{s}.events', 'run_id', colocate_with => '{s}.runs')",
    "SELECT create_distributed_function('{s}.insert_event(text,integer,bytea)', 'p_run_id', "
    "colocate_with => '{s}.runs')",
    "SELECT create_distributed_function('{s}.append_at(text,integer,bytea,bigint)', "
    "'p_run_id', colocate_with => '{s}.runs', force_delegation => true)",
)
"""What distributes the raw schema (`append_routed` stays on the coordinator)."""


class RawSchema:
    """The raw schema `name` on the server of `dsn`, distributed or not; dropped on exit."""

    def __init__(self, dsn: str, name: str, *, distributed: bool) -> None:
        self.dsn = dsn
        self.s = f'"{name}"'
        self._distributed = distributed

    def __enter__(self) -> RawSchema:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.s} CASCADE")
            for statement in SCHEMA_SQL:
                conn.execute(statement.format(s=self.s).encode())
            if self._distributed:
                # The function bodies name the schema: Citus must see it quoted as written.
                for statement in DISTRIBUTE_SQL:
                    conn.execute(statement.format(s=self.s).encode())
        return self

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.s} CASCADE")


Call = Callable[[psycopg.AsyncConnection[Any], str, int], Any]


def _calls(s: str) -> dict[str, Call]:
    async def insert(conn: psycopg.AsyncConnection[Any], run_id: str, n: int) -> None:
        await conn.execute(
            f"INSERT INTO {s}.events VALUES (%s, %s, %s, %s)", (run_id, n, PAYLOAD, n)
        )

    async def pushed(conn: psycopg.AsyncConnection[Any], run_id: str, n: int) -> None:
        await conn.execute(f"SELECT {s}.insert_event(%s, %s, %s)", (run_id, n, PAYLOAD))

    async def on_worker(conn: psycopg.AsyncConnection[Any], run_id: str, n: int) -> None:
        await conn.execute(f"SELECT {s}.append_at(%s, %s, %s, NULL)", (run_id, n, PAYLOAD))

    async def xact(conn: psycopg.AsyncConnection[Any], run_id: str, n: int) -> None:
        # One round trip: both statements in one simple query; the second's result is read.
        cursor = await conn.execute("BEGIN; SELECT pg_current_xact_id()::text::bigint")
        cursor.nextset()
        row = await cursor.fetchone()
        assert row is not None
        try:
            await conn.execute(
                f"SELECT {s}.append_at(%s, %s, %s, %s)", (run_id, n, PAYLOAD, row[0])
            )
        except BaseException:
            await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")

    async def one(conn: psycopg.AsyncConnection[Any], run_id: str, n: int) -> None:
        await conn.execute(
            f"INSERT INTO {s}.events SELECT e.run_id, e.sequence + 1, %s, "
            "pg_current_xact_id()::text::bigint * 1000000 + 1 "
            f"FROM {s}.events e WHERE e.run_id = %s AND e.sequence = %s",
            (PAYLOAD, run_id, n - 1),
        )

    async def routed(conn: psycopg.AsyncConnection[Any], run_id: str, n: int) -> None:
        await conn.execute(f"SELECT {s}.append_routed(%s, %s, %s)", (run_id, n, PAYLOAD))

    return {
        "insert": insert,
        "pushed": pushed,
        "append_on_worker": on_worker,
        "append_xact": xact,
        "append_routed": routed,
        "append_one": one,
    }


CASES = tuple(_calls("s"))
"""The raw cases, by name (see the module)."""


def raw_appends(
    loop: asyncio.AbstractEventLoop,
    schema: RawSchema,
    case: str,
    *,
    writers: int,
    count: int,
) -> tuple[Callable[[], object], Callable[[], object], Callable[[], object]]:
    """(prepare, run, close) of one raw case: `writers` connections, each `count` calls on a
    fresh run of its own (its runs row made untimed in `prepare`)."""
    call = _calls(schema.s)[case]
    conns: list[psycopg.AsyncConnection[Any]] = []
    rounds = _numbers()
    runs: list[str] = []

    async def prepare() -> None:
        if not conns:
            for _ in range(writers):
                # No server-side prepared statements: Citus pushes a call down when it plans it
                # with the run id's value.
                conns.append(
                    await psycopg.AsyncConnection.connect(
                        schema.dsn, autocommit=True, prepare_threshold=None
                    )
                )
        round_number = next(rounds)
        runs[:] = [f"{case}-{round_number}-{n}" for n in range(writers)]
        for conn, run_id in zip(conns, runs, strict=True):
            await conn.execute(f"INSERT INTO {schema.s}.runs VALUES (%s, 0, 0)", (run_id,))
            # The event `append_one` finds before the first append.
            await conn.execute(
                f"INSERT INTO {schema.s}.events VALUES (%s, 0, %s, 0)", (run_id, PAYLOAD)
            )

    async def writer(conn: psycopg.AsyncConnection[Any], run_id: str) -> None:
        for n in range(1, count + 1):
            await call(conn, run_id, n)

    async def run() -> None:
        await asyncio.gather(*(writer(c, r) for c, r in zip(conns, runs, strict=True)))

    async def close() -> None:
        for conn in conns:
            await conn.close()

    return (
        lambda: loop.run_until_complete(prepare()),
        lambda: loop.run_until_complete(run()),
        lambda: loop.run_until_complete(close()),
    )


def _numbers() -> Iterator[int]:
    n = 0
    while True:
        n += 1
        yield n
