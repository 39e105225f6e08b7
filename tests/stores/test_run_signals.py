"""Run signals (`RunSignals`): waiters woken by work for the fleet and by a run's end.

On every store within a process; on PostgreSQL also across store instances (processes), through
`LISTEN`/`NOTIFY`. A wait that must wake is given a long timeout and asserted True; one that must
not is given a short one and asserted False: what is checked is whether it woke, never how fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from runfold import CommandHandler
from runfold.commands import ClaimRun, CompleteRun, StartRun
from runfold.stores import EventStore
from runfold.stores.postgres import PostgresStore
from runfold.stores.signals import RunSignals
from runfold.testing import DelegatingStore
from tests.conftest import T0
from tests.support.postgres_support import DSN, SUITE_SCHEMA, suite_store
from tests.support.rules_helpers import create

WOKEN = 30.0
"""Seconds a wait that must wake may take (it wakes at once; this only bounds a failure)."""
QUIET = 0.3
"""Seconds a wait that must not wake is given."""


def signals(store: object) -> RunSignals:
    assert isinstance(store, RunSignals), f"{type(store).__name__} offers no run signals"
    return store


async def started(waiting: asyncio.Future[bool]) -> asyncio.Future[bool]:
    await asyncio.sleep(0)  # the wait counts from its first step
    return waiting


async def test_a_run_that_ends_wakes_its_waiters_only(store: EventStore) -> None:
    handler = CommandHandler(store, clock=lambda: T0)
    for run_id in ("a", "b"):
        await handler.execute(run_id, StartRun(create=create()))
    board = signals(store)
    for_a = await started(asyncio.ensure_future(board.wait_for_end("a", WOKEN)))
    for_b = await started(asyncio.ensure_future(board.wait_for_end("b", QUIET)))

    await handler.execute("a", CompleteRun(output=b""))

    assert await for_a is True
    assert await for_b is False


async def test_an_unowned_live_run_is_work_and_an_owned_one_is_not(store: EventStore) -> None:
    handler = CommandHandler(store, clock=lambda: T0)
    board = signals(store)
    work = await started(asyncio.ensure_future(board.wait_for_work(WOKEN)))
    await handler.execute("queued", StartRun(create=create()))
    assert await work is True

    await handler.execute("queued", ClaimRun(owner_id="w1"))  # claimed: nobody else's work
    assert await board.wait_for_work(QUIET) is False


async def test_a_delegating_store_offers_its_inner_stores_signals(store: EventStore) -> None:
    wrapper = DelegatingStore(store)
    handler = CommandHandler(wrapper, clock=lambda: T0)
    waiting = await started(asyncio.ensure_future(signals(wrapper).wait_for_work(WOKEN)))
    await handler.execute("queued", StartRun(create=create()))
    assert await waiting is True


@pytest.fixture
async def two_postgres_stores() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one schema, as two processes would hold them."""
    first = await suite_store()
    second = await PostgresStore.open(DSN, schema=SUITE_SCHEMA, pool_max=4)
    try:
        yield first, second
    finally:
        await second.close()
        await first.close()


async def test_postgres_signals_cross_store_instances(
    two_postgres_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    writer, waiter = two_postgres_stores
    handler = CommandHandler(writer, clock=lambda: T0)
    await handler.execute("other", StartRun(create=create()))
    await handler.execute("mine", StartRun(create=create()))
    await handler.execute("mine", ClaimRun(owner_id="w1"))
    await handler.execute("other", ClaimRun(owner_id="w1"))
    # Listening from here on: the first wait starts the store's listener.
    await waiter.wait_for_work(QUIET)

    work = await started(asyncio.ensure_future(waiter.wait_for_work(WOKEN)))
    await handler.execute("queued", StartRun(create=create()))
    assert await work is True

    mine = await started(asyncio.ensure_future(waiter.wait_for_end("mine", WOKEN)))
    other = await started(asyncio.ensure_future(waiter.wait_for_end("never", QUIET * 3)))
    await handler.execute("mine", CompleteRun(output=b""))
    assert await mine is True
    assert await other is False


async def test_closing_a_store_wakes_its_waiters(store: EventStore) -> None:
    board = signals(store)
    waiting = await started(asyncio.ensure_future(board.wait_for_end("r", WOKEN)))
    await store.close()
    assert await waiting is True
