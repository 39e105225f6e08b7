"""`Schedule`: a workflow started at each tick of a cron expression, once across a fleet.

Every live worker of a fleet serving the workflow turns the ticks that passed since its last
look into runs. A tick's run has an id made from the workflow and the tick's time, and starting
a run under an existing id is idempotent, so the workers that all see a tick record one run of it,
never two; the run is queued, and one worker claims it. While at least one worker lives, no
tick is missed; ticks that fall while no worker lives are not made up for.

Cron expressions are croniter's: five fields (minute, hour, day of month, month, day of week),
or six with seconds last; times are UTC.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import attrs
from croniter import croniter

__all__ = ["Schedule"]


def _valid(instance: Schedule, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not croniter.is_valid(value):
        raise ValueError(f"{value!r} is not a cron expression")


@attrs.frozen(kw_only=True)
class Schedule:
    """Start a run of `workflow_name` at every tick of `cron`, its input `input_for(tick)`."""

    workflow_name: str
    cron: str = attrs.field(validator=_valid)
    input_for: Callable[[datetime], bytes] = attrs.field(eq=False)

    def ticks(self, after: datetime, until: datetime) -> list[datetime]:
        """The ticks later than `after` and no later than `until`, in order (UTC)."""
        found: list[datetime] = []
        times = croniter(self.cron, after.astimezone(UTC))
        while True:
            tick = times.get_next(datetime)
            if tick > until:
                return found
            found.append(tick)

    def run_id(self, tick: datetime) -> str:
        """The id of the tick's run: the same in every worker, so the run is made once."""
        return f"{self.workflow_name}@{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
