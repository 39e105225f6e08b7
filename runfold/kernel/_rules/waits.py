"""The rules of the wait commands: a durable timer is created once and completed once.

A wait is created on a live run with its `resume_at` (again with another time is
`NonDeterministic`), and completed once while the run is live, unless it was cancelled.
"""

from __future__ import annotations

from runfold.kernel._rules.context import NOOP, NewEvents, Rule, RuleContext
from runfold.kernel.commands import Command, CompleteWait, CreateWait
from runfold.kernel.errors import (
    EntityConflict,
    NonDeterministic,
    RunExpired,
    TerminalState,
    WaitNotFound,
)
from runfold.kernel.events import WaitCompleted, WaitCreated
from runfold.kernel.snapshot import LIVE_RUN_STATUSES

__all__ = ["WAIT_RULES"]


def _create_wait(ctx: RuleContext, cmd: CreateWait) -> NewEvents:
    snap = ctx.live_run("create new entities on")
    record = snap.waits.raw(cmd.wait_id)
    if record is not None:
        if record.resume_at != cmd.resume_at:
            raise NonDeterministic(
                f"wait {cmd.wait_id!r} already exists in run {snap.run_id!r} with another "
                "resume_at",
                run_id=snap.run_id,
            )
        raise EntityConflict(
            f"wait {cmd.wait_id!r} already exists in run {snap.run_id!r}", run_id=snap.run_id
        )
    return (WaitCreated(wait_id=cmd.wait_id, resume_at=cmd.resume_at),)


def _complete_wait(ctx: RuleContext, cmd: CompleteWait) -> NewEvents:
    snap = ctx.run()
    record = snap.waits.raw(cmd.wait_id)
    if record is None:
        raise WaitNotFound(
            f"wait {cmd.wait_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id
        )
    if record.status == "completed":
        return NOOP  # completed already (a retry whose reply was lost)
    if record.status == "cancelled":
        raise TerminalState(
            f"cannot complete wait {cmd.wait_id!r} of run {snap.run_id!r} in terminal state "
            "'cancelled'",
            run_id=snap.run_id,
        )
    if snap.status not in LIVE_RUN_STATUSES:
        raise RunExpired(
            f"cannot complete wait {cmd.wait_id!r}: run {snap.run_id!r} is in terminal state "
            f"{snap.status!r}",
            run_id=snap.run_id,
        )
    return (WaitCompleted(wait_id=cmd.wait_id),)


WAIT_RULES: dict[type[Command], Rule] = {
    CreateWait: _create_wait,
    CompleteWait: _complete_wait,
}
"""The rule of each wait command class."""
