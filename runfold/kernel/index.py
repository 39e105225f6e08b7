"""The records stores speak and `run_index`, the projection of a run's index rows.

A store writes `run_index(snapshot_after_append)` in the append's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Generic, Literal, TypeAlias, TypeVar

import attrs

from runfold.kernel._pmap import stored
from runfold.kernel.fast import fast_inits, frozen_factory
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, RunStatus, Snapshot

__all__ = [
    "HookClaim",
    "HookHolder",
    "Page",
    "RunIndex",
    "RunSummary",
    "Wakeup",
    "WakeupKind",
    "WorkerLease",
    "run_index",
]

WakeupKind: TypeAlias = Literal["wait", "retry", "deadline", "ready"]
"""What a `Wakeup` is for.

A wait's timer, a delayed step retry, the run's deadline, or input that reached a run of the
fleet while no worker owned it (`Snapshot.ready_at`).
"""
T = TypeVar("T")


@attrs.frozen(kw_only=True)
class RunSummary:
    """The listing row of a run, as `EventStore.list_runs` and `get_runs` return it."""

    run_id: str
    workflow_name: str
    status: RunStatus
    parent_run_id: str | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    last_sequence: int
    attributes: Mapping[str, str]
    owner_id: str | None = None
    """The worker that owns the live run (`Snapshot.owner`), or None."""
    queue_name: str | None = None
    """The queue the run was started on, or None (`Snapshot.queue_name`)."""
    priority: int = 0
    """Its priority in that queue, lower first."""
    dedup_id: str | None = None
    """Its deduplication id in that queue, or None."""


@attrs.frozen(kw_only=True)
class HookClaim:
    """A hook token a run holds; `retained_until=None` means held while the run is live."""

    token: str = attrs.field(repr=False)
    hook_id: str
    retained_until: datetime | None

    def holds_at(self, moment: datetime) -> bool:
        """Whether the claim still holds its token at `moment` (its retention not yet past)."""
        return self.retained_until is None or self.retained_until > moment


@attrs.frozen(kw_only=True)
class HookHolder:
    """Who holds a hook token (what `EventStore.find_hook` returns)."""

    run_id: str
    hook_id: str
    retained_until: datetime | None


@attrs.frozen(kw_only=True)
class Wakeup:
    """Something of a live run due at `due_at`.

    A wait, a delayed step retry, the deadline, or input for the fleet (`ready`).
    `subject_id` is the wait id, the step id, or the run id for a deadline and for `ready`.
    """

    run_id: str
    kind: WakeupKind
    subject_id: str
    due_at: datetime


@attrs.frozen(kw_only=True)
class Page(Generic[T]):
    """One page of a listing; pass `cursor` back to get the next one."""

    items: tuple[T, ...]
    cursor: str | None
    has_more: bool


@attrs.frozen(kw_only=True)
class RunIndex:
    """Every index row of one run, replaced as a whole on each append."""

    summary: RunSummary
    hooks: tuple[HookClaim, ...]
    wakeups: tuple[Wakeup, ...]

    def claims_at(self, moment: datetime) -> tuple[HookClaim, ...]:
        """The hook claims that hold their token at `moment`: what a store's token index keeps.

        An expired claim (a late append to an ended run) holds nothing and displaces no one; of
        two claims of one token the last one counts, as a row keyed by token would.
        """
        if not self.hooks:  # most runs: no dict to build on every append
            return ()
        return tuple({c.token: c for c in self.hooks if c.holds_at(moment)}.values())


@attrs.frozen(kw_only=True)
class WorkerLease:
    """A worker of a fleet as the store knows it: it holds its runs until `lease_until`.

    The worker renews it while it lives; once it lapsed it is never renewed again, and the
    runs the worker owns may be taken over (`EventStore`'s `orphaned_runs`).
    """

    worker_id: str
    lease_until: datetime
    started_at: datetime


fast_inits([RunSummary, HookClaim, HookHolder, Wakeup, RunIndex])
_make_summary = frozen_factory(RunSummary)
"""`RunSummary` from every field in order: `run_index` makes one per append."""
_make_index = frozen_factory(RunIndex)
"""`RunIndex(summary, hooks, wakeups)`, positional."""


def run_index(snapshot: Snapshot) -> RunIndex:
    """The index rows of a run, derived from its snapshot alone.

    While the run is live its active hooks hold their tokens (`retained_until=None`); once it
    ended, only active hooks with `retain_token_until` keep holding theirs until then. Wakeups
    exist only while the run is live. Cost: O(open work), never O(history). Pure and
    deterministic: the same snapshot always gives the same rows.
    """
    live = snapshot.status in LIVE_RUN_STATUSES
    # Positional (`_make_summary`, `_make_index`): every append derives its run's rows.
    summary = _make_summary(
        snapshot.run_id,
        snapshot.workflow_name,
        snapshot.status,
        snapshot.parent_run_id,
        snapshot.created_at,
        snapshot.updated_at,
        snapshot.completed_at,
        snapshot.last_sequence,
        snapshot.attributes,
        owner.owner_id if (owner := snapshot.owner) is not None and live else None,
        snapshot.queue_name,
        snapshot.priority,
        snapshot.dedup_id,
    )
    claims = []
    for hook_id in sorted(snapshot.active_hook_ids) if snapshot.active_hook_ids else ():
        hook = stored(snapshot.hooks, hook_id)
        if hook is None:
            continue
        if live:
            claims.append(HookClaim(token=hook.token, hook_id=hook_id, retained_until=None))
        elif hook.retain_token_until is not None:
            claims.append(
                HookClaim(token=hook.token, hook_id=hook_id, retained_until=hook.retain_token_until)
            )
    due = snapshot.wakeups()
    wakeups = (
        tuple(
            Wakeup(run_id=snapshot.run_id, kind=w.kind, subject_id=w.subject_id, due_at=w.due_at)
            for w in due
        )
        if due
        else ()  # most appends: no generator to make for nothing
    )
    return _make_index(summary, tuple(claims) if claims else (), wakeups)
