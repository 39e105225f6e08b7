"""Appends in doubt: sent, failed with `StoreUnavailable`, perhaps written; recognised when read.

An append whose reply was lost may have been written. The handler keeps what it sent (`Sent`)
and, once the store answers again, reads the run back after the head the append was fenced on:
its own events there, stamped with its own time, mean it was written, and the command's outcome
is the one it had. The fence lets at most one of several tries in.

A call that gives up (`CommitUnknown`) leaves its appends with the handler (`Doubts`), so that
the same commands executed again on the same run, by the next call, are recognised too instead
of being decided anew (where most would be refused: the run has moved past them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime

import attrs

from runfold.handler._cache import Cached, RunCache
from runfold.kernel import BatchDecision, Command, Envelope, Snapshot

__all__ = ["Doubts", "Recognised", "Sent", "moved_past", "recognise"]


@attrs.frozen
class Sent:
    """An append that failed with `StoreUnavailable`: perhaps written, until read back."""

    head: int
    batch: BatchDecision
    at: datetime
    cached: Cached
    missed: tuple[Envelope, ...]


@attrs.frozen
class Recognised:
    """An append in doubt found written: the run after it, what it wrote, what it had missed."""

    snapshot: Snapshot
    appended: tuple[Envelope, ...]
    missed: tuple[Envelope, ...]
    created_step: bool


def moved_past(cached: Cached, sent: Sequence[Sent]) -> bool:
    """Whether the run as cached has moved past the head of an append in `sent`."""
    found = cached.snapshot
    return found is not None and any(found.last_sequence > s.head for s in sent)


async def recognise(cache: RunCache, run_id: str, sent: Sequence[Sent]) -> Recognised | None:
    """Whichever of the appends in `sent` the store holds, or None.

    The run after it is remembered in `cache`. An append is recognised by what it wrote: its
    events, stamped with its time, right after the head it was fenced on.
    """
    for attempt in sent:
        events = attempt.batch.events
        tail = await cache.store.read(run_id, after=attempt.head, limit=len(events))
        if len(tail) != len(events) or any(
            envelope.event != event or envelope.recorded_at != attempt.at
            for envelope, event in zip(tail, events, strict=True)
        ):
            continue
        after = attempt.batch.snapshot
        assert after is not None
        first = attempt.cached.first_position if attempt.head else tail[0].position
        cache.remember(run_id, Cached(after, first, tail[-1].position))
        return Recognised(after, tuple(tail), attempt.missed, bool(attempt.batch.created_steps))
    return None


class Doubts:
    """The appends of calls that gave up in doubt, by run: at most `size` runs, oldest dropped.

    Each is kept with the commands it was for, so that only the same commands are answered
    from it.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._runs: OrderedDict[str, tuple[tuple[Command, ...], tuple[Sent, ...]]] = OrderedDict()

    def keep(self, run_id: str, commands: tuple[Command, ...], sent: Sequence[Sent]) -> None:
        """Keep the appends `sent` for `commands`, whose call gave up in doubt."""
        if self.size == 0 or not sent:
            return
        self._runs[run_id] = (commands, tuple(sent))
        self._runs.move_to_end(run_id)
        while len(self._runs) > self.size:
            self._runs.popitem(last=False)

    def of(self, run_id: str, commands: tuple[Command, ...]) -> tuple[Sent, ...]:
        """The appends kept for exactly `commands` on the run (empty for none)."""
        kept = self._runs.get(run_id)
        return kept[1] if kept is not None and kept[0] == commands else ()

    def settled(self, run_id: str) -> None:
        """Forget the run's appends: a call on it has read it back since."""
        self._runs.pop(run_id, None)
