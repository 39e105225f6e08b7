"""Faults between a store and its database: in-doubt commits settled, deadlines kept.

PostgreSQL is tested through a proxy that cuts around commits.

`tests/support/fault_proxy.py` sits between the store and the real server and cuts a connection
before an append is sent, right after (before the server answers), or after the server answered (the
reply lost); or stops relaying altogether (a black hole). An append whose fate the cut left
unknown is settled by reading its run back: the tests check the store reports what the database
holds, never a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from runfold.conformance.builders import created, envelopes_for, index_after, log
from runfold.errors import CommitUnknown, SequenceConflict, StoreTimeout, StoreUnavailable
from runfold.events import Envelope
from runfold.stores import PostgresStore, SQLiteStore
from runfold.stores.postgres.connections import ReconnectingPool, _Backoff
from runfold.stores.sqlite.writer import Append, append_batch, settle_commit
from tests.conftest import T0
from tests.support.fault_proxy import Cut, FaultProxy
from tests.support.postgres_support import DSN, admin, schema_name

pytestmark = pytest.mark.postgres


def _upstream() -> tuple[str, int]:
    params = conninfo_to_dict(DSN)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


@pytest.fixture
def schema() -> Iterator[str]:
    admin()
    name = schema_name("faults")
    yield name
    admin().execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@contextlib.asynccontextmanager
async def proxied(schema: str, **options: Any) -> AsyncIterator[tuple[PostgresStore, FaultProxy]]:
    """A store on `schema` whose connections go through a fault proxy (migrated directly)."""
    await (await PostgresStore.open(DSN, schema=schema)).close()
    async with FaultProxy(_upstream()) as proxy:
        store = await PostgresStore.open(proxy.dsn(DSN), schema=schema, **options)
        try:
            yield store, proxy
        finally:
            proxy.heal()
            await store.close()


def stored(schema: str, run_id: str) -> list[tuple[Any, ...]]:
    """The run's stored events, read past the proxy: (sequence, type)."""
    return (
        admin()
        .execute(
            f'SELECT sequence, type FROM "{schema}".events WHERE run_id = %s ORDER BY sequence',
            (run_id,),
        )
        .fetchall()
    )


async def append_log(store: PostgresStore, run_id: str, message: str) -> list[Envelope]:
    """Append one log event at the run's head (read directly), creating the run first."""
    history = await store.read(run_id)
    head = len(history)
    events = [log(message)] if history else [created(), log(message)]
    index = index_after(history, envelopes_for(run_id, head, events, T0))
    return await store.append_if_sequence(run_id, head, events, index=index, recorded_at=T0)


def once(cut: Cut) -> Any:
    """A plan that cuts the next append at `cut`, and no other."""
    left = [cut]

    def plan() -> Cut | None:
        return left.pop() if left else None

    return plan


@pytest.mark.parametrize("cut", ["during", "after"])
async def test_an_append_whose_reply_is_lost_reports_that_it_was_written(
    schema: str, cut: Cut
) -> None:
    async with proxied(schema) as (store, proxy):
        events = [created(), log("a")]
        index = index_after([], envelopes_for("r", 0, events, T0))
        proxy.plan = once(cut)
        written = await store.append_if_sequence("r", 0, events, index=index, recorded_at=T0)
        assert proxy.cuts[cut] == 1
        assert [e.sequence for e in written] == [1, 2]
        assert written == await store.read("r")  # positions as stored
        proxy.plan = once(cut)
        [third] = await append_log(store, "r", "b")
        assert (third.sequence, stored(schema, "r")[-1]) == (3, (3, "log_recorded"))


async def test_an_append_cut_before_it_was_sent_is_not_written_and_says_so(schema: str) -> None:
    async with proxied(schema) as (store, proxy):
        await append_log(store, "r", "a")
        proxy.plan = once("before")
        with pytest.raises(StoreUnavailable) as raised:
            await append_log(store, "r", "b")
        assert not isinstance(raised.value, CommitUnknown)
        assert proxy.cuts["before"] == 1 and len(stored(schema, "r")) == 2
        assert [e.sequence for e in await append_log(store, "r", "b")] == [3]


async def test_a_group_commit_cut_after_it_committed_settles_every_append(schema: str) -> None:
    async with proxied(schema, pool_max=2) as (store, proxy):
        runs = [f"r{n:02}" for n in range(12)]
        for run_id in runs:
            await append_log(store, run_id, "a")
        proxy.plan = lambda: "after"
        outcomes = await asyncio.gather(
            *(append_log(store, run_id, "b") for run_id in runs), return_exceptions=True
        )
        proxy.plan = lambda: None
        assert sum(proxy.cuts.values()) >= 2  # several transactions, each cut after it committed
        for run_id, outcome in zip(runs, outcomes, strict=True):
            assert not isinstance(outcome, BaseException), outcome
            assert [e.sequence for e in outcome] == [3] and len(stored(schema, run_id)) == 3


async def test_a_stale_append_in_doubt_is_a_conflict_not_a_success(schema: str) -> None:
    async with proxied(schema) as (store, proxy):
        await append_log(store, "r", "a")
        history = await store.read("r")
        await append_log(store, "r", "moved")  # another writer moved the head meanwhile
        events = [log("stale")]
        index = index_after(history, envelopes_for("r", 2, events, T0))
        proxy.plan = once("during")
        with pytest.raises(SequenceConflict) as raised:
            await store.append_if_sequence("r", 2, events, index=index, recorded_at=T0)
        assert raised.value.actual == 3


async def test_a_silent_server_ends_every_call_within_its_deadline(schema: str) -> None:
    async with proxied(schema, call_timeout=1.0, timeout=1.0) as (store, proxy):
        await append_log(store, "r", "a")
        history = await store.read("r")
        proxy.black_hole()
        started = time.monotonic()
        with pytest.raises(StoreTimeout):
            await store.read("r")
        assert time.monotonic() - started < 2.0
        events = [log("b")]
        index = index_after(history, envelopes_for("r", 2, events, T0))
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as raised:
            await store.append_if_sequence("r", 2, events, index=index, recorded_at=T0)
        assert time.monotonic() - started < 2.0
        assert isinstance(raised.value, CommitUnknown | StoreTimeout), raised.value
        with store.timeout(0.3):
            started = time.monotonic()
            with pytest.raises(StoreTimeout):
                await store.head("r")
            assert time.monotonic() - started < 1.3
        proxy.heal()
        # The store comes back by itself once the server answers again.
        for _ in range(100):
            with contextlib.suppress(StoreUnavailable):
                assert await store.head("r") in (2, 3)
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the store did not come back")


async def test_an_append_on_a_read_only_server_is_unavailable(schema: str) -> None:
    await (await PostgresStore.open(DSN, schema=schema)).close()
    read_only = f"{DSN}?options=-c%20default_transaction_read_only%3Don"
    store = await PostgresStore.open(read_only, schema=schema, migrate=False)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            await append_log(store, "r", "a")
        assert "read-only" in str(raised.value)
    finally:
        await store.close()


async def test_sqlite_settles_a_commit_that_raised_by_reading_the_run_back(tmp_path: Any) -> None:
    path = str(tmp_path / "runs.db")
    await (await SQLiteStore.open(path)).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        events = [created(), log("a")]
        index = index_after([], envelopes_for("r", 0, events, T0))
        written = Append("r", 0, events, index, T0, None)
        outcomes = append_batch(conn, [written])
        assert not isinstance(outcomes[0], BaseException)
        failure = sqlite3.OperationalError("disk I/O error")
        # Committed, though COMMIT raised: the envelopes stand.
        assert settle_commit(conn, [written], outcomes, failure) == outcomes
        # Never written (its batch rolled back): not written, retry safe, not a guess.
        later = [log("b")]
        lost = Append("r", 2, later, index, T0, None)
        shown = envelopes_for("r", 2, later, T0)
        [outcome] = settle_commit(conn, [lost], [shown], failure)
        assert type(outcome) is StoreUnavailable
        refused = SequenceConflict("r", 0, 2)  # refused before the commit: as it was
        assert settle_commit(conn, [lost], [refused], failure) == [refused]
    finally:
        conn.close()


def test_the_store_s_pool_tries_a_lost_server_again_at_least_every_second() -> None:
    # psycopg_pool waits 1 s, 2 s, 4 s, 8 s … between attempts; the store's pool starts its
    # attempts with its own backoff through the one method it overrides, which must still be
    # psycopg_pool's.
    assert "_add_connection" in vars(AsyncConnectionPool)
    assert "_add_connection" in vars(ReconnectingPool)
    attempt = _Backoff(timeout=300.0)
    delays = []
    for _ in range(12):
        attempt.update_delay(0.0)
        delays.append(attempt.delay)
    assert delays[0] <= 0.11 and delays == sorted(delays) and max(delays) == 1.0
