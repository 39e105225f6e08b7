"""The rules of run ownership: one worker drives a run at a time, fenced by the claim's epoch.

A claim takes a run nobody owns, or one whose owner the claimant names as displaced (it found
that owner's lease lapsed; leases live in the store, outside the history, so renewing one costs
no event). Each claim is the run's next epoch. A release gives the run up. Commands made on a
worker's behalf carry its `Ownership` (`decide(..., acting_as=...)`) and are refused with
`OwnershipLost` once the run has another owner, so a displaced worker records nothing.
"""

from __future__ import annotations

from runfold.kernel._rules.context import NOOP, NewEvents, Rule, RuleContext
from runfold.kernel.commands import ClaimRun, Command, ReleaseRun
from runfold.kernel.errors import OwnershipLost, RunOwned
from runfold.kernel.events import RunClaimed, RunReleased
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, Ownership, Snapshot

__all__ = ["OWNER_RULES", "check_owner"]


def _claim_run(ctx: RuleContext, cmd: ClaimRun) -> NewEvents:
    snap = ctx.live_run("claim")
    owner = snap.owner
    if owner is None:
        return (RunClaimed(owner_id=cmd.owner_id, epoch=snap.owner_epoch + 1),)
    if owner.owner_id == cmd.owner_id:
        return NOOP
    if cmd.displacing != owner.owner_id:
        raise RunOwned(
            f"run {snap.run_id!r} is owned by worker {owner.owner_id!r}",
            run_id=snap.run_id,
            owner_id=owner.owner_id,
        )
    return (
        RunClaimed(owner_id=cmd.owner_id, epoch=snap.owner_epoch + 1, displaced=owner.owner_id),
    )


def _release_run(ctx: RuleContext, cmd: ReleaseRun) -> NewEvents:
    snap = ctx.run()
    owner = snap.owner
    if owner is None or snap.status not in LIVE_RUN_STATUSES:
        return NOOP
    if owner.owner_id != cmd.owner_id:
        raise OwnershipLost(
            f"worker {cmd.owner_id!r} cannot release run {snap.run_id!r}: worker "
            f"{owner.owner_id!r} owns it",
            run_id=snap.run_id,
        )
    return (RunReleased(owner_id=owner.owner_id, epoch=owner.epoch),)


def check_owner(snapshot: Snapshot | None, command: Command, acting_as: Ownership) -> None:
    """Refuse with `OwnershipLost` a command made for `acting_as` on a run it does not own.

    A claim by the same worker is what makes it the owner, so it is let through to its rule; a
    run with no history yet has no owner to check (its creation and first claim go together).
    """
    if snapshot is None or isinstance(command, ClaimRun):
        return
    owner = snapshot.owner
    if owner is None or owner.owner_id != acting_as.owner_id or owner.epoch != acting_as.epoch:
        held = "nobody" if owner is None else f"worker {owner.owner_id!r} (epoch {owner.epoch})"
        raise OwnershipLost(
            f"worker {acting_as.owner_id!r} (epoch {acting_as.epoch}) no longer owns run "
            f"{snapshot.run_id!r}: {held} does",
            run_id=snapshot.run_id,
        )


OWNER_RULES: dict[type[Command], Rule] = {ClaimRun: _claim_run, ReleaseRun: _release_run}
"""The rule of each ownership command class."""
