"""When a step body may run: only once its attempt, and its worker's claim, are in the store.

The engine appends a step's start before its body runs (the durability contract of
`docs/reference/engine.md`). A drive that ran the next body while that append was still in flight
(pipelining the commit with the next step's work) would break the guarantees pinned here: a body
run for an append that then failed, a body of a run another worker claimed first, a body of a
worker whose lease lapsed. Each body below reads the store itself, through a handler of its own.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from runfold import CommandHandler, EventStore
from runfold.engine import Engine, Lease, StepInvocation
from runfold.errors import OwnershipLost, RunOwned, StoreUnavailable
from tests.conftest import Clock
from tests.engine.test_engine import CrashingStore, Scripted
from tests.engine.test_engine_commits import STEPS, add, sequential


def held(worker_id: str) -> Lease:
    """A lease this process holds (renewed now, for an hour)."""
    lease = Lease(worker_id)
    lease.renewed(time.monotonic() + 3600)
    return lease


async def test_each_body_runs_after_its_attempt_and_its_workers_claim_are_stored(
    store: EventStore, clock: Clock
) -> None:
    seen: list[tuple[str, str, int, str | None]] = []

    async def looks(invocation: StepInvocation) -> bytes:
        stored = await CommandHandler(store).snapshot(invocation.run_id)
        step = stored.steps[invocation.step_id]
        owner = stored.owner.owner_id if stored.owner is not None else None
        seen.append((invocation.step_id, step.status, step.attempt - invocation.attempt, owner))
        return invocation.input + b"+"

    engine = Engine(
        CommandHandler(store, clock=clock), Scripted(sequential, {"add": looks}), lease=held("a")
    )
    run = await engine.start("wf", b"", run_id="r")

    assert run.status == "completed" and run.output == b"start" + b"+" * STEPS
    assert seen == [(f"s{n}", "running", 0, "a") for n in range(STEPS)]


@pytest.mark.parametrize("after_write", [False, True], ids=["refused", "lost-ack"])
@pytest.mark.parametrize("failing", range(1, STEPS + 2))
async def test_no_body_runs_after_an_append_that_failed(
    store: EventStore, clock: Clock, failing: int, after_write: bool
) -> None:
    """Append N carries step N-1's start (the first, the run's creation with step 0's start):
    when it fails, that body never ran, and no outcome is recorded twice after recovery."""
    ran: list[str] = []

    async def counted(invocation: StepInvocation) -> bytes:
        ran.append(invocation.step_id)
        return await add(invocation)

    crashing = CrashingStore(store, failing, after_write=after_write)
    engine = Engine(
        CommandHandler(crashing, clock=clock, store_retry=None),
        Scripted(sequential, {"add": counted}),
    )
    with pytest.raises(StoreUnavailable, match="injected crash"):
        await engine.start("wf", b"", run_id="r")

    assert ran == [f"s{n}" for n in range(failing - 1)]


async def test_a_worker_whose_lease_lapsed_in_a_body_records_nothing_and_runs_no_more(
    store: EventStore, clock: Clock
) -> None:
    lease = held("a")
    ran: list[str] = []

    async def lapses(invocation: StepInvocation) -> bytes:
        ran.append(invocation.step_id)
        if invocation.step_id == "s2":
            lease.lapse("a-after-the-pause")  # paused past its lease, as this process sees it
        return await add(invocation)

    engine = Engine(
        CommandHandler(store, clock=clock), Scripted(sequential, {"add": lapses}), lease=lease
    )
    # Refused before anything is appended: by the lease's clock, or as a worker under a new id
    # facing its old claim.
    with pytest.raises((OwnershipLost, RunOwned)):
        await engine.start("wf", b"", run_id="r")

    assert ran == ["s0", "s1", "s2"]
    left = await CommandHandler(store).snapshot("r")
    assert left.steps["s2"].status == "running"  # its outcome was never appended
    assert "s3" not in left.steps
    assert left.owner is not None and left.owner.owner_id == "a"


async def test_of_two_workers_racing_for_a_run_only_the_claims_winner_runs_bodies(
    store: EventStore, clock: Clock
) -> None:
    ran: list[tuple[str, str]] = []

    def worker(name: str) -> Engine:
        async def body(invocation: StepInvocation) -> bytes:
            ran.append((name, invocation.step_id))
            await asyncio.sleep(0)
            return await add(invocation)

        return Engine(
            CommandHandler(store, clock=clock),
            Scripted(sequential, {"add": body}),
            lease=held(name),
        )

    queued = await Engine(CommandHandler(store, clock=clock), Scripted(sequential)).start(
        "wf", b"", run_id="r", queued=True
    )
    assert queued.status == "pending" and queued.owner is None
    outcomes = await asyncio.gather(
        worker("a").drive("r"), worker("b").drive("r"), return_exceptions=True
    )

    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, RunOwned | OwnershipLost) for o in refused), refused
    final = await CommandHandler(store).snapshot("r")
    assert final.status == "completed"
    winners = {name for name, _ in ran}
    assert len(winners) == 1, ran
    assert [step_id for _, step_id in ran] == [f"s{n}" for n in range(STEPS)]
