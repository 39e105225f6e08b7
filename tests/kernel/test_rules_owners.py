"""The ownership rules: one worker drives a run at a time, fenced by its claim's epoch.

Every test goes through `CommandHandler` over the `store` fixture, so the claims and releases
are encoded, appended, read back and replayed on every backend.
"""

from __future__ import annotations

import pytest

from runfold import CommandHandler
from runfold.commands import (
    ClaimRun,
    CompleteRun,
    CompleteStep,
    CreateHook,
    LazyStep,
    ReleaseRun,
    RequestCancel,
    StartStep,
)
from runfold.errors import OwnershipLost, RunOwned, TerminalState
from runfold.events import RunClaimed
from runfold.kernel import Ownership, project_run
from tests.conftest import Clock
from tests.support.rules_helpers import RUN, assert_rejected, kinds, run_in_status

LAZY = LazyStep(step_name="task", input=b"")


def owner(snapshot_owner: Ownership | None) -> tuple[str, int] | None:
    return None if snapshot_owner is None else (snapshot_owner.owner_id, snapshot_owner.epoch)


@pytest.mark.parametrize("status", ["pending", "running", "cancelling"])
async def test_a_free_live_run_is_claimed_at_the_next_epoch(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    first = await handler.execute(RUN, ClaimRun(owner_id="a"))
    assert kinds(first) == ["run_claimed"]
    assert owner(first.snapshot.owner) == ("a", 1)
    released = await handler.execute(RUN, ReleaseRun(owner_id="a"))
    assert kinds(released) == ["run_released"]
    assert released.snapshot.owner is None and released.snapshot.owner_epoch == 1
    second = await handler.execute(RUN, ClaimRun(owner_id="b"))
    assert owner(second.snapshot.owner) == ("b", 2)
    summary = (await handler.store.get_runs([RUN]))[0]
    assert summary is not None and summary.owner_id == "b"
    history = await handler.store.read(RUN)
    assert project_run(history).owner == second.snapshot.owner


async def test_claiming_ones_own_run_again_changes_nothing(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await handler.execute(RUN, ClaimRun(owner_id="a"))
    again = await handler.execute(RUN, ClaimRun(owner_id="a"))
    assert again.appended == ()
    assert owner(again.snapshot.owner) == ("a", 1)


async def test_a_claim_of_an_owned_run_is_refused_unless_it_displaces_the_owner(
    handler: CommandHandler,
) -> None:
    await run_in_status(handler, "running")
    await handler.execute(RUN, ClaimRun(owner_id="a"))
    refused = await assert_rejected(handler, ClaimRun(owner_id="b"), RunOwned, "'a'")
    assert refused.owner_id == "a"
    await assert_rejected(handler, ClaimRun(owner_id="b", displacing="c"), RunOwned, "'a'")
    taken = await handler.execute(RUN, ClaimRun(owner_id="b", displacing="a"))
    assert owner(taken.snapshot.owner) == ("b", 2)
    assert taken.appended[0].event == RunClaimed(owner_id="b", epoch=2, displaced="a")


async def test_a_displaced_owner_records_nothing(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    claimed = await handler.execute(RUN, ClaimRun(owner_id="a"))
    mine = claimed.snapshot.owner
    assert mine is not None
    await handler.execute(RUN, StartStep(step_id="s", lazy=LAZY), acting_as=mine)
    await handler.execute(RUN, ClaimRun(owner_id="b", displacing="a"))
    head = await handler.store.head(RUN)
    with pytest.raises(OwnershipLost, match="worker 'b'") as info:
        await handler.execute(RUN, CompleteStep(step_id="s", output=b"late"), acting_as=mine)
    assert (info.value.code, info.value.status) == ("ownership_lost", 409)
    assert await handler.store.head(RUN) == head
    # Its release is refused too: the run is another's.
    await assert_rejected(handler, ReleaseRun(owner_id="a"), OwnershipLost, "'b'")


async def test_an_owner_that_came_back_under_a_new_claim_is_fenced_by_epoch(
    handler: CommandHandler,
) -> None:
    await run_in_status(handler, "running")
    old = (await handler.execute(RUN, ClaimRun(owner_id="a"))).snapshot.owner
    assert old is not None
    await handler.execute(RUN, ReleaseRun(owner_id="a"))
    await handler.execute(RUN, ClaimRun(owner_id="a"))  # epoch 2, same worker id
    with pytest.raises(OwnershipLost, match="epoch 1"):
        await handler.execute(RUN, StartStep(step_id="s", lazy=LAZY), acting_as=old)


async def test_commands_without_an_owner_are_not_fenced(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await handler.execute(RUN, ClaimRun(owner_id="a"))
    # An outside input (a delivery, a cancellation, a host outside the fleet) checks no owner.
    started = await handler.execute(RUN, StartStep(step_id="s", lazy=LAZY))
    assert started.created_step


async def test_a_batch_claims_and_acts_as_the_claim_it_makes(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    mine = Ownership(owner_id="a", epoch=1, claimed_at=handler.clock())
    outcome = await handler.execute_many(
        RUN, (ClaimRun(owner_id="a"), StartStep(step_id="s", lazy=LAZY)), acting_as=mine
    )
    assert kinds(outcome) == ["run_claimed", "step_created", "step_started"]
    # Another claim came first: the same batch is refused whole.
    await handler.execute(RUN, ReleaseRun(owner_id="a"))
    await handler.execute(RUN, ClaimRun(owner_id="b"))
    await handler.execute(RUN, ReleaseRun(owner_id="b"))
    head = await handler.store.head(RUN)
    with pytest.raises(OwnershipLost, match="another claim came first"):
        await handler.execute_many(
            RUN, (ClaimRun(owner_id="a"), StartStep(step_id="t", lazy=LAZY)), acting_as=mine
        )
    assert await handler.store.head(RUN) == head


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled", "timed_out"])
async def test_an_ended_run_is_not_claimed_and_its_release_is_a_no_op(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    await assert_rejected(handler, ClaimRun(owner_id="a"), TerminalState, "claim")
    assert (await handler.execute(RUN, ReleaseRun(owner_id="a"))).appended == ()
    summary = (await handler.store.get_runs([RUN]))[0]
    assert summary is not None and summary.owner_id is None


async def test_an_ended_run_lists_no_owner(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await handler.execute(RUN, ClaimRun(owner_id="a"))
    ended = await handler.execute(RUN, CompleteRun(output=b""))
    assert owner(ended.snapshot.owner) == ("a", 1)  # the last claim, as it stood
    summary = (await handler.store.get_runs([RUN]))[0]
    assert summary is not None and summary.owner_id is None


async def test_input_to_a_released_run_is_due_for_the_fleet_until_claimed(
    handler: CommandHandler, clock: Clock
) -> None:
    await run_in_status(handler, "running")
    await handler.execute(RUN, CreateHook(hook_id="h", token="tok-ready"))
    await handler.execute(RUN, ClaimRun(owner_id="a"))
    await handler.execute(RUN, ReleaseRun(owner_id="a"))
    clock.advance()
    delivered = await handler.deliver("tok-ready", b"paid")
    at = clock()
    assert delivered.snapshot.ready_at == at
    assert [w.kind for w in await handler.store.due_wakeups(at, limit=10)] == ["ready"]
    # A second delivery keeps the first time: the run has been ready since then.
    clock.advance()
    again = await handler.deliver("tok-ready", b"again")
    assert again.snapshot.ready_at == at
    claimed = await handler.execute(RUN, ClaimRun(owner_id="b"))
    assert claimed.snapshot.ready_at is None
    assert await handler.store.due_wakeups(clock(), limit=10) == []


async def test_a_cancel_request_to_a_released_run_is_due_for_the_fleet(
    handler: CommandHandler, clock: Clock
) -> None:
    await run_in_status(handler, "running")
    await handler.execute(RUN, ClaimRun(owner_id="a"))
    await handler.execute(RUN, ReleaseRun(owner_id="a"))
    requested = await handler.execute(RUN, RequestCancel(reason="stop"))
    assert requested.snapshot.ready_at == clock()
    [wakeup] = await handler.store.due_wakeups(clock(), limit=10)
    assert (wakeup.kind, wakeup.subject_id) == ("ready", RUN)


@pytest.mark.parametrize("claimed", [False, True])
async def test_input_to_a_never_claimed_or_owned_run_is_not_for_the_fleet(
    handler: CommandHandler, claimed: bool
) -> None:
    """Nobody's run is a single process's (it drives it itself); an owned one its owner's."""
    await run_in_status(handler, "running")
    await handler.execute(RUN, CreateHook(hook_id="h", token="tok-own"))
    if claimed:
        await handler.execute(RUN, ClaimRun(owner_id="a"))
    delivered = await handler.deliver("tok-own", b"x")
    assert delivered.snapshot.ready_at is None
    assert delivered.snapshot.wakeups() == ()
