"""The reducer: `project_run` folds a run's history into its snapshot, `apply` catches one up.

The reducer folds with mutable private records and publishes frozen views: a step, wait or hook is
kept as a small slotted record and turned into its frozen `StepState`/`WaitState`/`HookState` when
read through the snapshot's mappings. `apply` copies a record only when an event touches it, and
the entity mappings are persistent (`_pmap.PView`), so catching a cached snapshot up costs time in
proportion to the new events, not to the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any

import attrs

from runfold.kernel._fast import compile_event_call, frozen_factory
from runfold.kernel._gc import in_bulk
from runfold.kernel._pmap import PView
from runfold.kernel.errors import HistoryError, RunNotSupported
from runfold.kernel.events import (
    AttributeChange,
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Envelope,
    Event,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    RetryPolicy,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
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
from runfold.kernel.limits import SPEC_VERSION, Limits
from runfold.kernel.snapshot._records import (
    HookRecord,
    StepRecord,
    WaitRecord,
    empty_records,
    empty_values,
)
from runfold.kernel.snapshot.states import (
    LIVE_RUN_STATUSES,
    Cancellation,
    Delivery,
    HookState,
    Snapshot,
    StepState,
    WaitState,
)

__all__ = ["apply", "project_run"]

_LIVE_STEP = frozenset({"pending", "running"})
_DEFAULT_LIMITS = Limits()


# --- the reducer --------------------------------------------------------------------------------


class _Builder:
    """The mutable state of one fold. Records in the `*_new` dicts belong to this fold."""

    __slots__ = (
        "active_hooks",
        "attributes",
        "attributes_owned",
        "cancellation",
        "children",
        "children_new",
        "completed_at",
        "context",
        "created_at",
        "deadline",
        "deployment_id",
        "error",
        "error_code",
        "hook_conflicts",
        "hook_conflicts_new",
        "hooks",
        "hooks_new",
        "input",
        "limits",
        "live_steps",
        "log_count",
        "output",
        "parent_run_id",
        "progress",
        "progress_new",
        "retrying",
        "run_id",
        "seq",
        "spec_version",
        "started_at",
        "status",
        "steps",
        "steps_new",
        "updated_at",
        "waiting",
        "waits",
        "waits_new",
        "workflow_name",
        "workflow_version",
        "write_ids",
        "write_ids_new",
    )

    limits: Limits
    run_id: str
    seq: int
    status: str
    workflow_name: str
    workflow_version: str | None
    deployment_id: str | None
    input: bytes
    output: bytes | None
    error: bytes | None
    error_code: str | None
    context: bytes | None
    parent_run_id: str | None
    deadline: datetime | None
    spec_version: int
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    cancellation: Cancellation | None
    attributes: Mapping[str, str]
    attributes_owned: bool
    log_count: int
    steps: PView[StepRecord, StepState]
    waits: PView[WaitRecord, WaitState]
    hooks: PView[HookRecord, HookState]
    progress: PView[ProgressRecorded, ProgressRecorded]
    children: PView[ChildLinked, ChildLinked]
    hook_conflicts: PView[HookConflict, HookConflict]
    write_ids: PView[int, int]
    steps_new: dict[str, StepRecord]
    waits_new: dict[str, WaitRecord]
    hooks_new: dict[str, HookRecord]
    progress_new: dict[str, ProgressRecorded]
    children_new: dict[str, ChildLinked]
    hook_conflicts_new: dict[str, HookConflict]
    write_ids_new: dict[str, int]
    live_steps: set[str]
    retrying: set[str]
    waiting: set[str]
    active_hooks: set[str]

    def fail(self, reason: str) -> HistoryError:
        return HistoryError(self.run_id, self.seq, reason)

    def require_live(self, what: str) -> None:
        if self.status not in LIVE_RUN_STATUSES:
            raise self.fail(f"{what} after the run ended ({self.status})")

    def step(self, step_id: str) -> StepRecord:
        record = self.steps_new.get(step_id)
        if record is None:
            base = self.steps.raw(step_id)
            if base is None:
                raise self.fail(f"event for unknown step {step_id!r}")
            record = self.steps_new[step_id] = base.clone()
        return record

    def wait(self, wait_id: str) -> WaitRecord:
        record = self.waits_new.get(wait_id)
        if record is None:
            base = self.waits.raw(wait_id)
            if base is None:
                raise self.fail(f"event for unknown wait {wait_id!r}")
            record = self.waits_new[wait_id] = base.clone()
        return record

    def hook(self, hook_id: str) -> HookRecord:
        record = self.hooks_new.get(hook_id)
        if record is None:
            base = self.hooks.raw(hook_id)
            if base is None:
                raise self.fail(f"event for unknown hook {hook_id!r}")
            record = self.hooks_new[hook_id] = base.clone()
        return record

    def has_step(self, step_id: str) -> bool:
        return step_id in self.steps_new or self.steps.raw(step_id) is not None

    def own_attributes(self) -> dict[str, str]:
        if not isinstance(self.attributes, dict):
            self.attributes = dict(self.attributes)
            self.attributes_owned = True
        return self.attributes

    def freeze(self) -> Snapshot:
        # Positional, in `_SNAPSHOT_FIELDS` order: a snapshot is built per `apply`, and attrs'
        # keyword `__init__` of 32 fields was a tenth of a workflow step's cost.
        steps_new, waits_new, hooks_new = self.steps_new, self.waits_new, self.hooks_new
        return _make_snapshot(
            self.run_id,
            self.status,
            self.workflow_name,
            self.workflow_version,
            self.deployment_id,
            self.input,
            self.output,
            self.error,
            self.error_code,
            self.context,
            MappingProxyType(self.attributes) if self.attributes_owned else self.attributes,
            self.parent_run_id,
            self.deadline,
            self.spec_version,
            self.created_at,
            self.started_at,
            self.completed_at,
            self.updated_at,
            self.seq,
            self.cancellation,
            self.steps.derive(steps_new) if steps_new else self.steps,
            self.waits.derive(waits_new) if waits_new else self.waits,
            self.hooks.derive(hooks_new) if hooks_new else self.hooks,
            self.progress.derive(self.progress_new) if self.progress_new else self.progress,
            self.children.derive(self.children_new) if self.children_new else self.children,
            self.hook_conflicts.derive(self.hook_conflicts_new)
            if self.hook_conflicts_new
            else self.hook_conflicts,
            self.write_ids.derive(self.write_ids_new) if self.write_ids_new else self.write_ids,
            self.log_count,
            frozenset(self.live_steps),
            frozenset(self.retrying),
            frozenset(self.waiting),
            frozenset(self.active_hooks),
        )


_SNAPSHOT_FIELDS = (
    "run_id",
    "status",
    "workflow_name",
    "workflow_version",
    "deployment_id",
    "input",
    "output",
    "error",
    "error_code",
    "context",
    "attributes",
    "parent_run_id",
    "deadline",
    "spec_version",
    "created_at",
    "started_at",
    "completed_at",
    "updated_at",
    "last_sequence",
    "cancellation",
    "steps",
    "waits",
    "hooks",
    "progress",
    "children",
    "hook_conflicts",
    "attribute_write_ids",
    "log_count",
    "live_step_ids",
    "retrying_step_ids",
    "waiting_wait_ids",
    "active_hook_ids",
)
"""The order `_Builder.freeze` passes a snapshot's fields in: `Snapshot`'s own."""
if tuple(field.name for field in attrs.fields(Snapshot)) != _SNAPSHOT_FIELDS:
    raise AssertionError("_Builder.freeze is out of step with Snapshot's fields")
_make_snapshot = frozen_factory(Snapshot)


def _start_builder(first: Envelope, limits: Limits) -> _Builder:
    ev = first.event
    if first.sequence != 1:
        # Like a gap later on, name the sequence that was expected here.
        raise HistoryError(first.run_id, 1, f"history starts at sequence {first.sequence}, not 1")
    if type(ev) is not RunCreated:
        found = getattr(ev, "event_type", type(ev).__name__)
        raise HistoryError(first.run_id, 1, f"history starts with {found}, not run_created")
    if ev.spec_version > SPEC_VERSION:
        raise RunNotSupported(
            f"run {first.run_id!r} requires spec version {ev.spec_version}, "
            f"runfold supports {SPEC_VERSION}",
            run_id=first.run_id,
        )
    b = _Builder()
    b.limits = limits
    b.run_id = first.run_id
    b.seq = 1
    b.status = "pending"
    b.workflow_name = ev.workflow_name
    b.workflow_version = ev.workflow_version
    b.deployment_id = ev.deployment_id
    b.input = ev.input
    b.context = ev.context
    b.parent_run_id = ev.parent_run_id
    b.deadline = ev.deadline
    b.spec_version = ev.spec_version
    b.output = b.error = b.error_code = None
    b.created_at = b.updated_at = first.recorded_at
    b.started_at = b.completed_at = None
    b.cancellation = None
    b.attributes = {}
    b.attributes_owned = True
    _merge_attributes(b, tuple(AttributeChange(key=k, value=v) for k, v in ev.attributes.items()))
    _check_attributes(b)
    b.log_count = 0
    b.steps, b.waits, b.hooks = empty_records(), empty_records(), empty_records()
    b.progress, b.children, b.write_ids = empty_values(), empty_values(), empty_values()
    b.hook_conflicts = empty_values()
    b.steps_new, b.waits_new, b.hooks_new = {}, {}, {}
    b.progress_new, b.children_new, b.write_ids_new = {}, {}, {}
    b.hook_conflicts_new = {}
    b.live_steps, b.retrying, b.waiting, b.active_hooks = set(), set(), set(), set()
    return b


def _resume_builder(snapshot: Snapshot, limits: Limits) -> _Builder:
    b = _Builder()
    b.limits = limits
    b.run_id = snapshot.run_id
    b.seq = snapshot.last_sequence
    b.status = snapshot.status
    b.workflow_name = snapshot.workflow_name
    b.workflow_version = snapshot.workflow_version
    b.deployment_id = snapshot.deployment_id
    b.input = snapshot.input
    b.context = snapshot.context
    b.parent_run_id = snapshot.parent_run_id
    b.deadline = snapshot.deadline
    b.spec_version = snapshot.spec_version
    b.output, b.error, b.error_code = snapshot.output, snapshot.error, snapshot.error_code
    b.created_at, b.updated_at = snapshot.created_at, snapshot.updated_at
    b.started_at, b.completed_at = snapshot.started_at, snapshot.completed_at
    b.cancellation = snapshot.cancellation
    b.attributes = snapshot.attributes
    b.attributes_owned = False
    b.log_count = snapshot.log_count
    b.steps, b.waits, b.hooks = snapshot.steps, snapshot.waits, snapshot.hooks
    b.progress, b.children = snapshot.progress, snapshot.children
    b.hook_conflicts = snapshot.hook_conflicts
    b.write_ids = snapshot.attribute_write_ids
    b.steps_new, b.waits_new, b.hooks_new = {}, {}, {}
    b.progress_new, b.children_new, b.write_ids_new = {}, {}, {}
    b.hook_conflicts_new = {}
    b.live_steps = set(snapshot.live_step_ids)
    b.retrying = set(snapshot.retrying_step_ids)
    b.waiting = set(snapshot.waiting_wait_ids)
    b.active_hooks = set(snapshot.active_hook_ids)
    return b


def _fold(b: _Builder, envelopes: Iterable[Envelope]) -> Snapshot:
    run_id = b.run_id
    seq = b.seq
    handlers = _HANDLERS
    at = b.updated_at
    for env in envelopes:
        seq += 1
        b.seq = seq
        if env.sequence != seq:
            raise b.fail(f"expected sequence {seq}, found {env.sequence} (gap or repeat)")
        if env.run_id != run_id:
            raise b.fail(f"envelope of run {env.run_id!r} in the history of {run_id!r}")
        event = env.event
        handler = handlers.get(type(event))
        if handler is None:
            raise b.fail(f"not an event: {type(event).__name__}")
        at = env.recorded_at
        handler(b, event, at)
    b.updated_at = at  # no handler reads it: the last event's time is the run's
    return b.freeze()


def project_run(history: Sequence[Envelope], *, limits: Limits = _DEFAULT_LIMITS) -> Snapshot:
    """Fold a run's whole history into its snapshot.

    Raises `HistoryError(run_id, sequence, reason)` for a history that breaks a law of the
    event catalogue (gap, repeat, foreign run id, event before `run_created`, impossible
    transition), and `RunNotSupported` for a run stamped by a newer kernel spec.
    """
    if not history:
        raise HistoryError(None, 0, "empty history")
    first = history[0]
    b = _start_builder(first, limits)
    rest = history[1:] if len(history) > 1 else ()
    return in_bulk(len(rest), _fold, b, rest)


def apply(
    snapshot: Snapshot, envelopes: Iterable[Envelope], *, limits: Limits = _DEFAULT_LIMITS
) -> Snapshot:
    """Catch `snapshot` up with the events that follow it, in time proportional to those events.

    `apply(project_run(h[:k]), h[k:]) == project_run(h)`. The input snapshot is never changed.
    """
    b = _resume_builder(snapshot, limits)
    count = len(envelopes) if isinstance(envelopes, list | tuple) else 0
    return in_bulk(count, _fold, b, envelopes)


# --- event handlers (one per event type) --------------------------------------------------------


def _merge_attributes(b: _Builder, changes: tuple[AttributeChange, ...]) -> None:
    attributes = b.own_attributes()
    for change in changes:
        if change.value is None:
            attributes.pop(change.key, None)
        else:
            attributes[change.key] = change.value


def _check_attributes(b: _Builder) -> None:
    limits = b.limits
    if len(b.attributes) > limits.max_attributes:
        raise b.fail(f"run holds {len(b.attributes)} attributes, over the limit")
    for key, value in b.attributes.items():
        if not key or len(key) > limits.max_attribute_key_length:
            raise b.fail(f"attribute key {key!r} breaks the key length limit")
        if len(value.encode()) > limits.max_attribute_value_bytes:
            raise b.fail(f"attribute {key!r} value breaks the value size limit")


def _on_run_created(b: _Builder, ev: Any, at: datetime) -> None:
    raise b.fail("run_created after the first event")


def _on_run_started(b: _Builder, ev: Any, at: datetime) -> None:
    if b.status != "pending":
        raise b.fail(f"run_started while {b.status}")
    b.status = "running"
    b.started_at = at


def _on_run_completed(b: _Builder, ev: RunCompleted, at: datetime) -> None:
    if b.status not in ("pending", "running"):
        raise b.fail(f"run_completed while {b.status}")
    b.status = "completed"
    b.output = ev.output
    b.completed_at = at


def _on_run_failed(b: _Builder, ev: RunFailed, at: datetime) -> None:
    b.require_live("run_failed")
    b.status = "failed"
    b.error = ev.error
    b.error_code = ev.error_code
    b.completed_at = at


def _on_cancel_requested(b: _Builder, ev: CancelRequested, at: datetime) -> None:
    if b.status not in ("pending", "running"):
        raise b.fail(f"cancel_requested while {b.status}")
    b.status = "cancelling"
    b.cancellation = Cancellation(reason=ev.reason, requested_at=at, sequence=b.seq)
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
    b.live_steps.clear()
    b.retrying.clear()
    b.waiting.clear()
    b.active_hooks.clear()


def _on_run_cancelled(b: _Builder, ev: RunCancelled, at: datetime) -> None:
    b.require_live("run_cancelled")
    b.status = "cancelled"
    b.completed_at = at


def _on_run_timed_out(b: _Builder, ev: RunTimedOut, at: datetime) -> None:
    b.require_live("run_timed_out")
    b.status = "timed_out"
    b.completed_at = at


def _on_attributes_set(b: _Builder, ev: AttributesSet, at: datetime) -> None:
    b.require_live("attributes_set")
    if ev.write_id is not None:
        if ev.write_id in b.write_ids_new or ev.write_id in b.write_ids:
            raise b.fail(f"attribute write id {ev.write_id!r} repeats")
        b.write_ids_new[ev.write_id] = b.seq
    if not ev.allow_reserved:
        for change in ev.changes:
            if change.key.startswith("$"):
                raise b.fail(f"attribute key {change.key!r} uses the reserved prefix")
    _merge_attributes(b, ev.changes)
    _check_attributes(b)


def _on_progress_recorded(b: _Builder, ev: ProgressRecorded, at: datetime) -> None:
    b.require_live("progress_recorded")
    if ev.progress_id in b.progress_new or ev.progress_id in b.progress:
        raise b.fail(f"progress id {ev.progress_id!r} repeats")
    b.progress_new[ev.progress_id] = ev


def _on_child_linked(b: _Builder, ev: ChildLinked, at: datetime) -> None:
    b.require_live("child_linked")
    if ev.reference_id in b.children_new or ev.reference_id in b.children:
        raise b.fail(f"child reference id {ev.reference_id!r} repeats")
    b.children_new[ev.reference_id] = ev


def _on_log_recorded(b: _Builder, at: datetime) -> None:
    b.require_live("log_recorded")
    b.log_count += 1


def _on_step_created(
    b: _Builder,
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
    b.live_steps.add(step_id)


def _on_step_started(
    b: _Builder,
    at: datetime,
    step_id: str,
    attempt: int,
    after_interruption: bool,
    retry: RetryPolicy | None,
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
    if retry is not None:
        step.retry = retry  # the policy from this attempt on
    step.status = "running"
    step.attempt = attempt
    if step.started_at is None:
        step.started_at = at
    if step.retry_after is not None:
        step.retry_after = None
        b.retrying.discard(step_id)
    step.updated_at = at


def _finish_step(b: _Builder, step_id: str, kind: str, at: datetime) -> StepRecord:
    step = b.steps_new.get(step_id) or b.step(step_id)
    status = step.status
    if status not in _LIVE_STEP:
        raise b.fail(f"{kind} on step {step_id!r} in state {status}")
    if b.status not in LIVE_RUN_STATUSES and status != "running":
        raise b.fail(f"{kind} on {status} step {step_id!r} after the run ended")
    b.live_steps.discard(step_id)
    if step.retry_after is not None:
        b.retrying.discard(step_id)
    step.completed_at = step.updated_at = at
    return step


def _on_step_completed(b: _Builder, at: datetime, step_id: str, output: bytes) -> None:
    step = _finish_step(b, step_id, "step_completed", at)
    step.status = "completed"
    step.output = output


def _on_step_failed(b: _Builder, at: datetime, step_id: str, error: bytes) -> None:
    step = _finish_step(b, step_id, "step_failed", at)
    step.status = "failed"
    step.error = error


def _on_step_cancelled(b: _Builder, at: datetime, step_id: str) -> None:
    b.require_live("step_cancelled")
    step = _finish_step(b, step_id, "step_cancelled", at)
    step.status = "cancelled"


def _on_step_retrying(
    b: _Builder, at: datetime, step_id: str, error: bytes, retry_after: datetime | None
) -> None:
    b.require_live("step_retrying")
    step = b.step(step_id)
    if step.status != "running":
        raise b.fail(f"step_retrying on step {step_id!r} in state {step.status}")
    if step.retry is not None and step.attempt >= step.retry.max_attempts:
        raise b.fail(f"step_retrying on step {step_id!r} past its retry budget")
    step.status = "pending"
    step.error = error
    step.retry_after = retry_after
    step.updated_at = at
    if retry_after is not None:
        b.retrying.add(step_id)


def _on_wait_created(b: _Builder, at: datetime, wait_id: str, resume_at: datetime) -> None:
    b.require_live("wait_created")
    if wait_id in b.waits_new or b.waits.raw(wait_id) is not None:
        raise b.fail(f"wait {wait_id!r} created twice")
    b.waits_new[wait_id] = WaitRecord(wait_id, resume_at, at)
    b.waiting.add(wait_id)


def _on_wait_completed(b: _Builder, at: datetime, wait_id: str) -> None:
    b.require_live("wait_completed")
    wait = b.wait(wait_id)
    if wait.status != "waiting":
        raise b.fail(f"wait_completed on wait {wait_id!r} in state {wait.status}")
    wait.status = "completed"
    wait.completed_at = at
    b.waiting.discard(wait_id)


def _hook_record(b: _Builder, hook_id: str) -> HookRecord:
    found = b.hooks_new.get(hook_id) or b.hooks.raw(hook_id)
    assert found is not None
    return found


def _on_hook_created(b: _Builder, ev: HookCreated, at: datetime) -> None:
    b.require_live("hook_created")
    if ev.hook_id in b.hooks_new or b.hooks.raw(ev.hook_id) is not None:
        raise b.fail(f"hook {ev.hook_id!r} created twice")
    for hook_id in b.active_hooks:
        if _hook_record(b, hook_id).token == ev.token:
            raise b.fail(f"hook {ev.hook_id!r} reuses the token of active hook {hook_id!r}")
    b.hooks_new[ev.hook_id] = HookRecord(ev, at)
    b.active_hooks.add(ev.hook_id)


def _on_hook_received(
    b: _Builder, at: datetime, hook_id: str, payload: bytes, delivery_id: str | None
) -> None:
    b.require_live("hook_received")
    hook = b.hook(hook_id)
    if hook.status != "active":
        raise b.fail(f"hook_received on hook {hook_id!r} in state {hook.status}")
    hook.deliveries.append(
        Delivery(sequence=b.seq, delivery_id=delivery_id, payload=payload, received_at=at)
    )


def _on_hook_disposed(b: _Builder, ev: HookDisposed, at: datetime) -> None:
    hook = b.hook(ev.hook_id)
    if hook.status != "active":
        raise b.fail(f"hook_disposed on hook {ev.hook_id!r} in state {hook.status}")
    if b.status not in LIVE_RUN_STATUSES and hook.retain_token_until is None:
        raise b.fail(f"hook_disposed on hook {ev.hook_id!r} whose token left with the run")
    hook.status = "disposed"
    b.active_hooks.discard(ev.hook_id)


def _on_hook_conflict(b: _Builder, ev: HookConflict, at: datetime) -> None:
    b.require_live("hook_conflict")
    if ev.hook_id in b.hooks_new or b.hooks.raw(ev.hook_id) is not None:
        raise b.fail(f"hook_conflict for existing hook {ev.hook_id!r}")
    b.hook_conflicts_new[ev.hook_id] = ev


_FIELD_HANDLERS: dict[type[Event], Any] = {
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
"""The handlers of the events a run repeats, by event class: each takes `(builder, at)` and the
fields it reads, by name, so that a replay of stored rows (`kernel.replay`) folds them straight
from their payloads; the fold of events calls them through `compile_event_call`."""

_HANDLERS: dict[type[Event], Any] = {
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
    **{cls: compile_event_call(cls, handler) for cls, handler in _FIELD_HANDLERS.items()},
}
"""The handler of each event class: `(builder, event, at)`."""
