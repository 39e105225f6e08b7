"""The event handlers of the fold: what each event type does to a run, by the laws of its history.

One handler per event type changes a fold's `Builder` as the event says (the table "effect on
the snapshot" of the event catalogue), after checking that the event may happen where it does:
after what came before, for the run's status and for its entity's state machine. An event that
breaks a law of a valid history raises `HistoryError` through `Builder.fail`.

The events a run repeats most (those of steps, waits, deliveries and log lines) have handlers
that take the fields they read by name (`FIELD_HANDLERS`): the fold of events calls them
through `compile_event_call`, and a replay of stored rows (`snapshot.replay`) straight from their
payloads, without building the events.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from runfold.kernel.events import (
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Event,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    RetryPolicy,
    RunCancelled,
    RunClaimed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunReleased,
    RunStarted,
    RunTimedOut,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    WaitCompleted,
    WaitCreated,
)
from runfold.kernel.fast import compile_event_call
from runfold.kernel.snapshot._builder import Builder, check_attributes, merge_attributes
from runfold.kernel.snapshot._records import HookRecord, StepRecord, WaitRecord
from runfold.kernel.snapshot.states import LIVE_RUN_STATUSES, Cancellation, Delivery, Ownership

__all__ = ["FIELD_HANDLERS", "HANDLERS"]

_LIVE_STEP = frozenset({"pending", "running"})


def _on_run_created(b: Builder, ev: Any, at: datetime) -> None:
    raise b.fail("run_created after the first event")


def _on_run_started(b: Builder, ev: Any, at: datetime) -> None:
    if b.status != "pending":
        raise b.fail(f"run_started while {b.status}")
    b.status = "running"
    b.started_at = at


def _on_run_completed(b: Builder, ev: RunCompleted, at: datetime) -> None:
    if b.status not in ("pending", "running"):
        raise b.fail(f"run_completed while {b.status}")
    b.status = "completed"
    b.output = ev.output
    b.completed_at = at


def _on_run_failed(b: Builder, ev: RunFailed, at: datetime) -> None:
    b.require_live("run_failed")
    b.status = "failed"
    b.error = ev.error
    b.error_code = ev.error_code
    b.completed_at = at


def _on_cancel_requested(b: Builder, ev: CancelRequested, at: datetime) -> None:
    if b.status not in ("pending", "running"):
        raise b.fail(f"cancel_requested while {b.status}")
    b.status = "cancelling"
    b.cancellation = Cancellation(reason=ev.reason, requested_at=at, sequence=b.seq)
    _note_input(b, at)
    for step_id in b.live_steps:
        step = b.step(step_id)
        step.status = "cancelled"
        step.completed_at = step.updated_at = at
    for wait_id in b.waiting:
        wait = b.wait(wait_id)
        wait.status = "cancelled"
        wait.completed_at = at
    for hook_id in b.active_hooks:
        b.hook(hook_id).status = "cancelled"
    b.live_steps, b.retrying, b.waiting, b.active_hooks = set(), set(), set(), set()


def _on_run_cancelled(b: Builder, ev: RunCancelled, at: datetime) -> None:
    b.require_live("run_cancelled")
    b.status = "cancelled"
    b.completed_at = at


def _on_run_timed_out(b: Builder, ev: RunTimedOut, at: datetime) -> None:
    b.require_live("run_timed_out")
    b.status = "timed_out"
    b.completed_at = at


def _on_attributes_set(b: Builder, ev: AttributesSet, at: datetime) -> None:
    b.require_live("attributes_set")
    if ev.write_id is not None:
        if ev.write_id in b.write_ids_new or ev.write_id in b.write_ids:
            raise b.fail(f"attribute write id {ev.write_id!r} repeats")
        b.write_ids_new[ev.write_id] = b.seq
    if not ev.allow_reserved:
        for change in ev.changes:
            if change.key.startswith("$"):
                raise b.fail(f"attribute key {change.key!r} uses the reserved prefix")
    merge_attributes(b, ev.changes)
    check_attributes(b)


def _on_progress_recorded(b: Builder, ev: ProgressRecorded, at: datetime) -> None:
    b.require_live("progress_recorded")
    if ev.progress_id in b.progress_new or ev.progress_id in b.progress:
        raise b.fail(f"progress id {ev.progress_id!r} repeats")
    b.progress_new[ev.progress_id] = ev


def _on_child_linked(b: Builder, ev: ChildLinked, at: datetime) -> None:
    b.require_live("child_linked")
    if ev.reference_id in b.children_new or ev.reference_id in b.children:
        raise b.fail(f"child reference id {ev.reference_id!r} repeats")
    b.children_new[ev.reference_id] = ev


def _on_log_recorded(b: Builder, at: datetime, log_id: str | None) -> None:
    b.require_live("log_recorded")
    if log_id is not None:
        if log_id in b.log_ids_new or log_id in b.log_ids:
            raise b.fail(f"log id {log_id!r} repeats")
        b.log_ids_new[log_id] = b.seq
    b.log_count += 1


def _on_step_created(
    b: Builder,
    at: datetime,
    step_id: str,
    step_name: str,
    input: bytes,
    retry: RetryPolicy | None,
) -> None:
    if b.status not in LIVE_RUN_STATUSES:
        raise b.fail(f"step_created after the run ended ({b.status})")
    if step_id in b.steps_new or b.steps.raw(step_id) is not None:
        raise b.fail(f"step {step_id!r} created twice")
    b.steps_new[step_id] = StepRecord(step_id, step_name, input, retry, at)
    b.own_live_steps().add(step_id)


def _on_step_started(
    b: Builder,
    at: datetime,
    step_id: str,
    attempt: int,
    after_interruption: bool,
    retry: RetryPolicy | None,
    start_id: str | None,
) -> None:
    if b.status not in LIVE_RUN_STATUSES:
        raise b.fail(f"step_started after the run ended ({b.status})")
    step = b.steps_new.get(step_id) or b.step(step_id)
    if step.status not in _LIVE_STEP:
        raise b.fail(f"step_started on step {step_id!r} in state {step.status}")
    if attempt != step.attempt + 1:
        raise b.fail(
            f"step {step_id!r} started with attempt {attempt}, expected {step.attempt + 1}"
        )
    # Histories written before the marker leave it out after an interruption too: only a
    # marker on a step that was not running is a lie.
    if after_interruption and step.status != "running":
        raise b.fail(f"step {step_id!r} started after an interruption, but it was pending")
    # Most steps never have a start id, an error or a retry time: their record has no slot
    # for one (and its None is read from the class, which costs more than a type check).
    if start_id is not None or type(step) is not StepRecord:
        wide = step = b.wide_step(step_id)
        wide.start_id = start_id
        if wide.retry_after is not None:
            wide.retry_after = None
            b.own_retrying().discard(step_id)
    if retry is not None:
        step.retry = retry  # the policy from this attempt on
    step.status = "running"
    step.attempt = attempt
    if step.started_at is None:
        step.started_at = at
    step.updated_at = at


def _finish_step(b: Builder, step_id: str, kind: str, at: datetime) -> StepRecord:
    step = b.steps_new.get(step_id) or b.step(step_id)
    status = step.status
    if status not in _LIVE_STEP:
        raise b.fail(f"{kind} on step {step_id!r} in state {status}")
    if b.status not in LIVE_RUN_STATUSES and status != "running":
        raise b.fail(f"{kind} on {status} step {step_id!r} after the run ended")
    b.own_live_steps().discard(step_id)
    if type(step) is not StepRecord and step.retry_after is not None:  # (see _on_step_started)
        b.own_retrying().discard(step_id)
    step.completed_at = step.updated_at = at
    return step


def _on_step_completed(b: Builder, at: datetime, step_id: str, output: bytes) -> None:
    step = _finish_step(b, step_id, "step_completed", at)
    step.status = "completed"
    step.output = output


def _on_step_failed(b: Builder, at: datetime, step_id: str, error: bytes) -> None:
    _finish_step(b, step_id, "step_failed", at)
    step = b.wide_step(step_id)
    step.status = "failed"
    step.error = error


def _on_step_cancelled(b: Builder, at: datetime, step_id: str) -> None:
    b.require_live("step_cancelled")
    step = _finish_step(b, step_id, "step_cancelled", at)
    step.status = "cancelled"


def _on_step_retrying(
    b: Builder, at: datetime, step_id: str, error: bytes, retry_after: datetime | None
) -> None:
    b.require_live("step_retrying")
    step = b.step(step_id)
    if step.status != "running":
        raise b.fail(f"step_retrying on step {step_id!r} in state {step.status}")
    if step.retry is not None and step.attempt >= step.retry.max_attempts:
        raise b.fail(f"step_retrying on step {step_id!r} past its retry budget")
    step = b.wide_step(step_id)
    step.status = "pending"
    step.error = error
    step.retry_after = retry_after
    step.updated_at = at
    if retry_after is not None:
        b.own_retrying().add(step_id)


def _on_wait_created(b: Builder, at: datetime, wait_id: str, resume_at: datetime) -> None:
    b.require_live("wait_created")
    if wait_id in b.waits_new or b.waits.raw(wait_id) is not None:
        raise b.fail(f"wait {wait_id!r} created twice")
    b.waits_new[wait_id] = WaitRecord(wait_id, resume_at, at)
    b.own_waiting().add(wait_id)


def _on_wait_completed(b: Builder, at: datetime, wait_id: str) -> None:
    b.require_live("wait_completed")
    wait = b.wait(wait_id)
    if wait.status != "waiting":
        raise b.fail(f"wait_completed on wait {wait_id!r} in state {wait.status}")
    wait.status = "completed"
    wait.completed_at = at
    b.own_waiting().discard(wait_id)


def _hook_record(b: Builder, hook_id: str) -> HookRecord:
    found = b.hooks_new.get(hook_id) or b.hooks.raw(hook_id)
    assert found is not None
    return found


def _on_hook_created(b: Builder, ev: HookCreated, at: datetime) -> None:
    b.require_live("hook_created")
    if ev.hook_id in b.hooks_new or b.hooks.raw(ev.hook_id) is not None:
        raise b.fail(f"hook {ev.hook_id!r} created twice")
    for hook_id in b.active_hooks:
        if _hook_record(b, hook_id).token == ev.token:
            raise b.fail(f"hook {ev.hook_id!r} reuses the token of active hook {hook_id!r}")
    b.hooks_new[ev.hook_id] = HookRecord(ev, at)
    b.own_active_hooks().add(ev.hook_id)


def _on_hook_received(
    b: Builder, at: datetime, hook_id: str, payload: bytes, delivery_id: str | None
) -> None:
    b.require_live("hook_received")
    hook = b.hook(hook_id)
    if hook.status != "active":
        raise b.fail(f"hook_received on hook {hook_id!r} in state {hook.status}")
    hook.deliveries.append(
        Delivery(sequence=b.seq, delivery_id=delivery_id, payload=payload, received_at=at)
    )
    _note_input(b, at)


def _note_input(b: Builder, at: datetime) -> None:
    """Input from outside reached the run: with no owner, after one had, the fleet takes it."""
    if b.owner is None and b.owner_epoch > 0 and b.ready_at is None:
        b.ready_at = at


def _on_hook_disposed(b: Builder, ev: HookDisposed, at: datetime) -> None:
    hook = b.hook(ev.hook_id)
    if hook.status != "active":
        raise b.fail(f"hook_disposed on hook {ev.hook_id!r} in state {hook.status}")
    if b.status not in LIVE_RUN_STATUSES and hook.retain_token_until is None:
        raise b.fail(f"hook_disposed on hook {ev.hook_id!r} whose token left with the run")
    hook.status = "disposed"
    b.own_active_hooks().discard(ev.hook_id)


def _on_hook_conflict(b: Builder, ev: HookConflict, at: datetime) -> None:
    b.require_live("hook_conflict")
    if ev.hook_id in b.hooks_new or b.hooks.raw(ev.hook_id) is not None:
        raise b.fail(f"hook_conflict for existing hook {ev.hook_id!r}")
    b.hook_conflicts_new[ev.hook_id] = ev


def _on_run_claimed(b: Builder, ev: RunClaimed, at: datetime) -> None:
    b.require_live("run_claimed")
    if ev.epoch != b.owner_epoch + 1:
        raise b.fail(f"run_claimed with epoch {ev.epoch} after epoch {b.owner_epoch}")
    held = b.owner.owner_id if b.owner is not None else None
    if ev.displaced != held:
        raise b.fail(f"run_claimed displacing {ev.displaced!r}, but the run's owner is {held!r}")
    b.owner = Ownership(owner_id=ev.owner_id, epoch=ev.epoch, claimed_at=at)
    b.owner_epoch = ev.epoch
    b.ready_at = None


def _on_run_released(b: Builder, ev: RunReleased, at: datetime) -> None:
    b.require_live("run_released")
    owner = b.owner
    if owner is None or (owner.owner_id, owner.epoch) != (ev.owner_id, ev.epoch):
        raise b.fail(f"run_released by {ev.owner_id!r} (epoch {ev.epoch}), not the run's owner")
    b.owner = None


FIELD_HANDLERS: dict[type[Event], Any] = {
    LogRecorded: _on_log_recorded,
    StepCreated: _on_step_created,
    StepStarted: _on_step_started,
    StepCompleted: _on_step_completed,
    StepFailed: _on_step_failed,
    StepRetrying: _on_step_retrying,
    StepCancelled: _on_step_cancelled,
    WaitCreated: _on_wait_created,
    WaitCompleted: _on_wait_completed,
    HookReceived: _on_hook_received,
}
"""The handlers of the events a run repeats, by event class, called with the fields they read.

Each takes `(builder, at)` and the fields it reads, by name, so that a replay of stored rows
(`snapshot.replay`) folds them straight from their payloads; the fold of events calls them
through `compile_event_call`.
"""

HANDLERS: dict[type[Event], Any] = {
    RunCreated: _on_run_created,
    RunStarted: _on_run_started,
    RunCompleted: _on_run_completed,
    RunFailed: _on_run_failed,
    CancelRequested: _on_cancel_requested,
    RunCancelled: _on_run_cancelled,
    RunTimedOut: _on_run_timed_out,
    AttributesSet: _on_attributes_set,
    ProgressRecorded: _on_progress_recorded,
    ChildLinked: _on_child_linked,
    HookCreated: _on_hook_created,
    HookDisposed: _on_hook_disposed,
    HookConflict: _on_hook_conflict,
    RunClaimed: _on_run_claimed,
    RunReleased: _on_run_released,
    **{cls: compile_event_call(cls, handler) for cls, handler in FIELD_HANDLERS.items()},
}
"""The handler of each event class: `(builder, event, at)`."""
