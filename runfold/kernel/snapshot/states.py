"""What a snapshot holds: the frozen `Snapshot` of a run and the states of its entities.

These are what `project_run` and `apply` publish and every reader sees: immutable classes, and
the statuses a run and each of its steps, waits and hooks move through. The snapshot's entity
mappings hold the reducer's private records and turn each into its frozen state when it is
read; nothing here builds or changes a snapshot (the `reducer` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

import attrs

from runfold.kernel._pmap import PView
from runfold.kernel.events import ChildLinked, HookConflict, ProgressRecorded, RetryPolicy

if TYPE_CHECKING:
    from runfold.kernel.snapshot._records import HookRecord, StepRecord, WaitRecord

__all__ = [
    "LIVE_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "Cancellation",
    "Delivery",
    "HookState",
    "HookStatus",
    "Ownership",
    "RunStatus",
    "Snapshot",
    "StepState",
    "StepStatus",
    "WaitState",
    "WaitStatus",
    "WakeupDue",
]

RunStatus: TypeAlias = Literal[
    "pending", "running", "cancelling", "completed", "failed", "cancelled", "timed_out"
]
"""Where a run is in its life: live (pending, running, cancelling) or ended."""
StepStatus: TypeAlias = Literal["pending", "running", "completed", "failed", "cancelled"]
"""Where a step is: pending or running while live, then completed, failed or cancelled."""
WaitStatus: TypeAlias = Literal["waiting", "completed", "cancelled"]
"""Where a wait is: waiting, then completed or cancelled."""
HookStatus: TypeAlias = Literal["active", "disposed", "cancelled"]
"""Where a hook is: active (it takes deliveries), then disposed or cancelled."""

TERMINAL_RUN_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "timed_out"})
"""The statuses of a run that has ended; only its retained hook tokens outlive it."""
LIVE_RUN_STATUSES: frozenset[str] = frozenset({"pending", "running", "cancelling"})
"""The statuses of a run that has not ended."""


# --- public, frozen states ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StepState:
    """A step as the run's history leaves it: definition, status, attempts and outcome."""

    step_id: str
    step_name: str
    status: StepStatus
    input: bytes
    retry: RetryPolicy | None
    """The latest policy: `step_created`'s, or the last one a `step_started` changed it to."""
    attempt: int
    output: bytes | None
    error: bytes | None
    retry_after: datetime | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    start_id: str | None = None
    """The `StartStep.start_id` of the command that began the latest attempt, if it had one."""


@attrs.frozen(kw_only=True)
class WaitState:
    """A wait (a durable timer) as the run's history leaves it."""

    wait_id: str
    status: WaitStatus
    resume_at: datetime
    created_at: datetime
    completed_at: datetime | None


@attrs.frozen(kw_only=True)
class Delivery:
    """One payload a hook received, at the sequence of its `hook_received` event."""

    sequence: int
    delivery_id: str | None
    payload: bytes
    received_at: datetime


@attrs.frozen(kw_only=True)
class HookState:
    """A hook as the run's history leaves it; its token is a secret kept out of its repr."""

    hook_id: str
    token: str = attrs.field(repr=False)
    status: HookStatus
    metadata: bytes | None
    is_webhook: bool
    retain_token_until: datetime | None
    created_at: datetime
    deliveries: tuple[Delivery, ...]


@attrs.frozen(kw_only=True)
class Cancellation:
    """The cancellation request of a run: why, when, and at which sequence."""

    reason: str | None
    requested_at: datetime
    sequence: int


@attrs.frozen(kw_only=True)
class Ownership:
    """Who drives a run: the worker of the run's claim number `epoch`, since `claimed_at`.

    `(owner_id, epoch)` is the fencing token: commands made on a worker's behalf carry it
    (`decide(..., acting_as=...)`) and are refused once another claim has taken the run.
    """

    owner_id: str
    epoch: int
    claimed_at: datetime


@attrs.frozen(kw_only=True)
class WakeupDue:
    """Something of a live run that becomes due at a time (exported by `run_index`)."""

    kind: Literal["wait", "retry", "deadline", "ready"]
    subject_id: str
    due_at: datetime


# --- the snapshot -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, eq=True, hash=False)
class Snapshot:
    """Where a run stands after its last event: immutable; derive newer ones with `apply`.

    `steps`, `waits`, `hooks` map ids to frozen states; `progress` and `children` map ids to the
    recording event; `attribute_write_ids` maps each attribute write id to its sequence, and
    `log_ids` each log id (`RecordLog.log_id`) to the sequence of its line.
    Entity states and `deadline` stay as they were when the run ends: what still needs a host's
    attention is `wakeups()`, empty for an ended run.
    """

    run_id: str
    status: RunStatus
    workflow_name: str
    workflow_version: str | None
    deployment_id: str | None
    input: bytes
    output: bytes | None
    error: bytes | None
    error_code: str | None
    context: bytes | None
    attributes: Mapping[str, str]
    parent_run_id: str | None
    deadline: datetime | None
    spec_version: int
    queue_name: str | None
    """The queue the run was started on (`CreateRun.queue_name`), or None."""
    priority: int
    """Its priority in that queue: lower first, 0 (the default) before any other."""
    dedup_id: str | None
    """Its deduplication id in that queue, or None."""
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    updated_at: datetime
    last_sequence: int
    cancellation: Cancellation | None
    owner: Ownership | None
    """The worker driving the run (its last claim, not released), or None."""
    owner_epoch: int
    """How many times the run was claimed: the epoch of its last claim (0: never)."""
    ready_at: datetime | None
    """When input from outside (a delivery, a cancellation request) first reached the run
    while no worker owned it, after one had; None once a worker claimed it again, and for a run
    no worker ever claimed. A fleet's worker finds such a run by its `ready` wakeup."""
    steps: PView[StepRecord, StepState]
    waits: PView[WaitRecord, WaitState]
    hooks: PView[HookRecord, HookState]
    progress: PView[ProgressRecorded, ProgressRecorded]
    children: PView[ChildLinked, ChildLinked]
    hook_conflicts: PView[HookConflict, HookConflict]
    """The `hook_conflict` of each hook id that could not be created (its token was held)."""
    attribute_write_ids: PView[int, int]
    log_count: int
    log_ids: PView[int, int]
    # Derivable bookkeeping that keeps index upkeep O(open work) instead of O(run):
    live_step_ids: frozenset[str] = attrs.field(repr=False, eq=False)
    retrying_step_ids: frozenset[str] = attrs.field(repr=False, eq=False)
    waiting_wait_ids: frozenset[str] = attrs.field(repr=False, eq=False)
    active_hook_ids: frozenset[str] = attrs.field(repr=False, eq=False)

    @property
    def is_terminal(self) -> bool:
        """True once the run completed, failed, was cancelled or timed out."""
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def is_live(self) -> bool:
        """True while the run is pending, running or cancelling."""
        return self.status in LIVE_RUN_STATUSES

    @property
    def is_suspended(self) -> bool:
        """Running or cancelling with an open wait, an active hook or a scheduled retry."""
        return self.status in ("running", "cancelling") and bool(
            self.waiting_wait_ids or self.active_hook_ids or self.retrying_step_ids
        )

    def open_waits(self) -> tuple[WaitState, ...]:
        """Waits still waiting, in creation order.

        Entity state only: an ended run keeps its waits as they were, so this still lists them
        after the run ends. A host deciding what to wake should use `wakeups()`, which is empty
        for an ended run.
        """
        return tuple(self.waits[w] for w in self.waits if w in self.waiting_wait_ids)

    def active_hooks(self) -> tuple[HookState, ...]:
        """Hooks in the `active` state, in creation order."""
        return tuple(self.hooks[h] for h in self.hooks if h in self.active_hook_ids)

    def due_retries(self, now: datetime) -> tuple[StepState, ...]:
        """Pending steps whose `retry_after` is at or before `now`, earliest first.

        Entity state only, like `open_waits`: it does not look at the run's status, so an ended
        run's delayed retries are still listed; `wakeups()` is what a host should act on.
        """
        due = []
        for step_id in self.retrying_step_ids:
            record = self.steps.raw(step_id)
            if record is not None and record.retry_after is not None and record.retry_after <= now:
                due.append(record.freeze())
        return tuple(sorted(due, key=lambda s: (s.retry_after, s.step_id)))

    def wakeups(self) -> tuple[WakeupDue, ...]:
        """What becomes due while the run is live: waits, delayed retries, the deadline."""
        if self.status not in LIVE_RUN_STATUSES:
            return ()
        if not (
            self.waiting_wait_ids
            or self.retrying_step_ids
            or self.deadline is not None
            or self.ready_at is not None
        ):
            return ()  # most appends: nothing to wake, no list to build and sort
        found: list[WakeupDue] = []
        for wait_id in self.waiting_wait_ids:
            wait = self.waits.raw(wait_id)
            if wait is not None:
                found.append(WakeupDue(kind="wait", subject_id=wait_id, due_at=wait.resume_at))
        for step_id in self.retrying_step_ids:
            step = self.steps.raw(step_id)
            if step is not None and step.retry_after is not None:
                found.append(WakeupDue(kind="retry", subject_id=step_id, due_at=step.retry_after))
        if self.deadline is not None:
            found.append(WakeupDue(kind="deadline", subject_id=self.run_id, due_at=self.deadline))
        if self.ready_at is not None:
            found.append(WakeupDue(kind="ready", subject_id=self.run_id, due_at=self.ready_at))
        found.sort(key=lambda w: (w.due_at, w.kind, w.subject_id))
        return tuple(found)
