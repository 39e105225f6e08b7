"""`PostgresStore` specifics (docs/reference/stores.md): what the conformance kit misses.

Always against the real server (`tests/support/postgres_support.py`; under `CI=true` a missing
server fails these tests): opening and migrating (concurrently, and the refusals), races across
separate connections, the gap-safe feed under commits out of order, `subscribe`, a backend
killed mid-append, lost connections, corruption, hostile text, group commit, and a role without
DDL rights. The generic contract runs against PostgreSQL through the conformance kit
(`tests/stores/test_conformance.py`).

Races are made certain rather than likely: a blocker transaction on its own connection holds
the row, key or token every contender needs, the test waits until all of them queue behind it
(`pg_blocking_pids`), then lets them go at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.composite import CompositeInfo, register_composite

from runfold import CommandHandler, MemoryStore, open_store
from runfold.commands import (
    ClaimRun,
    CreateHook,
    CreateRun,
    CreateStep,
    RecordLog,
    SetAttributes,
    StartRun,
)
from runfold.conformance.builders import (
    created,
    envelopes_for,
    hook,
    index_after,
    kernel_summary,
    log,
    write,
)
from runfold.errors import (
    CorruptEvent,
    SequenceConflict,
    StoreClosed,
    StoreError,
    StoreOpenError,
    StoreUnavailable,
    TokenConflict,
)
from runfold.events import Envelope, Event, LogRecorded, RunCompleted, RunStarted
from runfold.kernel import HookHolder, RunIndex, correlation_id, project_run, run_index
from runfold.stores import PostgresStore
from runfold.stores.paging import encode_cursor
from runfold.stores.postgres import POSITIONS_PER_TRANSACTION, SCHEMA_VERSION
from runfold.stores.postgres.request import AppendRequest
from runfold.stores.postgres.schema import MIGRATIONS as _MIGRATIONS
from runfold.stores.postgres.wire import WireDumper
from runfold.stores.protocol import FeedSubscriber, SchemaMigrator
from runfold.stores.time_keys import time_key
from tests.conftest import T0, Clock
from tests.support.postgres_support import DSN, admin, schema_name

pytestmark = pytest.mark.postgres

APPLIED = [(n,) for n in range(1, SCHEMA_VERSION + 1)]
"""The `schema_version` rows of a schema migrated once: each migration applied once."""
ANYWHERE = 10.0
"""Seconds a test waits for what should happen at once before it fails."""

# --- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def schema() -> Iterator[str]:
    """A fresh schema name; the schema is dropped after the test. Skips the test (fails it
    under `CI=true`) without a server."""
    admin()
    name = schema_name("pg")
    yield name
    admin().execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@contextlib.asynccontextmanager
async def opened(schema: str, **options: Any) -> AsyncIterator[PostgresStore]:
    """A store on `schema`, closed afterwards."""
    store = await PostgresStore.open(DSN, schema=schema, **options)
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def stores(schema: str, count: int) -> AsyncIterator[list[PostgresStore]]:
    """`count` stores on `schema`, each with a pool (so a connection) of its own."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(opened(schema, pool_max=2)) for _ in range(count)]


@contextlib.asynccontextmanager
async def blocker() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection in an open transaction, rolled back at the end unless committed."""
    conn = await psycopg.AsyncConnection.connect(DSN)
    try:
        yield conn
    finally:
        await conn.rollback()
        await conn.close()


async def hold_key(conn: psycopg.AsyncConnection[Any], schema: str, run_id: str, at: int) -> None:
    """Take the events' primary key of `run_id`'s event `at` in `conn`'s transaction, writing
    nothing: an append of that event waits for the transaction, as behind an append of it."""
    events = f'"{schema}".events'
    await conn.execute(
        f"INSERT INTO {events} (run_id, sequence, type, schema_version, payload, recorded_at, "
        "position) VALUES (%s, %s, '', 0, '', 0, 0)",
        (run_id, at),
    )
    await conn.execute(f"DELETE FROM {events} WHERE run_id = %s AND sequence = %s", (run_id, at))


async def queued_behind(conn: psycopg.AsyncConnection[Any], count: int) -> list[int]:
    """Wait until `count` backends wait on `conn`'s transaction, directly or behind another
    waiter (row lock waiters queue behind the first one); their pids."""
    first = conn.info.backend_pid
    deadline = time.monotonic() + ANYWHERE
    while True:
        waiting = rows(
            "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity "
            "WHERE cardinality(pg_blocking_pids(pid)) > 0"
        )
        behind = {first}
        while grown := {pid for pid, blockers in waiting if behind & set(blockers)} - behind:
            behind |= grown
        behind.discard(first)
        if len(behind) >= count:
            return sorted(behind)
        assert time.monotonic() < deadline, f"only {len(behind)} of {count} queued"
        await asyncio.sleep(0.005)


async def prepared(
    store: PostgresStore, run_id: str, events: Sequence[Event]
) -> tuple[int, RunIndex]:
    """The run's head and the index rows the kernel derives after `events`."""
    history = await store.read(run_id)
    head = history[-1].sequence if history else 0
    return head, index_after(history, envelopes_for(run_id, head, events, T0))


def transactions(outcomes: Sequence[list[Envelope] | BaseException]) -> set[int]:
    """The transactions the appended envelopes among `outcomes` were written in."""
    return {
        e.position // POSITIONS_PER_TRANSACTION
        for outcome in outcomes
        if isinstance(outcome, list)
        for e in outcome
        if e.position is not None
    }


def rows(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    return admin().execute(sql, params).fetchall()


def split(
    outcomes: Sequence[list[Envelope] | BaseException],
) -> tuple[list[list[Envelope]], list[BaseException]]:
    won = [o for o in outcomes if isinstance(o, list)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    return won, lost


# --- opening and migrating ----------------------------------------------------------------------


async def test_open_migrates_once_and_every_table_of_runs_leads_with_run_id(
    schema: str,
) -> None:
    async with opened(schema) as store:
        await write(store, "r", created(), RunStarted())
    async with opened(schema) as store, opened(schema, migrate=False) as reader:
        assert isinstance(store, SchemaMigrator) and isinstance(store, FeedSubscriber)
        assert (store.schema_version, store.migrated_from) == (SCHEMA_VERSION, None)
        await store.migrate()  # idempotent
        assert store.migrated_from is None
        assert await reader.head("r") == 2
    assert rows(f'SELECT version FROM "{schema}".schema_version ORDER BY 1') == APPLIED
    leading = dict(
        rows(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND ordinal_position = 1",
            (schema,),
        )
    )
    assert leading.pop("schema_version") == "version"
    assert leading.pop("tokens") == "token"  # the global token index, keyed by token
    assert leading.pop("leases") == "worker_id"  # the workers' leases, keyed by worker
    assert leading.pop("queue_starts") == "queue_name"  # a queue's recent starts
    assert leading.pop("queue_dedups") == "queue_name"  # a queue's deduplication ids
    assert set(leading.values()) == {"run_id"}
    assert set(leading) == {"events", "runs", "hooks", "wakeups", "due_holds"}


async def test_a_schema_of_an_older_runfold_is_upgraded_and_keeps_its_runs(schema: str) -> None:
    """A schema left at each earlier version (the migrations up to it, as that runfold applied
    them) opens, is migrated, and its runs read and take appends as before."""
    for version in range(1, SCHEMA_VERSION):
        name = f"{schema}_v{version}"
        quoted = '"' + name + '"'
        try:
            admin().execute(f"CREATE SCHEMA {quoted}")
            admin().execute(
                f"CREATE TABLE {quoted}.schema_version (version integer PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for number in range(1, version + 1):
                admin().execute(_MIGRATIONS[number - 1].format(s=quoted))
                admin().execute(f"INSERT INTO {quoted}.schema_version VALUES ({number})")
            with pytest.raises(StoreOpenError, match="migrate"):
                await PostgresStore.open(DSN, schema=name, migrate=False)
            async with opened(name) as store:
                await write(store, "r", created(), RunStarted())
                outcomes = await asyncio.gather(
                    *(write(store, f"r{n}", created(), RunStarted()) for n in range(5)),
                )
                assert all(len(o) == 2 for o in outcomes)
                for _ in range(5):  # group commits of single events, as well
                    await asyncio.gather(*(write(store, f"r{k}", log()) for k in range(5)))
                assert [await store.head(f"r{k}") for k in range(5)] == [7] * 5
                assert await store.get_runs(["r"]) == [await kernel_summary(store, "r")]
            assert rows(f"SELECT version FROM {quoted}.schema_version ORDER BY 1") == APPLIED
        finally:
            admin().execute(f"DROP SCHEMA IF EXISTS {quoted} CASCADE")


async def test_concurrent_migrations_are_safe_and_idempotent(schema: str) -> None:
    async def migrate_by_open() -> None:
        async with opened(schema):
            pass

    async def migrate_by_call(store: PostgresStore) -> None:
        await store.migrate()

    await asyncio.gather(*(migrate_by_open() for _ in range(6)))
    async with stores(schema, 4) as some:
        await asyncio.gather(*(migrate_by_call(s) for s in some))
        await write(some[0], "r", created())
        assert await some[3].head("r") == 1
    assert rows(f'SELECT version FROM "{schema}".schema_version ORDER BY 1') == APPLIED


async def test_migrations_wait_for_each_other_on_the_advisory_lock(schema: str) -> None:
    async with blocker() as holder:
        await holder.execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"runfold migrate {schema}",)
        )
        opening = asyncio.gather(*(PostgresStore.open(DSN, schema=schema) for _ in range(3)))
        await queued_behind(holder, 3)
        assert rows("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []
        await holder.execute(
            "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (f"runfold migrate {schema}",)
        )
        for store in await opening:
            await store.close()
    assert rows(f'SELECT version FROM "{schema}".schema_version ORDER BY 1') == APPLIED


async def test_without_migrate_a_missing_schema_is_refused_and_left_alone(schema: str) -> None:
    with pytest.raises(StoreOpenError, match="migrate"):
        await PostgresStore.open(DSN, schema=schema, migrate=False)
    assert rows("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)) == []


async def test_a_schema_from_a_newer_runfold_is_refused(schema: str) -> None:
    async with opened(schema):
        pass
    admin().execute(
        f'INSERT INTO "{schema}".schema_version (version) VALUES (%s)', (SCHEMA_VERSION + 1,)
    )
    for migrate in (True, False):
        with pytest.raises(StoreOpenError, match="newer runfold"):
            await PostgresStore.open(DSN, schema=schema, migrate=migrate)


async def test_a_schema_that_is_not_runfold_s_is_refused(schema: str) -> None:
    admin().execute(f'CREATE SCHEMA "{schema}"; CREATE TABLE "{schema}".accounts (id int)')
    with pytest.raises(StoreOpenError, match="not a runfold schema"):
        await PostgresStore.open(DSN, schema=schema)
    assert rows(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ) == [("accounts",)]


async def test_an_unreachable_server_is_unavailable_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        await PostgresStore.open("postgresql://postgres@127.0.0.1:9/postgres", timeout=2)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
async def test_open_store_takes_the_schema_from_the_url(schema: str, scheme: str) -> None:
    params = conninfo_to_dict(DSN)  # whatever form the test DSN has
    host, port = params.get("host", "127.0.0.1"), params.get("port", "5432")
    user, dbname = params.get("user", "postgres"), params.get("dbname", "postgres")
    store = await open_store(f"{scheme}://{user}@{host}:{port}/{dbname}?schema={schema}")
    try:
        assert isinstance(store, PostgresStore)
        await write(store, "r", created())
    finally:
        await store.close()
    assert rows(f'SELECT run_id FROM "{schema}".runs') == [("r",)]


async def test_an_existing_pool_is_used_and_left_open(schema: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
        DSN, min_size=1, max_size=3, kwargs={"autocommit": True}, open=False
    )
    await pool.open()
    try:
        async with await PostgresStore.open(pool=pool, schema=schema) as store:
            await write(store, "r", created(), RunStarted())
        async with pool.connection() as conn:  # still open
            cursor = await conn.execute(f'SELECT head FROM "{schema}".runs')
            assert await cursor.fetchall() == [(2,)]
    finally:
        await pool.close()
    plain: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
        DSN, min_size=1, max_size=1, open=False
    )
    await plain.open()
    try:
        with pytest.raises(ValueError, match="autocommit"):
            await PostgresStore.open(pool=plain, schema=schema)
    finally:
        await plain.close()


async def test_a_role_without_ddl_rights_runs_on_a_migrated_schema(schema: str) -> None:
    role = f"runfold_app_{uuid.uuid4().hex[:8]}"
    async with opened(schema):
        pass  # migrated by a role that may
    admin().execute(
        f'CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA "{schema}" TO {role}; '
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO {role}'
    )
    try:
        as_app = make_conninfo(DSN, user=role)
        async with await PostgresStore.open(as_app, schema=schema) as store:
            handler = CommandHandler(store, clock=Clock())
            await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
            await handler.execute("r", CreateHook(hook_id="h", token="tok"))
            assert [e.sequence for e in await store.read_all()] == [1, 2, 3]
        with pytest.raises(StoreError):  # nor can it make a schema of its own
            await PostgresStore.open(as_app, schema=f"{schema}_own")
    finally:
        admin().execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


# --- races across separate connections ----------------------------------------------------------


async def test_writers_racing_on_one_head_one_wins_and_the_rest_see_the_true_head(
    schema: str,
) -> None:
    async with stores(schema, 6) as writers:
        await write(writers[0], "r", created(), RunStarted())
        batches = [[log(f"w{n}")] * (n + 1) for n in range(len(writers))]
        indexes = [(await prepared(w, "r", b))[1] for w, b in zip(writers, batches, strict=True)]
        async with blocker() as holder:
            await hold_key(holder, schema, "r", 3)  # the run's next event
            racing = asyncio.gather(
                *(
                    w.append_if_sequence("r", 2, b, index=i, recorded_at=T0)
                    for w, b, i in zip(writers, batches, indexes, strict=True)
                ),
                return_exceptions=True,
            )
            await queued_behind(holder, len(writers))
            await holder.commit()
            won, lost = split(await racing)
        [winner] = won
        head = 2 + len(winner)
        assert all(isinstance(e, SequenceConflict) for e in lost), lost
        assert {(e.expected, e.actual) for e in lost if isinstance(e, SequenceConflict)} == {
            (2, head)
        }
        assert await writers[1].read("r", after=2) == winner
        assert await writers[2].head("r") == head


async def test_creations_of_one_run_racing_make_one_run(schema: str) -> None:
    async with stores(schema, 6) as writers:
        batches = [[created(f"wf{n}"), *[log()] * n] for n in range(len(writers))]
        indexes = [index_after([], envelopes_for("new", 0, b, T0)) for b in batches]
        async with blocker() as holder:
            await holder.execute(
                f'INSERT INTO "{schema}".runs VALUES (%s, %s, %s, NULL, 0, 0, NULL, 0, %s, 0, 0, '
                "false, false)",
                ("new", "wf", "running", "{}"),
            )
            racing = asyncio.gather(
                *(
                    w.append_if_sequence("new", 0, b, index=i, recorded_at=T0)
                    for w, b, i in zip(writers, batches, indexes, strict=True)
                ),
                return_exceptions=True,
            )
            await queued_behind(holder, len(writers))
            await holder.rollback()
            won, lost = split(await racing)
        [winner] = won
        assert {(e.expected, e.actual) for e in lost if isinstance(e, SequenceConflict)} == {
            (0, len(winner))
        }
        assert len(lost) == len(writers) - 1
        [summary] = await writers[0].get_runs(["new"])
        assert summary is not None
        assert summary.workflow_name == f"wf{len(winner) - 1}"
        assert await writers[3].read("new") == winner


async def test_token_claims_racing_leave_one_holder(schema: str) -> None:
    async with stores(schema, 6) as writers:
        run_ids = [f"run-{n}" for n in range(len(writers))]
        for w, run_id in zip(writers, run_ids, strict=True):
            await write(w, run_id, created(), RunStarted())
        claims = [
            await prepared(w, r, [hook("h", "shared")])
            for w, r in zip(writers, run_ids, strict=True)
        ]
        async with blocker() as holder:
            await holder.execute(
                f'INSERT INTO "{schema}".tokens VALUES (%s, %s, %s, NULL)',
                (b"shared", "blocker", "h"),
            )
            racing = asyncio.gather(
                *(
                    w.append_if_sequence(r, head, [hook("h", "shared")], index=i, recorded_at=T0)
                    for w, r, (head, i) in zip(writers, run_ids, claims, strict=True)
                ),
                return_exceptions=True,
            )
            await queued_behind(holder, len(writers))
            await holder.rollback()
            outcomes = await racing
        won, lost = split(outcomes)
        [winner] = won
        holder_run = winner[0].run_id
        assert all(isinstance(e, TokenConflict) for e in lost), lost
        assert {(e.token, e.holder_run_id, e.holder_hook_id) for e in lost} == {  # type: ignore[attr-defined]
            ("shared", holder_run, "h")
        }
        assert await writers[0].find_hook("shared", now=T0) == HookHolder(
            run_id=holder_run, hook_id="h", retained_until=None
        )
        for run_id in run_ids:  # the losers wrote nothing
            assert await writers[1].head(run_id) == (3 if run_id == holder_run else 2)
        hooks = await writers[2].list_hooks(now=T0)
        assert [(h.run_id, h.hook_id) for h in hooks.items] == [(holder_run, "h")]


# --- the feed -----------------------------------------------------------------------------------


async def test_a_tailing_reader_sees_every_event_once_in_order_while_commits_come_out_of_order(
    schema: str,
) -> None:
    held = 5
    async with stores(schema, held + 2) as writers, opened(schema, feed_wait=0) as reader:
        for n in range(held):
            await write(writers[n], f"held-{n}", created(), RunStarted())
        expected = {(f"held-{n}", s) for n in range(held) for s in (1, 2)}
        seen: list[Envelope] = []
        done = asyncio.Event()

        async def tail() -> None:
            after = 0
            while not done.is_set() or len(seen) < len(expected):
                for envelope in await reader.read_all(after_position=after, limit=7):
                    assert envelope.position is not None and envelope.position > after
                    after = envelope.position
                    seen.append(envelope)
                await asyncio.sleep(0.002)

        tailing = asyncio.create_task(tail())
        async with contextlib.AsyncExitStack() as stack:
            # Appends held mid-transaction, after their events are written: each claims a
            # token a blocker holds uncommitted. Started one by one, so their transaction ids
            # rise in this order.
            holders, appends = [], []
            for n in range(held):
                holder = await stack.enter_async_context(blocker())
                token = f"tok-{n}"
                await holder.execute(
                    f'INSERT INTO "{schema}".tokens VALUES (%s, %s, %s, NULL)',
                    (token.encode(), "blocker", "h"),
                )
                head, index = await prepared(writers[n], f"held-{n}", [hook("h", token), log()])
                appends.append(
                    asyncio.create_task(
                        writers[n].append_if_sequence(
                            f"held-{n}",
                            head,
                            [hook("h", token), log()],
                            index=index,
                            recorded_at=T0,
                        )
                    )
                )
                await queued_behind(holder, 1)
                holders.append(holder)
                expected |= {(f"held-{n}", 3), (f"held-{n}", 4)}

            async def free_writer(store: PostgresStore, run_id: str) -> None:
                await write(store, run_id, created(), RunStarted())
                for _ in range(15):
                    await write(store, run_id, log())
                    await asyncio.sleep(random.random() / 500)

            free = [f"free-{n}" for n in range(2)]
            expected |= {(run_id, s) for run_id in free for s in range(1, 18)}
            freely = asyncio.gather(
                *(free_writer(writers[held + n], r) for n, r in enumerate(free))
            )
            await asyncio.sleep(0.05)
            assert not any(e.run_id.startswith("free") for e in seen)  # held back: younger
            for n in (3, 0, 4, 1, 2):  # commits out of the order the transactions began in
                await holders[n].rollback()
                await appends[n]
                await asyncio.sleep(0.01)
            await freely
        done.set()
        await asyncio.wait_for(tailing, ANYWHERE)

        keys = [(e.run_id, e.sequence) for e in seen]
        assert len(keys) == len(set(keys)) and set(keys) == expected
        assert seen == await reader.read_all(limit=10_000)


async def test_read_all_waits_for_older_transactions_then_serves_what_they_held_back(
    schema: str,
) -> None:
    async with opened(schema, feed_wait=0.2) as store, blocker() as older:
        await older.execute("SELECT pg_current_xact_id()")  # an older transaction, still open
        await write(store, "r", created())
        started = time.monotonic()
        assert await store.read_all() == []
        assert 0.15 < time.monotonic() - started < 2  # it waited, then gave up
        waiting = asyncio.create_task(store.read_all())
        await asyncio.sleep(0.05)
        await older.commit()
        assert [e.sequence for e in await waiting] == [1]  # served once the older one ended


async def test_subscribe_delivers_events_as_they_commit(schema: str) -> None:
    async with opened(schema) as writer, opened(schema) as listener:
        await write(writer, "before", created())
        start = (await writer.read_all())[-1].position
        assert start is not None
        received: list[Envelope] = []

        async def consume() -> None:
            # A minute between polls: only a notification can wake it in time.
            async with contextlib.aclosing(listener.subscribe(start, poll_interval=60)) as feed:
                async for envelope in feed:
                    received.append(envelope)
                    if len(received) == 6:
                        return

        consuming = asyncio.create_task(consume())
        await asyncio.sleep(0.1)  # it is waiting on LISTEN
        written = await write(writer, "r", created(), log())
        for n in range(4):
            await asyncio.sleep(0.05)
            written += await write(writer, "r", log(f"m{n}"))
        await asyncio.wait_for(consuming, ANYWHERE)
        assert received == written


# --- failures -----------------------------------------------------------------------------------


async def test_a_backend_killed_mid_append_leaves_no_partial_batch_and_the_store_recovers(
    schema: str,
) -> None:
    async with opened(schema) as store:
        await write(store, "r", created(), RunStarted())
        before = (await store.read("r"), await store.get_runs(["r"]), await store.read_all())
        batch = [log("a"), hook("h", "tok"), log("b")]
        head, index = await prepared(store, "r", batch)
        async with blocker() as holder:
            await holder.execute(
                f'INSERT INTO "{schema}".tokens VALUES (%s, %s, %s, NULL)',
                (b"tok", "blocker", "h"),
            )
            appending = asyncio.create_task(
                store.append_if_sequence("r", head, batch, index=index, recorded_at=T0)
            )
            [pid] = await queued_behind(holder, 1)  # inside append_events, events written
            admin().execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(StoreUnavailable):
                await appending
        assert (
            await store.read("r"),
            await store.get_runs(["r"]),
            await store.read_all(),
        ) == before
        assert await store.find_hook("tok", now=T0) is None
        assert rows(f'SELECT count(*) FROM "{schema}".events') == [(2,)]
        appended = await store.append_if_sequence("r", head, batch, index=index, recorded_at=T0)
        assert [e.sequence for e in appended] == [3, 4, 5]


async def test_a_backend_killed_mid_group_commit_writes_none_of_its_appends(schema: str) -> None:
    async with opened(schema) as store:
        runs = [f"r{n:02}" for n in range(10)]
        for run_id in runs:
            await write(store, run_id, created(), RunStarted())
        plans = {run_id: await prepared(store, run_id, [log(run_id)]) for run_id in runs}
        async with blocker() as holder:
            # The last run's next event is taken: the group commit that holds it waits there,
            # having written the appends to the runs before it.
            await hold_key(holder, schema, "r09", 3)
            appending = asyncio.gather(
                *(
                    store.append_if_sequence(r, head, [log(r)], index=index, recorded_at=T0)
                    for r, (head, index) in plans.items()
                ),
                return_exceptions=True,
            )
            [pid] = await queued_behind(holder, 1)
            admin().execute("SELECT pg_terminate_backend(%s)", (pid,))
            # Nothing of the cut batch is retried: it might have committed (a retry would block
            # behind the holder here).
            outcomes = dict(zip(runs, await asyncio.wait_for(appending, ANYWHERE), strict=True))
        lost = [r for r, o in outcomes.items() if isinstance(o, StoreUnavailable)]
        assert "r09" in lost and len(lost) > 1, outcomes  # a batch, not a lone append, was cut
        for run_id, outcome in outcomes.items():
            expected_head = 2 if run_id in lost else 3
            assert isinstance(outcome, StoreUnavailable | list), outcome
            assert await store.head(run_id) == expected_head
            assert len(await store.read(run_id)) == expected_head
            assert await store.get_runs([run_id]) == [await kernel_summary(store, run_id)]
        for run_id in lost:  # the store recovered: the same appends go through now
            head, index = plans[run_id]
            appended = await store.append_if_sequence(
                run_id, head, [log(run_id)], index=index, recorded_at=T0
            )
            assert [e.sequence for e in appended] == [3]


async def test_the_pool_recovers_when_every_connection_is_killed(schema: str) -> None:
    name = f"runfold-test-{uuid.uuid4().hex[:8]}"
    async with await PostgresStore.open(
        make_conninfo(DSN, application_name=name), schema=schema, pool_min=3, pool_max=3
    ) as store:
        await asyncio.gather(*(write(store, f"r{n}", created()) for n in range(3)))
        killed = rows(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        )
        assert killed and all(ok for (ok,) in killed)
        failures = 0
        for _ in range(10):  # a dead connection costs one call at most, then it is replaced
            try:
                assert await store.head("r0") == 1
            except StoreUnavailable:
                failures += 1
                await asyncio.sleep(0.05)
            else:
                break
        assert failures <= 3
        await write(store, "r0", log())
        assert await store.head("r0") == 2


async def test_a_corrupt_row_fails_its_run_only(schema: str) -> None:
    async with opened(schema) as store:
        handler = CommandHandler(store, clock=Clock())
        for run_id in ("a", "b"):
            await handler.execute(run_id, StartRun(create=CreateRun(workflow_name="wf", input=b"")))
            await handler.execute(run_id, CreateStep(step_id="s", step_name="n", input=b""))
            await handler.execute(run_id, RecordLog(level="info", message="two"))
        [(position,)] = rows(
            f'SELECT position FROM "{schema}".events WHERE run_id = %s AND sequence = 3', ("a",)
        )
        admin().execute(
            f'UPDATE "{schema}".events SET payload = %s WHERE run_id = %s AND sequence = 3',
            (b"\xff\x00", "a"),
        )
        with pytest.raises(CorruptEvent) as caught:
            await store.read("a")
        assert (caught.value.run_id, caught.value.sequence) == ("a", 3)
        with pytest.raises(CorruptEvent):
            await store.read_by_correlation("a", "s")
        with pytest.raises(CorruptEvent):
            await store.read_all()
        handler = CommandHandler(store, clock=Clock())  # nothing cached: it reads the run
        with pytest.raises(CorruptEvent):
            await handler.execute("a", RecordLog(level="info", message="three"))
        assert [e.sequence for e in await store.read("a", after=3)] == [4]
        assert await store.head("a") == 4
        assert [e.sequence for e in await store.read("b")] == [1, 2, 3, 4]
        outcome = await handler.execute("b", RecordLog(level="info", message="three"))
        assert [e.sequence for e in outcome.appended] == [5]
        after = await store.read_all(after_position=position)
        assert ("a", 3) not in {(e.run_id, e.sequence) for e in after}
        assert ("b", 5) in {(e.run_id, e.sequence) for e in after}


# --- text, group commit -------------------------------------------------------------------------


def request_fields(request: AppendRequest) -> tuple[Any, ...]:
    """The fields of `append_request` for `request`, as plain Python values."""
    summary, index = request.index.summary, request.index

    def key(moment: datetime | None) -> int | None:
        return None if moment is None else time_key(moment)

    claims = request.claims
    return (
        request.run_id,
        request.expected,
        [event_type for event_type, _, _ in request.encoded],
        [version for _, version, _ in request.encoded],
        [correlation_id(event) for event in request.events],
        [payload for _, _, payload in request.encoded],
        key(request.recorded_at),
        summary.workflow_name,
        summary.status,
        summary.parent_run_id,
        key(summary.created_at),
        key(summary.updated_at),
        key(summary.completed_at),
        summary.last_sequence,
        request.attributes,
        [claim.token.encode() for claim in claims],
        [claim.hook_id for claim in claims],
        [key(claim.retained_until) for claim in claims],
        [wakeup.kind for wakeup in index.wakeups],
        [wakeup.subject_id for wakeup in index.wakeups],
        [key(wakeup.due_at) for wakeup in index.wakeups],
        request.expected_position,
        summary.owner_id,
        summary.queue_name,
        summary.priority,
        summary.dedup_id,
    )


async def test_the_hand_encoded_request_is_what_psycopg_makes_of_the_composite(
    schema: str,
) -> None:
    memory = MemoryStore()
    handler = CommandHandler(memory, clock=Clock())
    create = CreateRun(
        workflow_name="wf-ü",
        input=b"",
        attributes={"k": "v"},
        parent_run_id="parent",
        deadline=T0 + timedelta(hours=1),
        queue_name="queue-ü",
        priority=2**31 - 1,
        dedup_id="dedup-ü",
    )
    await handler.execute("r", StartRun(create=create))
    await handler.execute("r", CreateHook(hook_id="h", token="tok-ü", retain_token_until=T0))
    await handler.execute("r", ClaimRun(owner_id="worker-ü"))
    history = await memory.read("r")
    rich = run_index(project_run(history))
    plain = run_index(project_run(history[:2]))
    logged = [e.event for e in history] + [LogRecorded(level="info", message="x" * 300)]
    requests = [
        AppendRequest("r", 3, [logged[-1]], rich, T0, 17),
        AppendRequest("r", 0, logged, rich, T0),
        AppendRequest("r", 2, [logged[-1]], plain, T0, None),
        AppendRequest("r", 5, (), plain, T0 + timedelta(days=1), 2**40),
    ]
    async with opened(schema) as store, await psycopg.AsyncConnection.connect(DSN) as conn:
        info = await CompositeInfo.fetch(conn, f'"{schema}".append_request')
        assert info is not None and len(info.field_names) == len(request_fields(requests[0]))
        register_composite(info, conn)
        factory = info.python_type
        assert factory is not None
        request_type = store._connections.request
        conn.adapters.register_dumper(request_type, WireDumper)
        for request in requests:
            ours, theirs = request_type(request.wire()), factory(*request_fields(request))
            cursor = await conn.execute("SELECT %b::text, %b::text", (ours, theirs))
            found = await cursor.fetchone()
            assert found is not None and found[0] == found[1], request.events


HOSTILE = [
    "r'); DROP TABLE events; --",
    'wf" OR "1"="1',
    "%s %(x)s {s} $1 $fn$ \\x00 \\",
    "ü-😀-\U0010ffff",
]
"""Ids and names (the kernel refuses control characters in those; values may hold any)."""


@pytest.mark.parametrize("schema_label", ["plain", 'we"ird sch; ema'])
async def test_hostile_text_round_trips_literally(schema_label: str) -> None:
    admin()
    schema = schema_name("pg") + schema_label
    try:
        async with opened(schema) as store:
            handler = CommandHandler(store, clock=Clock())
            for n, text in enumerate(HOSTILE):
                run_id = f"run {text}"
                create = CreateRun(workflow_name=text, input=text.encode())
                await handler.execute(run_id, StartRun(create=create))
                values = {text: text, f"k{n}": f"nul\x00\t\n{text}"}
                await handler.execute(run_id, SetAttributes(changes=values))
                await handler.execute(run_id, CreateHook(hook_id=f"h {text}", token=f"\x00{text}"))
                await handler.execute(
                    run_id, CreateStep(step_id=f"s {text}", step_name="n", input=b"")
                )
                [summary] = await store.get_runs([run_id])
                assert summary is not None
                assert (summary.workflow_name, dict(summary.attributes)) == (text, values)
                assert [s.run_id for s in (await store.list_runs(workflow_name=text)).items] == [
                    run_id
                ]
                assert await store.find_hook(f"\x00{text}", now=T0) == HookHolder(
                    run_id=run_id, hook_id=f"h {text}", retained_until=None
                )
                hooks = await store.list_hooks(run_id=run_id, now=T0)
                assert [h.hook_id for h in hooks.items] == [f"h {text}"]
                assert len(await store.read_by_correlation(run_id, f"s {text}")) == 1
                assert project_run(await store.read(run_id)).input == text.encode()
            # Keys PostgreSQL cannot hold match nothing; a forged cursor is data too.
            assert await store.read("nul\x00id") == []
            assert await store.head("nul\x00id") == 0
            assert await store.get_runs(["nul\x00id"]) == [None]
            forged = encode_cursor(time_key(T0), "q' OR '1'='1")
            assert (await store.list_runs(cursor=forged)).items == ()
            assert len((await store.list_runs(limit=100)).items) == len(HOSTILE)
    finally:
        admin().execute(f'DROP SCHEMA IF EXISTS "{schema.replace(chr(34), chr(34) * 2)}" CASCADE')


async def test_concurrent_appends_share_transactions_and_keep_their_own_outcomes(
    schema: str,
) -> None:
    async with opened(schema) as store, opened(schema) as other:
        await write(other, "held", created(), RunStarted(), hook("h", "taken"))
        for run_id in [*(f"r{n}" for n in range(30)), "thief"]:
            await write(store, run_id, created())
        plans = [await prepared(store, f"r{n}", [log(), log()]) for n in range(30)]
        stale = await prepared(store, "r3", [log()])
        thief = await prepared(store, "thief", [RunStarted(), hook("h2", "taken")])
        outcomes = await asyncio.gather(
            *(
                store.append_if_sequence(f"r{n}", head, [log(), log()], index=i, recorded_at=T0)
                for n, (head, i) in enumerate(plans)
            ),
            store.append_if_sequence("r3", stale[0] + 5, [log()], index=stale[1], recorded_at=T0),
            store.append_if_sequence(
                "thief",
                thief[0],
                [RunStarted(), hook("h2", "taken")],
                index=thief[1],
                recorded_at=T0,
            ),
            return_exceptions=True,
        )
        *appended, wrong_head, stolen = outcomes
        # r3's own appends may have gone first, in the same batch or not.
        assert isinstance(wrong_head, SequenceConflict) and wrong_head.actual in (1, 3)
        assert isinstance(stolen, TokenConflict) and stolen.holder_run_id == "held"
        assert all(isinstance(a, list) and [e.sequence for e in a] == [2, 3] for a in appended)
        assert len(transactions(appended)) < len(appended)  # they went together
        feed = await store.read_all(limit=10_000)
        assert [e.run_id for e in feed].count("r3") == 3 and await store.head("thief") == 1


async def test_single_event_appends_in_one_statement_write_what_append_events_would(
    schema: str,
) -> None:
    """A single-event append onto a run without hooks or wakeups skips `append_events`; where
    that statement writes nothing, the store says why or hands the append to the function."""
    deadline = T0 + timedelta(hours=1)
    async with opened(schema) as store:
        await write(store, "plain", created(), RunStarted())
        await write(store, "timed", created(deadline=deadline), RunStarted())
        for n in range(3):
            await write(store, "plain", log(f"p{n}"), at=T0 + timedelta(seconds=n))
            await write(store, "timed", log(f"t{n}"))
        # The last wakeup goes with a single event: the run had one, so the function clears it.
        await write(store, "timed", RunCompleted(output=b""), at=T0 + timedelta(minutes=5))
        for run_id in ("plain", "timed"):
            assert await store.get_runs([run_id]) == [await kernel_summary(store, run_id)]
        assert await store.due_wakeups(deadline + timedelta(days=1)) == []
        assert rows(f'SELECT count(*) FROM "{schema}".wakeups') == [(0,)]
        head, index = await prepared(store, "plain", [log("late")])
        with pytest.raises(SequenceConflict) as conflict:
            await store.append_if_sequence("plain", head - 1, [log()], index=index, recorded_at=T0)
        assert (conflict.value.expected, conflict.value.actual) == (head - 1, head)
        _, ghost = await prepared(store, "ghost", [created()])
        with pytest.raises(SequenceConflict) as conflict:
            await store.append_if_sequence("ghost", 4, [log()], index=ghost, recorded_at=T0)
        assert conflict.value.actual == 0
        feed = await store.read_all(limit=100)
        positions = [e.position or 0 for e in feed]
        assert positions == sorted(positions) and all(positions)
        assert [e.sequence for e in feed if e.run_id == "plain"] == list(range(1, head + 1))


async def test_group_commits_of_single_events_write_together_and_settle_doomed_appends(
    schema: str,
) -> None:
    """Queued single-event appends to runs without hooks or wakeups go together in one
    statement; appends queued for a run that expect the head it just left conflict with the
    head it is at; one the statement cannot write (the run still has a wakeup row) goes
    through `append_events`."""
    deadline = T0 + timedelta(hours=1)
    async with opened(schema) as store:
        runs = [f"r{n:02}" for n in range(20)]
        for run_id in runs:
            await write(store, run_id, created(), RunStarted())
        await write(store, "timed", created(deadline=deadline), RunStarted())
        # Each run's line belongs to a step of its own: its correlation id goes along too.
        plans = {run_id: await prepared(store, run_id, [log(run_id, run_id)]) for run_id in runs}
        timed = await prepared(store, "timed", [RunCompleted(output=b"")])
        assert not timed[1].wakeups and rows(f'SELECT count(*) FROM "{schema}".wakeups') == [(1,)]

        def append(run_id: str, head: int, index: RunIndex, event: Event) -> Any:
            return store.append_if_sequence(run_id, head, [event], index=index, recorded_at=T0)

        # The first appends take the free write slots; the rest queue, r00's rivals behind it.
        outcomes = await asyncio.gather(
            *(append(run_id, *plans[run_id], log(run_id, run_id)) for run_id in runs[1:]),
            append("r00", *plans["r00"], log("r00", "r00")),
            *(append("r00", *plans["r00"], log(f"rival {n}")) for n in range(3)),
            append("r05", plans["r05"][0] + 7, plans["r05"][1], log("far ahead")),
            append("timed", *timed, RunCompleted(output=b"")),
            return_exceptions=True,
        )
        *written, r00, rival0, rival1, rival2, ahead, completed = outcomes
        assert all(isinstance(o, list) and [e.sequence for e in o] == [3] for o in written)
        assert isinstance(r00, list) and [e.sequence for e in r00] == [3]
        for rival in (rival0, rival1, rival2):
            assert isinstance(rival, SequenceConflict) and (rival.expected, rival.actual) == (2, 3)
        assert isinstance(ahead, SequenceConflict) and ahead.actual in (2, 3)
        assert isinstance(completed, list) and [e.sequence for e in completed] == [3]
        assert len(transactions([*written, r00])) < len(runs)  # they went together
        for run_id in [*runs, "timed"]:
            assert await store.get_runs([run_id]) == [await kernel_summary(store, run_id)]
        for run_id in runs:
            (line,) = await store.read_by_correlation(run_id, run_id)
            assert (line.sequence, line.event) == (3, log(run_id, run_id))
        assert rows(f'SELECT count(*) FROM "{schema}".wakeups') == [(0,)]
        feed = await store.read_all(limit=1000)
        positions = [e.position or 0 for e in feed]
        assert positions == sorted(set(positions)) and len(feed) == 2 * 21 + 21


async def test_retained_token_past_its_deadline_gives_way_to_another_run(schema: str) -> None:
    async with opened(schema) as store:
        until = T0 + timedelta(minutes=1)
        await write(store, "old", created(), RunStarted(), hook("h", "tok", until))
        await write(store, "old", RunCompleted(output=b""))
        with pytest.raises(TokenConflict):
            await write(store, "new", created(), hook("h", "tok"), at=until - timedelta(seconds=1))
        await write(store, "new", created(), hook("h", "tok"), at=until)
        assert await store.find_hook("tok", now=until) == HookHolder(
            run_id="new", hook_id="h", retained_until=None
        )
        assert (await store.list_hooks(run_id="old", now=T0)).items == ()


async def test_close_writes_what_was_accepted_and_refuses_the_rest(schema: str) -> None:
    store = await PostgresStore.open(DSN, schema=schema)

    async def append(run_id: str) -> list[Envelope]:
        events = (created(), RunStarted(), log(run_id))
        index = index_after([], envelopes_for(run_id, 0, events, T0))
        return await store.append_if_sequence(run_id, 0, events, index=index, recorded_at=T0)

    tasks = [asyncio.create_task(append(f"w-{n}")) for n in range(30)]
    await asyncio.sleep(0)  # they start: one writes, the others queue for a group commit
    closing = asyncio.create_task(store.close())
    late = [asyncio.create_task(append(f"late-{n}")) for n in range(5)]
    outcomes = await asyncio.gather(*tasks, *late, return_exceptions=True)
    await closing
    assert all(isinstance(o, list) for o in outcomes[:30]), outcomes[:30]
    assert all(isinstance(o, StoreClosed) for o in outcomes[30:]), outcomes[30:]
    async with opened(schema) as reopened:
        for n, acked in enumerate(outcomes[:30]):
            assert await reopened.read(f"w-{n}") == acked
        assert await reopened.get_runs(["late-0"]) == [None]
