"""The store alone: the appends one engine workflow makes, recorded, then replayed one after
another straight into a fresh store of the same backend.

One at a time, a step's wall time is the store's work (its statements, its Python, the commit)
plus the engine's, the handler's and the kernel's. Replaying the very appends the engine made,
with the same events and index rows but no engine, handler or kernel decision between them,
measures the first part alone: the engine's rate divided by the replay's says how much of a
step the store takes, and what is left is the engine's side.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from datetime import datetime

import attrs

from benchmarks.harness import Trial
from runfold import EventStore
from runfold.kernel import Envelope, Event, RunIndex
from runfold.testing.delegating import DelegatingStore

__all__ = ["Append", "RecordingStore", "renamed", "renamed_copies", "replay_trial"]

_SERIAL_DIGITS = 10
"""The digits of a replayed run's serial, which replace the end of the recorded run id."""


@attrs.frozen(kw_only=True)
class Append:
    """One `EventStore.append_if_sequence` call, with the arguments the caller gave it."""

    run_id: str
    expected_sequence: int
    events: tuple[Event, ...]
    index: RunIndex
    recorded_at: datetime
    expected_position: int | None


class RecordingStore(DelegatingStore):
    """Passes every call to `inner` and keeps each append's arguments, in order (`appends`)."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.appends: list[Append] = []

    async def _append_if_sequence(
        self,
        run_id: str,
        expected_sequence: int,
        events: Sequence[Event],
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None,
        /,
    ) -> list[Envelope]:
        """Keeps the arguments, then passes the call on."""
        self.appends.append(
            Append(
                run_id=run_id,
                expected_sequence=expected_sequence,
                events=tuple(events),
                index=index,
                recorded_at=recorded_at,
                expected_position=expected_position,
            )
        )
        return await super()._append_if_sequence(
            run_id, expected_sequence, events, index, recorded_at, expected_position
        )


def renamed(appends: Sequence[Append], run_id: str) -> list[Append]:
    """`appends`, all of one run, made to run `run_id` instead (its index rows say so too).

    Raises:
        ValueError: The appends are of several runs, or claim hook tokens, which another
            run's copy would conflict with.
    """
    if len({a.run_id for a in appends}) != 1:
        raise ValueError("the appends to rename must all be of one run")
    if any(a.index.hooks for a in appends):
        raise ValueError("appends that claim hook tokens cannot be made to another run")
    old = appends[0].run_id
    return [
        attrs.evolve(
            a,
            run_id=run_id,
            index=attrs.evolve(
                a.index,
                summary=attrs.evolve(a.index.summary, run_id=run_id),
                wakeups=tuple(
                    attrs.evolve(
                        w,
                        run_id=run_id,
                        subject_id=run_id if w.subject_id == old else w.subject_id,
                    )
                    for w in a.index.wakeups
                ),
            ),
        )
        for a in appends
    ]


_serials = itertools.count()
"""The serials of the copies' run ids: each copy a new run, in whatever file it goes to."""


def renamed_copies(workflow: Sequence[Append], count: int) -> list[list[Append]]:
    """`count` copies of `workflow`'s appends, each of a new run whose id has the recorded
    one's length (`renamed`)."""
    recorded = workflow[0].run_id
    return [
        renamed(workflow, f"{recorded[:-_SERIAL_DIGITS]}{next(_serials):0{_SERIAL_DIGITS}d}")
        for _ in range(count)
    ]


def replay_trial(
    store: EventStore, loop: asyncio.AbstractEventLoop, workflow: Sequence[Append], count: int
) -> Trial:
    """A trial that replays `workflow`'s appends `count` times, one workflow after the other,
    into `store` (fresh, of the recording's backend) on `loop`.

    Each copy is a new run whose id has the recorded one's length; the copies are made untimed
    (`Trial.prepare`). An append that named the feed position of the run's head names the
    position the copy's previous append got, as the engine does.
    """
    copies: list[list[Append]] = []

    def prepare() -> None:
        copies[:] = renamed_copies(workflow, count)

    async def one(appends: Sequence[Append]) -> None:
        position: int | None = None
        for a in appends:
            written = await store.append_if_sequence(
                a.run_id,
                a.expected_sequence,
                a.events,
                index=a.index,
                recorded_at=a.recorded_at,
                expected_position=None if a.expected_position is None else position,
            )
            position = written[-1].position

    def run() -> None:
        for appends in copies:
            loop.run_until_complete(one(appends))

    return Trial(prepare=prepare, run=run)
