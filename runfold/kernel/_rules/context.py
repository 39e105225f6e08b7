"""What every rule of `decide` is given: the run, the time and the limits, and the field checks.

A rule takes a `RuleContext` and its command and returns the events the command means on the run
(`NewEvents`; `NOOP` when the command already took effect), or raises a `Rejection`. The context
is a `FieldCheck` of the limits as well, for a check that needs the run (how many attributes a
`SetAttributes` would leave), and it makes the refusals every family of rules shares: no run
(`RunNotFound`), or a run that ended (`TerminalState`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from runfold.kernel._rules.fields import FieldCheck
from runfold.kernel.errors import RunNotFound, TerminalState
from runfold.kernel.events import Event
from runfold.kernel.index import HookHolder
from runfold.kernel.limits import Limits
from runfold.kernel.snapshot import LIVE_RUN_STATUSES, Snapshot

__all__ = ["NOOP", "NewEvents", "Rule", "RuleContext"]

NewEvents = tuple[Event, ...]
"""The events a rule decides on, in the order they are to be appended."""
NOOP: NewEvents = ()
"""No events: the command already took effect (`Decision(idempotent=True)`)."""


class RuleContext(FieldCheck):
    """What every rule needs: the snapshot (None for no history), the time and the limits.

    Being a `FieldCheck` of those limits, it also validates the command's fields.
    """

    __slots__ = ("now", "snapshot", "token_holder")

    def __init__(
        self,
        snapshot: Snapshot | None,
        run_id: str | None,
        now: datetime,
        limits: Limits,
        token_holder: HookHolder | None,
    ) -> None:
        self.snapshot = snapshot
        self.run_id = run_id
        self.now = now
        self.limits = limits
        self.token_holder = token_holder

    def run(self) -> Snapshot:
        """The run's snapshot; `RunNotFound` when the run has no history."""
        if self.snapshot is None:
            raise RunNotFound(f"run {self.run_id!r} not found", run_id=self.run_id)
        return self.snapshot

    def terminal(self, doing: str) -> TerminalState:
        """The `TerminalState` refusal of `doing` something to the ended run, to raise."""
        snap = self.run()
        return TerminalState(
            f"cannot {doing} run {snap.run_id!r} in terminal state {snap.status!r}",
            run_id=snap.run_id,
        )

    def live_run(self, doing: str) -> Snapshot:
        """The run's snapshot if the run is live; otherwise refuses `doing` with `TerminalState`."""
        snap = self.run()
        if snap.status not in LIVE_RUN_STATUSES:
            raise self.terminal(doing)
        return snap


Rule = Callable[[RuleContext, Any], NewEvents]
"""The rule of one command class: the events it means on the run, or a `Rejection` raised."""
