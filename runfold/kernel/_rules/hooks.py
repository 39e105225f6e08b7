"""The rules of the hook commands: a hook's token, its deliveries, and its disposal.

A hook's token is held by one active hook at a time, in the store (`token_holder`) or in the run:
a `CreateHook` whose token is held records a `hook_conflict` instead. A delivery goes to an active
hook of a live run (a repeated `delivery_id` with the same payload is a no-op). A hook whose run
ended keeps its token while it retains it: a delivery is then refused with `RunExpired`, not
`HookNotFound`, and the hook may still be disposed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from runfold.kernel._rules.context import NOOP, NewEvents, Rule, RuleContext
from runfold.kernel.commands import Command, CreateHook, DisposeHook, ReceiveHook
from runfold.kernel.errors import (
    EntityConflict,
    HookNotFound,
    InvalidCommand,
    RunExpired,
    TerminalState,
)
from runfold.kernel.events import HookConflict, HookCreated, HookDisposed, HookReceived
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, Snapshot

__all__ = ["HOOK_RULES"]


def _create_hook(ctx: RuleContext, cmd: CreateHook) -> NewEvents:
    if (
        cmd.retain_token_until is not None
        # A difference, not `now + retention`, which overflows near the end of the datetime range.
        and cmd.retain_token_until - ctx.now > ctx.limits.max_token_retention
    ):
        days = ctx.limits.max_token_retention / timedelta(days=1)
        raise InvalidCommand(f"hook token retention cannot exceed {days:g} days", run_id=ctx.run_id)
    snap = ctx.live_run("create new entities on")
    if snap.hooks.raw(cmd.hook_id) is not None:
        raise EntityConflict(
            f"hook {cmd.hook_id!r} already exists in run {snap.run_id!r}", run_id=snap.run_id
        )
    holder_run_id = None
    if ctx.token_holder is not None and ctx.token_holder.run_id != snap.run_id:
        holder_run_id = ctx.token_holder.run_id
    else:
        for hook_id in snap.active_hook_ids:
            if snap.hooks.raw(hook_id).token == cmd.token:  # type: ignore[union-attr]
                holder_run_id = snap.run_id
                break
    if holder_run_id is not None:
        return (HookConflict(hook_id=cmd.hook_id, token=cmd.token, holder_run_id=holder_run_id),)
    return (
        HookCreated(
            hook_id=cmd.hook_id,
            token=cmd.token,
            metadata=cmd.metadata,
            is_webhook=cmd.is_webhook,
            retain_token_until=cmd.retain_token_until,
        ),
    )


def _retaining(record: Any, now: datetime) -> bool:
    return record.retain_token_until is not None and record.retain_token_until > now


def _hook_not_found(snap: Snapshot, hook_id: str) -> HookNotFound:
    return HookNotFound(f"hook {hook_id!r} not found in run {snap.run_id!r}", run_id=snap.run_id)


def _receive_hook(ctx: RuleContext, cmd: ReceiveHook) -> NewEvents:
    snap = ctx.run()
    record = snap.hooks.raw(cmd.hook_id)
    if record is None or record.status != "active":
        raise _hook_not_found(snap, cmd.hook_id)
    if snap.status not in LIVE_RUN_STATUSES:
        if _retaining(record, ctx.now):
            raise RunExpired(
                f"hook {cmd.hook_id!r} belongs to run {snap.run_id!r}, which is in terminal "
                f"state {snap.status!r}",
                run_id=snap.run_id,
            )
        raise _hook_not_found(snap, cmd.hook_id)
    if cmd.delivery_id is not None:
        for delivery in record.deliveries:
            if delivery.delivery_id == cmd.delivery_id:
                if delivery.payload == cmd.payload:
                    return NOOP
                raise EntityConflict(
                    f"delivery {cmd.delivery_id!r} to hook {cmd.hook_id!r} of run "
                    f"{snap.run_id!r} was already received with another payload",
                    run_id=snap.run_id,
                )
    return (HookReceived(hook_id=cmd.hook_id, payload=cmd.payload, delivery_id=cmd.delivery_id),)


def _dispose_hook(ctx: RuleContext, cmd: DisposeHook) -> NewEvents:
    snap = ctx.run()
    record = snap.hooks.raw(cmd.hook_id)
    if record is None:
        raise _hook_not_found(snap, cmd.hook_id)
    if record.status == "disposed":
        return NOOP  # disposed already (a retry whose reply was lost)
    if record.status == "cancelled":
        raise TerminalState(
            f"cannot dispose hook {cmd.hook_id!r} of run {snap.run_id!r} in terminal state "
            "'cancelled'",
            run_id=snap.run_id,
        )
    if snap.status not in LIVE_RUN_STATUSES and not _retaining(record, ctx.now):
        raise _hook_not_found(snap, cmd.hook_id)
    return (HookDisposed(hook_id=cmd.hook_id),)


HOOK_RULES: dict[type[Command], Rule] = {
    CreateHook: _create_hook,
    ReceiveHook: _receive_hook,
    DisposeHook: _dispose_hook,
}
"""The rule of each hook command class."""
