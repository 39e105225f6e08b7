"""The records the engine reports: the open work of runs, what a resumption did, and counts."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal, TypeAlias

import attrs

from runfold.kernel import Snapshot, Wakeup

__all__ = [
    "EngineSummary",
    "Resumption",
    "Suspension",
    "SuspensionKind",
    "suspension_order",
    "suspensions_of",
]

SuspensionKind: TypeAlias = Literal["wait", "retry", "deadline", "ready", "hook"]
"""What a `Suspension` waits on.

A wait, a delayed step retry, the deadline, a worker of the fleet (input reached the run while
nobody owned it), or a hook.
"""
_KIND_ORDER: dict[str, int] = {"wait": 0, "retry": 1, "deadline": 2, "ready": 3, "hook": 4}


@attrs.frozen(kw_only=True)
class Suspension:
    """Open work of a live run: a wait, a delayed retry, the deadline, or a hook.

    Each is due at `due_at`, except a hook awaiting a delivery (`due_at=None`, never `due`).
    """

    run_id: str
    kind: SuspensionKind
    subject_id: str
    due_at: datetime | None
    due: bool


@attrs.frozen(kw_only=True)
class Resumption:
    """What `Engine.resume_due` did for one run: its due wakeups, and how the drive ended.

    Either `snapshot` is where the drive ended or `error` is what stopped it; other runs are
    resumed regardless.
    """

    run_id: str
    wakeups: tuple[Wakeup, ...]
    snapshot: Snapshot | None
    error: Exception | None


@attrs.frozen(kw_only=True)
class EngineSummary:
    """Counts across the store: runs by status, and the open work of live runs."""

    runs: int
    by_status: Mapping[str, int]
    open_waits: int
    active_hooks: int
    delayed_retries: int
    due: int
    """Waits, retries and deadlines already due (what `resume_due` would pick up)."""


def suspension_order(suspension: Suspension) -> tuple[str, int, str]:
    """The sort key of suspensions: run id, then kind, then subject id."""
    return (suspension.run_id, _KIND_ORDER[suspension.kind], suspension.subject_id)


def suspensions_of(snapshot: Snapshot, now: datetime) -> list[Suspension]:
    """The open work of `snapshot` at `now` (none once it ended)."""
    if not snapshot.is_live:
        return []
    found = [
        Suspension(
            run_id=snapshot.run_id,
            kind=w.kind,
            subject_id=w.subject_id,
            due_at=w.due_at,
            due=w.due_at <= now,
        )
        for w in snapshot.wakeups()
    ]
    found.extend(
        Suspension(
            run_id=snapshot.run_id, kind="hook", subject_id=h.hook_id, due_at=None, due=False
        )
        for h in snapshot.active_hooks()
    )
    return found
