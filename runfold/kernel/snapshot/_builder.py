"""The builder: the mutable state of one fold, and how it becomes a frozen `Snapshot`.

A fold changes a `Builder`, never a snapshot: `start_builder` makes one from a history's first
event, `resume_builder` from the snapshot `apply` catches up, and `Builder.freeze` publishes the
result. What the builder holds of its snapshot it shares (persistent mappings, the records the
fold did not touch); what the fold adds goes into `*_new` dicts of its own, and a record is
cloned there before the fold first changes it (`Builder.step`, `wait`, `hook`), so the snapshot
it started from never changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime
from types import MappingProxyType
from typing import Any

from runfold.kernel._pmap import PView
from runfold.kernel.errors import HistoryError, RunNotSupported
from runfold.kernel.events import (
    AttributeChange,
    ChildLinked,
    Envelope,
    HookConflict,
    ProgressRecorded,
    RunCreated,
)
from runfold.kernel.fast import frozen_reader
from runfold.kernel.limits import SPEC_VERSION, Limits
from runfold.kernel.snapshot._records import (
    HookRecord,
    StepRecord,
    WaitRecord,
    WideStepRecord,
    empty_records,
    empty_values,
)
from runfold.kernel.snapshot.states import (
    LIVE_RUN_STATUSES,
    Cancellation,
    HookState,
    Ownership,
    Snapshot,
    StepState,
    WaitState,
)

__all__ = ["Builder", "check_attributes", "merge_attributes", "resume_builder", "start_builder"]


class Builder:
    """The mutable state of one fold: a snapshot's fields, and what the fold added to them.

    Records in the `*_new` dicts belong to this fold; the sets are the ids of open work, which
    `freeze` publishes as the snapshot's bookkeeping.
    """

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
        "dedup_id",
        "deployment_id",
        "error",
        "error_code",
        "frozen",
        "hook_conflicts",
        "hook_conflicts_new",
        "hooks",
        "hooks_new",
        "input",
        "limits",
        "live_steps",
        "log_count",
        "log_ids",
        "log_ids_new",
        "output",
        "owner",
        "owner_epoch",
        "parent_run_id",
        "priority",
        "progress",
        "progress_new",
        "queue_name",
        "ready_at",
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
    queue_name: str | None
    priority: int
    dedup_id: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    cancellation: Cancellation | None
    owner: Ownership | None
    owner_epoch: int
    ready_at: datetime | None
    attributes: Mapping[str, str]
    attributes_owned: bool
    log_count: int
    log_ids: PView[int, int]
    log_ids_new: dict[str, int]
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
    # The ids of open work: the snapshot's frozensets, shared until the fold first changes one
    # (`own_live_steps` …), so an event that leaves a set be copies it neither way.
    live_steps: AbstractSet[str]
    retrying: AbstractSet[str]
    waiting: AbstractSet[str]
    active_hooks: AbstractSet[str]
    frozen: Snapshot | None
    """The snapshot this builder last froze, which it then holds as a resumed builder would.

    Held, not weakly referenced: the builder holds all that snapshot holds but the snapshot
    object itself, and a weak reference cost a step more than the object's few slots."""

    def fail(self, reason: str) -> HistoryError:
        """The `HistoryError` of the event being folded, for the caller to raise."""
        return HistoryError(self.run_id, self.seq, reason)

    def require_live(self, what: str) -> None:
        """Raise the `HistoryError` of an event `what` that came after the run ended."""
        if self.status not in LIVE_RUN_STATUSES:
            raise self.fail(f"{what} after the run ended ({self.status})")

    def step(self, step_id: str) -> StepRecord:
        """The step's record for this fold to change: cloned on its first change here."""
        record = self.steps_new.get(step_id)
        if record is None:
            base = self.steps.raw(step_id)
            if base is None:
                raise self.fail(f"event for unknown step {step_id!r}")
            record = self.steps_new[step_id] = base.clone()
        return record

    def wide_step(self, step_id: str) -> WideStepRecord:
        """The step's record for this fold to change, widened to set a field most steps never set.

        A `StepRecord` has no slot for `start_id`, `retry_after` or `error`: the first fold to
        set one of a step's replaces its record with a `WideStepRecord`, which it keeps.
        """
        record = self.step(step_id)
        if isinstance(record, WideStepRecord):
            return record
        wide = self.steps_new[step_id] = record.widened()
        return wide

    def wait(self, wait_id: str) -> WaitRecord:
        """The wait's record for this fold to change: cloned on its first change here."""
        record = self.waits_new.get(wait_id)
        if record is None:
            base = self.waits.raw(wait_id)
            if base is None:
                raise self.fail(f"event for unknown wait {wait_id!r}")
            record = self.waits_new[wait_id] = base.clone()
        return record

    def hook(self, hook_id: str) -> HookRecord:
        """The hook's record for this fold to change: cloned on its first change here."""
        record = self.hooks_new.get(hook_id)
        if record is None:
            base = self.hooks.raw(hook_id)
            if base is None:
                raise self.fail(f"event for unknown hook {hook_id!r}")
            record = self.hooks_new[hook_id] = base.clone()
        return record

    def own_live_steps(self) -> set[str]:
        """The ids of the live steps, as a set of this fold's own to change."""
        ids = self.live_steps
        if type(ids) is not set:
            ids = self.live_steps = set(ids)
        return ids

    def own_retrying(self) -> set[str]:
        """The ids of the steps waiting for a retry, as a set of this fold's own to change."""
        ids = self.retrying
        if type(ids) is not set:
            ids = self.retrying = set(ids)
        return ids

    def own_waiting(self) -> set[str]:
        """The ids of the waiting waits, as a set of this fold's own to change."""
        ids = self.waiting
        if type(ids) is not set:
            ids = self.waiting = set(ids)
        return ids

    def own_active_hooks(self) -> set[str]:
        """The ids of the active hooks, as a set of this fold's own to change."""
        ids = self.active_hooks
        if type(ids) is not set:
            ids = self.active_hooks = set(ids)
        return ids

    def own_attributes(self) -> dict[str, str]:
        """The run's attributes as a dict of this fold's own, copied on the first change."""
        if not isinstance(self.attributes, dict):
            self.attributes = dict(self.attributes)
            self.attributes_owned = True
        return self.attributes

    def freeze(self) -> Snapshot:
        """The snapshot this fold ends with.

        The builder then holds that snapshot as `resume_builder` would hold it (its views, its
        sets, its attributes) and is kept as the spare: the next fold from that very snapshot
        goes on with it instead of copying every field into a new builder (`resume_builder`).
        """
        # Every field read straight off the builder (`_publish`): a snapshot is built per
        # `apply`, and attrs' keyword `__init__` of 32 fields was a tenth of a workflow step's
        # cost. A set of open work the fold did not change is still the snapshot's frozenset.
        steps_new, waits_new, hooks_new = self.steps_new, self.waits_new, self.hooks_new
        if steps_new:
            self.steps = self.steps.derive(steps_new)
            self.steps_new = {}
        if waits_new:
            self.waits = self.waits.derive(waits_new)
            self.waits_new = {}
        if hooks_new:
            self.hooks = self.hooks.derive(hooks_new)
            self.hooks_new = {}
        if self.progress_new:
            self.progress = self.progress.derive(self.progress_new)
            self.progress_new = {}
        if self.children_new:
            self.children = self.children.derive(self.children_new)
            self.children_new = {}
        if self.hook_conflicts_new:
            self.hook_conflicts = self.hook_conflicts.derive(self.hook_conflicts_new)
            self.hook_conflicts_new = {}
        if self.write_ids_new:
            self.write_ids = self.write_ids.derive(self.write_ids_new)
            self.write_ids_new = {}
        if self.log_ids_new:
            self.log_ids = self.log_ids.derive(self.log_ids_new)
            self.log_ids_new = {}
        if self.attributes_owned:  # published read-only: a later change copies it first
            self.attributes = MappingProxyType(self.attributes)
            self.attributes_owned = False
        if type(live := self.live_steps) is set:
            self.live_steps = frozenset(live)
        if type(retrying := self.retrying) is set:
            self.retrying = frozenset(retrying)
        if type(waiting := self.waiting) is set:
            self.waiting = frozenset(waiting)
        if type(hooks := self.active_hooks) is set:
            self.active_hooks = frozenset(hooks)
        snapshot = _publish(self)
        self.frozen = snapshot
        _SPARE[:] = (self,)
        return snapshot


_SPARE: list[Builder] = []
"""The builder that froze the latest snapshot (at most one), for a fold from that snapshot to
go on with: an engine folds each decision onto the snapshot of the one before. Taken with
`list.pop`, so two folds from one snapshot never share it."""


_publish = frozen_reader(
    Snapshot,
    {
        "last_sequence": "seq",
        "attribute_write_ids": "write_ids",
        "live_step_ids": "live_steps",
        "retrying_step_ids": "retrying",
        "waiting_wait_ids": "waiting",
        "active_hook_ids": "active_hooks",
    },
)
"""The snapshot a builder holds, each field read off the builder (by its own name but these)."""


def start_builder(first: Envelope, limits: Limits) -> Builder:
    """The builder of a history's first event, which must be `run_created` at sequence 1.

    Raises `HistoryError` for any other first event, and `RunNotSupported` for a run stamped by
    a newer kernel spec.
    """
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
    b = Builder()
    b.frozen = None
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
    b.queue_name, b.priority, b.dedup_id = ev.queue_name, ev.priority, ev.dedup_id
    b.output = b.error = b.error_code = None
    b.created_at = b.updated_at = first.recorded_at
    b.started_at = b.completed_at = None
    b.cancellation = None
    b.owner, b.owner_epoch, b.ready_at = None, 0, None
    b.attributes = {}
    b.attributes_owned = True
    merge_attributes(b, tuple(AttributeChange(key=k, value=v) for k, v in ev.attributes.items()))
    check_attributes(b)
    b.log_count = 0
    b.log_ids, b.log_ids_new = empty_values(), {}
    b.steps, b.waits, b.hooks = empty_records(), empty_records(), empty_records()
    b.progress, b.children, b.write_ids = empty_values(), empty_values(), empty_values()
    b.hook_conflicts = empty_values()
    b.steps_new, b.waits_new, b.hooks_new = {}, {}, {}
    b.progress_new, b.children_new, b.write_ids_new = {}, {}, {}
    b.hook_conflicts_new = {}
    b.live_steps, b.retrying, b.waiting, b.active_hooks = set(), set(), set(), set()
    return b


def resume_builder(snapshot: Snapshot, limits: Limits) -> Builder:
    """A builder that goes on from `snapshot`, sharing what it holds and changing none of it.

    The spare builder when it froze this very snapshot (`Builder.freeze`): it holds what a
    new one would be given, without the copy of every field.
    """
    if _SPARE:
        try:
            spare = _SPARE.pop()
        except IndexError:  # another thread took it
            pass
        else:
            if spare.frozen is snapshot:
                spare.limits = limits
                return spare
    b = Builder()
    b.frozen = None
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
    b.queue_name, b.priority = snapshot.queue_name, snapshot.priority
    b.dedup_id = snapshot.dedup_id
    b.output, b.error, b.error_code = snapshot.output, snapshot.error, snapshot.error_code
    b.created_at, b.updated_at = snapshot.created_at, snapshot.updated_at
    b.started_at, b.completed_at = snapshot.started_at, snapshot.completed_at
    b.cancellation = snapshot.cancellation
    b.owner, b.owner_epoch, b.ready_at = snapshot.owner, snapshot.owner_epoch, snapshot.ready_at
    b.attributes = snapshot.attributes
    b.attributes_owned = False
    b.log_count = snapshot.log_count
    # The snapshot's mappings are the views a fold published (`PView`s of records), typed in
    # `Snapshot` by the states they hand out.
    views: Any = snapshot
    b.log_ids, b.log_ids_new = views.log_ids, {}
    b.steps, b.waits, b.hooks = views.steps, views.waits, views.hooks
    b.progress, b.children = views.progress, views.children
    b.hook_conflicts = views.hook_conflicts
    b.write_ids = views.attribute_write_ids
    b.steps_new, b.waits_new, b.hooks_new = {}, {}, {}
    b.progress_new, b.children_new, b.write_ids_new = {}, {}, {}
    b.hook_conflicts_new = {}
    b.live_steps = snapshot.live_step_ids  # copied on the fold's first change (`own_…`)
    b.retrying = snapshot.retrying_step_ids
    b.waiting = snapshot.waiting_wait_ids
    b.active_hooks = snapshot.active_hook_ids
    return b


def merge_attributes(b: Builder, changes: tuple[AttributeChange, ...]) -> None:
    """Write `changes` into the run's attributes (a value of None removes its key)."""
    attributes = b.own_attributes()
    for change in changes:
        if change.value is None:
            attributes.pop(change.key, None)
        else:
            attributes[change.key] = change.value


def check_attributes(b: Builder) -> None:
    """Raise the `HistoryError` of attributes that break the limits: count, key, value size."""
    limits = b.limits
    if len(b.attributes) > limits.max_attributes:
        raise b.fail(f"run holds {len(b.attributes)} attributes, over the limit")
    for key, value in b.attributes.items():
        if not key or len(key) > limits.max_attribute_key_length:
            raise b.fail(f"attribute key {key!r} breaks the key length limit")
        if len(value.encode()) > limits.max_attribute_value_bytes:
            raise b.fail(f"attribute {key!r} value breaks the value size limit")
