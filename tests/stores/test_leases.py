"""Worker leases (`WorkerLeases`) on every store: renewal, lapse, and the runs left orphaned."""

from __future__ import annotations

import importlib
from datetime import timedelta
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import ClaimRun, CompleteRun, ReleaseRun, StartRun
from runfold.kernel import InvalidArgument, RunSummary
from runfold.stores import DueWork, EventStore, WorkerLeases
from runfold.testing import DelegatingStore
from tests.conftest import T0
from tests.support.rules_helpers import create

LEASE = timedelta(seconds=10)


def leases(store: EventStore) -> WorkerLeases:
    assert isinstance(store, WorkerLeases), f"{type(store).__name__} keeps no worker leases"
    return store


async def test_a_lease_is_taken_renewed_and_never_renewed_once_lapsed(store: EventStore) -> None:
    held = leases(store)
    assert await held.renew_lease("a", lease_until=T0 + LEASE, now=T0)
    assert await held.renew_lease("a", lease_until=T0 + 2 * LEASE, now=T0 + LEASE / 2)
    [lease] = await held.list_leases()
    assert (lease.worker_id, lease.lease_until, lease.started_at) == ("a", T0 + 2 * LEASE, T0)
    # At its end the lease has lapsed: renewing it fails and changes nothing.
    assert not await held.renew_lease("a", lease_until=T0 + 9 * LEASE, now=T0 + 2 * LEASE)
    [lease] = await held.list_leases()
    assert lease.lease_until == T0 + 2 * LEASE
    await held.drop_lease("a")
    assert await held.list_leases() == []
    await held.drop_lease("a")  # dropping again is harmless


async def test_leases_are_listed_by_worker_id(store: EventStore) -> None:
    held = leases(store)
    for worker in ("c", "a", "b"):
        assert await held.renew_lease(worker, lease_until=T0 + LEASE, now=T0)
    assert [lease.worker_id for lease in await held.list_leases()] == ["a", "b", "c"]


async def test_orphaned_runs_are_the_live_runs_of_lapsed_or_unknown_owners(
    store: EventStore,
) -> None:
    held = leases(store)
    handler = CommandHandler(store, clock=lambda: T0)
    for run_id, worker in (("r-a", "a"), ("r-b", "b"), ("r-ghost", "ghost"), ("r-done", "a")):
        await handler.execute(run_id, StartRun(create=create()))
        await handler.execute(run_id, ClaimRun(owner_id=worker))
    await handler.execute("r-done", CompleteRun(output=b""))
    await handler.execute("r-free", StartRun(create=create()))
    await handler.execute("r-released", StartRun(create=create()))
    await handler.execute("r-released", ClaimRun(owner_id="a"))
    await handler.execute("r-released", ReleaseRun(owner_id="a"))
    assert await held.renew_lease("a", lease_until=T0 + LEASE, now=T0)
    assert await held.renew_lease("b", lease_until=T0 + 2 * LEASE, now=T0)

    def ids(found: list[RunSummary]) -> set[str]:
        return {summary.run_id for summary in found}

    assert ids(await held.orphaned_runs(T0)) == {"r-ghost"}
    assert ids(await held.orphaned_runs(T0 + LEASE)) == {"r-ghost", "r-a"}
    assert ids(await held.orphaned_runs(T0 + 2 * LEASE)) == {"r-ghost", "r-a", "r-b"}
    assert len(await held.orphaned_runs(T0 + 2 * LEASE, limit=2)) == 2
    assert await held.orphaned_runs(T0 + 2 * LEASE, workflow_names=["other"]) == []
    orphan = (await held.orphaned_runs(T0 + LEASE, workflow_names=["wf"]))[0]
    assert orphan.owner_id in ("ghost", "a")
    # Taken over, a run is no orphan any more.
    await handler.execute("r-a", ClaimRun(owner_id="b", displacing="a"))
    assert ids(await held.orphaned_runs(T0 + LEASE)) == {"r-ghost"}


@pytest.mark.parametrize(
    ("worker_id", "lease_until", "now"),
    [
        ("", T0, T0),
        (1, T0, T0),
        ("\ud800", T0, T0),
        ("a\x00b", T0, T0),
        ("a", T0.replace(tzinfo=None), T0),
    ],
)
async def test_bad_lease_arguments_are_refused(
    store: EventStore, worker_id: object, lease_until: object, now: object
) -> None:
    with pytest.raises(InvalidArgument):
        await leases(store).renew_lease(worker_id, lease_until=lease_until, now=now)  # type: ignore[arg-type]


class CountingStore(DelegatingStore):
    """A `DelegatingStore` that counts the calls it passes on."""

    calls = 0

    async def pause(self) -> None:
        self.calls += 1


async def test_a_delegating_store_keeps_leases_when_its_inner_store_does(
    store: EventStore,
) -> None:
    wrapper = CountingStore(store)
    held = leases(wrapper)
    assert await held.renew_lease("a", lease_until=T0 + LEASE, now=T0)
    assert [lease.worker_id for lease in await held.list_leases()] == ["a"]
    assert await held.orphaned_runs(T0 + LEASE, limit=5) == []
    await held.drop_lease("a")
    assert await leases(store).list_leases() == []
    assert wrapper.calls == 4


async def test_a_delegating_store_hands_out_due_work_when_its_inner_store_does(
    store: EventStore,
) -> None:
    wrapper = CountingStore(store)
    assert isinstance(wrapper, DueWork)  # so a fleet's worker serves on the wrapper
    await CommandHandler(wrapper, clock=lambda: T0).execute("q", create())
    calls = wrapper.calls
    [due] = await wrapper.claim_due("w", T0, hold_until=T0 + LEASE, limit=5)
    assert (due.run_id, due.reason) == ("q", "queued")
    assert await wrapper.claim_due("v", T0, hold_until=T0 + LEASE, limit=5) == []  # held by w
    assert await wrapper.hold_dedup("emails", "order-1", "q", now=T0)
    assert not await wrapper.hold_dedup("emails", "order-1", "other", now=T0)
    assert wrapper.calls == calls + 4


async def test_a_delegating_store_keeps_no_leases_when_its_inner_store_does_not(
    tmp_path: Path,
) -> None:
    # The store of the docs' example, which keeps no leases (found by name, as the conformance
    # tests find it: the docs are no package of the type checker's).
    example = importlib.import_module("docs.examples.thirdparty.jsonl_store")
    async with await example.JsonlStore.open(tmp_path / "runs.jsonl") as inner:
        assert not isinstance(inner, WorkerLeases)
        assert not isinstance(DelegatingStore(inner), WorkerLeases)
        assert not isinstance(inner, DueWork)
        assert not isinstance(DelegatingStore(inner), DueWork)
