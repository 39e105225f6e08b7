"""Checks of worker leases (`WorkerLeases`), for stores that keep them.

A lease is taken, renewed while it holds and never once it lapsed (at its `lease_until`, to the
microsecond); leases list by worker id; `orphaned_runs` finds the live runs whose owner holds no
lease, and nothing else; racing claims of one run leave one owner. A store that is not a
`WorkerLeases` is a whole `EventStore` still: these checks are then not offered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import datetime, timedelta

import pytest

from runfold.conformance._core import Context, check
from runfold.conformance.builders import MINUTE, T0, created, kernel_summary, started, write
from runfold.handler import CommandHandler, Outcome
from runfold.kernel import (
    ClaimRun,
    CreateRun,
    Event,
    RunClaimed,
    RunCompleted,
    RunOwned,
    RunReleased,
    RunStarted,
    StartRun,
)
from runfold.stores.leases import WorkerLeases
from runfold.stores.protocol import EventStore

LEASE = timedelta(seconds=30)
"""The length of the leases the checks take."""
MICROSECOND = timedelta(microseconds=1)
RACERS = 8
"""Workers claiming one run at once in the race check."""


def _leases(store: EventStore) -> WorkerLeases:
    """`store` as a `WorkerLeases`; the check is not offered when it keeps no leases."""
    if not isinstance(store, WorkerLeases):
        pytest.skip("not offered: leases (the store is no WorkerLeases)")
    return store


async def _lease_of(held: WorkerLeases, worker_id: str) -> tuple[datetime, datetime] | None:
    """The worker's `(lease_until, started_at)` as `list_leases` has it, or None."""
    found = [lease for lease in await held.list_leases() if lease.worker_id == worker_id]
    assert len(found) <= 1, f"list_leases lists worker {worker_id!r} {len(found)} times"
    return (found[0].lease_until, found[0].started_at) if found else None


@check("leases")
async def lease_renewed_until_it_lapses(ctx: Context, store: EventStore) -> None:
    """`renew_lease` takes a lease a worker does not hold (started at `now`) and moves one that
    still holds at `now`, keeping its start, up to 1 µs before its end; at its `lease_until` or
    later it returns False and changes nothing, ever again; `drop_lease` forgets it (dropping
    again is harmless) and the worker may take a new one."""
    held = _leases(store)
    assert await held.list_leases() == [], "a new store holds leases"
    assert await held.renew_lease("w", lease_until=T0 + LEASE, now=T0), "a new lease refused"
    assert await _lease_of(held, "w") == (T0 + LEASE, T0)
    later = T0 + LEASE - MICROSECOND
    assert await held.renew_lease("w", lease_until=later + LEASE, now=later), (
        "a lease 1 µs before its end was not renewed"
    )
    assert await _lease_of(held, "w") == (later + LEASE, T0), "renewal did not keep the start"
    end = later + LEASE
    for now in (end, end + MICROSECOND, end + LEASE, end + 10 * LEASE):
        renewed = await held.renew_lease("w", lease_until=now + LEASE, now=now)
        assert not renewed, f"a lease that lapsed at {end} was renewed at {now}"
        assert await _lease_of(held, "w") == (end, T0), "a refused renewal changed the lease"
    await held.drop_lease("w")
    assert await held.list_leases() == [], "drop_lease left the lease"
    await held.drop_lease("w")
    await held.drop_lease("never-held")
    assert await held.renew_lease("w", lease_until=end + 2 * LEASE, now=end + LEASE), (
        "a dropped worker could not take a new lease"
    )
    assert await _lease_of(held, "w") == (end + 2 * LEASE, end + LEASE)


@check("leases")
async def leases_listed_by_worker_id(ctx: Context, store: EventStore) -> None:
    """`list_leases` lists every lease once, lapsed ones included, by worker id in code point
    order (non-ASCII ids too), each with the `lease_until` and `started_at` it was given in
    UTC; renewing one worker's lease or dropping it leaves the others as they were."""
    held = _leases(store)
    workers = ["b", "a", "ü-😀", "Z", "a-2", "中"]
    for number, worker in enumerate(workers):
        start = T0 + number * MINUTE
        assert await held.renew_lease(worker, lease_until=start + LEASE, now=start)
    expected = {w: (T0 + n * MINUTE + LEASE, T0 + n * MINUTE) for n, w in enumerate(workers)}
    listed = await held.list_leases()
    assert [lease.worker_id for lease in listed] == sorted(workers)
    assert {lease.worker_id: (lease.lease_until, lease.started_at) for lease in listed} == (
        expected
    )
    assert all(lease.lease_until.utcoffset() == timedelta(0) for lease in listed)
    now = T0 + 2 * MINUTE  # the leases of "b" and "a" lapsed; the others hold
    assert await held.renew_lease("Z", lease_until=now + LEASE, now=now)
    expected["Z"] = (now + LEASE, expected["Z"][1])
    await held.drop_lease("a")
    del expected["a"]
    listed = await held.list_leases()
    assert {lease.worker_id: (lease.lease_until, lease.started_at) for lease in listed} == (
        expected
    )


def _claimed(owner: str, epoch: int = 1, displaced: str | None = None) -> RunClaimed:
    return RunClaimed(owner_id=owner, epoch=epoch, displaced=displaced)


async def _owned_runs(store: EventStore) -> dict[str, str | None]:
    """Runs of every kind `orphaned_runs` must tell apart, and their owner (None: nobody)."""
    runs: list[tuple[str, tuple[Event, ...], str | None]] = [
        ("held", (*started(), _claimed("holder")), "holder"),
        ("lapsed", (*started(), _claimed("lapser")), "lapser"),
        ("ghost", (*started(), _claimed("ghost")), "ghost"),
        ("other-wf", (created("other"), RunStarted(), _claimed("ghost")), "ghost"),
        ("pending", (created(), _claimed("ghost")), "ghost"),
        ("free", started(), None),
        ("released", (*started(), _claimed("ghost"), RunReleased(owner_id="ghost", epoch=1)), None),
        ("ended", (*started(), _claimed("ghost"), RunCompleted(output=b"")), None),
        (
            "taken-over",
            (*started(), _claimed("lapser"), _claimed("holder", 2, displaced="lapser")),
            "holder",
        ),
    ]
    # Each run last updated a minute after the one before: "held" first, "taken-over" last.
    for number, (run_id, events, _) in enumerate(runs):
        await write(store, run_id, *events, at=T0 + number * MINUTE)
    return {run_id: owner for run_id, _, owner in runs}


@check("leases")
async def orphaned_runs_are_live_runs_without_a_lease(ctx: Context, store: EventStore) -> None:
    """`orphaned_runs(now)` lists exactly the live runs (pending or not) whose owner holds no
    lease at `now`: its lease lapsed (at its `lease_until` exactly) or it never had one; not
    runs nobody owns, released ones, ended ones, ones whose owner's lease holds, nor one taken
    over by a worker with a lease. Oldest update first, at most `limit` (0: none), of
    `workflow_names` when given (an empty collection: none), each summary the kernel's."""
    held = _leases(store)
    owners = await _owned_runs(store)
    end = T0 + LEASE
    assert await held.renew_lease("holder", lease_until=end + LEASE, now=T0)
    assert await held.renew_lease("lapser", lease_until=end, now=T0)

    async def orphans(
        now: datetime, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[str]:
        found = await held.orphaned_runs(now, limit=limit, workflow_names=workflow_names)
        for summary in found:
            expected = await kernel_summary(store, summary.run_id)
            assert summary == expected, f"orphaned_runs gave {summary}, the kernel {expected}"
        return [summary.run_id for summary in found]

    unleased = ["ghost", "other-wf", "pending"]  # in update order
    assert await orphans(end - MICROSECOND) == unleased, "a run of a held lease, or none found"
    assert await orphans(end) == ["lapsed", *unleased], "a lease lapsed at its end not seen"
    assert await orphans(end + LEASE) == ["held", "lapsed", *unleased, "taken-over"]
    assert await orphans(end, limit=2) == ["lapsed", "ghost"], "limit not honoured"
    assert await orphans(end, limit=0) == []
    assert await orphans(end, workflow_names=["other"]) == ["other-wf"]
    assert await orphans(end, workflow_names={"wf", "nope"}) == ["lapsed", "ghost", "pending"]
    assert await orphans(end, workflow_names=[]) == []
    for run_id in await orphans(end + LEASE):
        assert owners[run_id] is not None, f"run {run_id!r}, owned by nobody, is an orphan"
    # A lease taken by the ghost worker adopts its runs; renewing the lapsed one changes nothing.
    assert await held.renew_lease("ghost", lease_until=end + LEASE, now=end)
    assert not await held.renew_lease("lapser", lease_until=end + LEASE, now=end)
    assert await orphans(end) == ["lapsed"]
    await held.drop_lease("holder")
    assert await orphans(end) == ["held", "lapsed", "taken-over"], "a dropped lease still holds"


async def _claim_race(store: EventStore, claims: list[ClaimRun]) -> list[Outcome | BaseException]:
    """`claims` of run "r" made at once, each through a `CommandHandler` of its own."""
    handlers = [CommandHandler(store, clock=lambda: T0 + MINUTE) for _ in claims]
    return await asyncio.gather(
        *(h.execute("r", claim) for h, claim in zip(handlers, claims, strict=True)),
        return_exceptions=True,
    )


def _one_winner(outcomes: list[Outcome | BaseException], claims: list[ClaimRun]) -> str:
    """The owner whose claim won: exactly one recorded its `RunClaimed`, the rest `RunOwned`."""
    winners = [o for o in outcomes if isinstance(o, Outcome)]
    assert len(winners) == 1, f"{len(winners)} of {len(claims)} racing claims succeeded"
    refusals = [o for o in outcomes if not isinstance(o, Outcome)]
    assert all(isinstance(o, RunOwned) for o in refusals), f"losers got {refusals!r}"
    [envelope] = winners[0].appended
    assert isinstance(envelope.event, RunClaimed), envelope.event
    return envelope.event.owner_id


@check("leases", requires=("concurrency",))
async def racing_claims_leave_one_owner(ctx: Context, store: EventStore) -> None:
    """8 workers claiming one free run at once, each through a `CommandHandler` of its own,
    record exactly one `RunClaimed`: one claim wins, the others are refused with `RunOwned`,
    and the run's summary names the winner; the same when 8 workers race to displace its
    owner once that owner's lease lapsed (one `RunClaimed` at the next epoch, `displaced` set),
    after which `orphaned_runs` no longer lists the run."""
    held = _leases(store)
    spec = CreateRun(workflow_name="wf", input=b"")
    await CommandHandler(store, clock=lambda: T0).execute("r", StartRun(create=spec))
    claims = [ClaimRun(owner_id=f"w{n}") for n in range(RACERS)]
    winner = _one_winner(await _claim_race(store, claims), claims)
    history = [e.event for e in await store.read("r")]
    assert [e for e in history if isinstance(e, RunClaimed)] == [_claimed(winner)]
    [summary] = await store.get_runs(["r"])
    assert summary is not None and summary.owner_id == winner
    # The winner's lease lapses (it never took one): the others race to take its run over.
    now = T0 + MINUTE
    assert [s.run_id for s in await held.orphaned_runs(now)] == ["r"]
    rivals = [f"v{n}" for n in range(RACERS)]
    for rival in rivals:
        assert await held.renew_lease(rival, lease_until=now + LEASE, now=now)
    takeovers = [ClaimRun(owner_id=rival, displacing=winner) for rival in rivals]
    successor = _one_winner(await _claim_race(store, takeovers), takeovers)
    claimed = [e for e in (e.event for e in await store.read("r")) if isinstance(e, RunClaimed)]
    assert claimed == [_claimed(winner), _claimed(successor, 2, displaced=winner)], claimed
    assert await kernel_summary(store, "r") == (await store.get_runs(["r"]))[0]
    assert await held.orphaned_runs(now) == [], "a run taken over is still an orphan"
