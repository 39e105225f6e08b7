"""Checks of run signals (`RunSignals`), for stores that offer them.

A signal is a hint: a waiter may be woken for nothing, so the checks never ask a store to stay
silent. They ask what a fleet relies on: an append that ends a run wakes whoever waits for that
end, and an append that leaves a live run without an owner wakes a worker waiting for work,
within the same store object, well before the wait's own timeout. A store that is not a
`RunSignals` is a whole `EventStore` still: these checks are then not offered.
"""

from __future__ import annotations

import asyncio

import pytest

from runfold.conformance._core import Context, check
from runfold.conformance.builders import MINUTE, T0, started, write
from runfold.kernel import RunClaimed, RunCompleted
from runfold.stores.protocol import EventStore
from runfold.stores.signals import RunSignals

PATIENCE = 5.0
"""Seconds a check's wait may last: far beyond a signal's delivery, so a woken wait returns at
once and only a store that never signals reaches it (and then fails, not hangs)."""


def _signals(store: EventStore) -> RunSignals:
    """`store` as a `RunSignals`; the check is not offered when it offers none."""
    if not isinstance(store, RunSignals):
        pytest.skip("not offered: signals (the store is no RunSignals)")
    return store


async def _woken(wait: asyncio.Task[bool], what: str) -> None:
    """Assert that `wait` returns True: it was woken, not timed out."""
    woken = await wait
    assert woken, f"{what}: the wait ran out ({PATIENCE:g} s) without a signal"


@check("signals")
async def run_end_wakes_its_waiter(ctx: Context, store: EventStore) -> None:
    """`wait_for_end(run_id)`, waiting when an append ends the run, returns True (woken, not
    timed out); a second run's waiter, waiting all the while, is woken by that run's own end."""
    signals = _signals(store)
    await write(store, "ending", *started())
    await write(store, "other", *started())
    ending = asyncio.ensure_future(signals.wait_for_end("ending", PATIENCE))
    other = asyncio.ensure_future(signals.wait_for_end("other", PATIENCE))
    await asyncio.sleep(0)  # both waits have begun
    await write(store, "ending", RunCompleted(output=b""), at=T0 + MINUTE)
    await _woken(ending, "an append ended run 'ending'")
    await write(store, "other", RunCompleted(output=b""), at=T0 + MINUTE)
    await _woken(other, "an append ended run 'other'")


@check("signals")
async def ownerless_live_run_wakes_a_worker(ctx: Context, store: EventStore) -> None:
    """`wait_for_work` returns True (woken, not timed out) after an append leaves a live run
    without an owner, whether the worker was already waiting or begins to wait just after it
    (a worker between two waits misses nothing), and again for a later such append."""
    signals = _signals(store)
    await write(store, "early", *started())
    await _woken(asyncio.ensure_future(signals.wait_for_work(PATIENCE)), "work appended before")
    waiting = asyncio.ensure_future(signals.wait_for_work(PATIENCE))
    await asyncio.sleep(0)  # the wait has begun
    await write(store, "late", *started())
    await _woken(waiting, "work appended while a worker waited")
    owned = RunClaimed(owner_id="w", epoch=1)
    await write(store, "late", owned, at=T0 + MINUTE)  # now owned: no news for the fleet
    waiting = asyncio.ensure_future(signals.wait_for_work(PATIENCE))
    await asyncio.sleep(0)
    await write(store, "third", *started())
    await _woken(waiting, "a second run appended without an owner")
