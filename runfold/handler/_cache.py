"""The runs a `CommandHandler` decides on: an LRU of snapshots, fenced and caught up by reads."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import attrs

from runfold.kernel import Command, CreateRun, Envelope, Limits, Snapshot, StartRun, apply
from runfold.kernel.fast import fast_init
from runfold.stores.protocol import EventStore, replay_run

__all__ = ["ABSENT", "Cached", "RunCache"]


@fast_init
@attrs.frozen
class Cached:
    """A run as the handler last knew it.

    `snapshot` None: the run had no history. `first_position` and `head_position` are the feed
    positions of its first and last events (None when the store gives none): the first names
    this incarnation of the run (retention may delete it and the id be used again), the last
    fences appends decided on the snapshot (`expected_position`).
    """

    snapshot: Snapshot | None
    first_position: int | None = None
    head_position: int | None = None

    @property
    def fenced(self) -> bool:
        """Whether an append decided on this snapshot can go without reading first.

        It can when the store checks both its head and its incarnation (a run it lacks must
        still not exist).
        """
        return self.snapshot is None or self.head_position is not None


ABSENT = Cached(None)
"""A run with no history."""


class RunCache:
    """Up to `size` runs of `store` as last known (0: none; every command then reads the run)."""

    def __init__(self, store: EventStore, limits: Limits, size: int) -> None:
        self.store = store
        self.limits = limits
        self.size = size
        self._runs: OrderedDict[str, Cached] = OrderedDict()

    def get(self, run_id: str) -> Cached | None:
        """The run as cached, or None."""
        return self._runs.get(run_id)

    def fenced(self, run_id: str) -> Cached | None:
        """The run as cached if the next append is fenced by it (as `load` takes it), else None."""
        cached = self._runs.get(run_id)
        if cached is None or not cached.fenced:
            return None
        self._runs.move_to_end(run_id)
        return cached

    async def load(self, run_id: str, commands: Sequence[Command]) -> tuple[Cached, bool]:
        """The run, and whether it was read from the store just now.

        As cached when the next append is fenced by it, else as the store has it.
        A run not cached that `commands` begin by creating is taken to be new without a read:
        the append at sequence 0 holds only if it is, and if it is not, the conflict makes the
        handler read it and decide again, as for any run that moved.
        """
        cached = self._runs.get(run_id)
        if cached is None:
            if _creates_run(commands[0]) if commands else False:
                return ABSENT, False
            return await self.read(run_id), True
        if not cached.fenced:
            return await self.catch_up(run_id, cached), True
        self._runs.move_to_end(run_id)
        return cached, False

    async def read(self, run_id: str) -> Cached:
        """The run read whole from the store and folded (`replay_run`), and remembered."""
        replayed = await replay_run(self.store, run_id, limits=self.limits)
        if replayed is None:
            self.remember(run_id, ABSENT)
            return ABSENT
        found = Cached(replayed.snapshot, replayed.first_position, replayed.last_position)
        self.remember(run_id, found)
        return found

    async def catch_up(self, run_id: str, cached: Cached) -> Cached:
        """`cached` with what was appended since, or the run read afresh.

        Afresh when `cached` is not this incarnation of it any more (retention deleted the run,
        perhaps it was created again): the last event it knows must still be there, the same
        one.
        """
        known = cached.snapshot
        if known is None:
            return await self.read(run_id)
        tail = await self.store.read(run_id, after=known.last_sequence - 1)
        last = tail[0] if tail else None
        same = last is not None and last.sequence == known.last_sequence
        if same and cached.head_position is not None:
            same = last.position == cached.head_position  # type: ignore[union-attr]
        elif same:  # a store without positions: the best evidence left is the time
            same = last.recorded_at == known.updated_at  # type: ignore[union-attr]
        if not same:
            self._runs.pop(run_id, None)
            return await self.read(run_id)
        if len(tail) == 1:
            self._runs.move_to_end(run_id)
            return cached
        caught_up = Cached(
            apply(known, tail[1:], limits=self.limits), cached.first_position, tail[-1].position
        )
        self.remember(run_id, caught_up)
        return caught_up

    def remember(self, run_id: str, found: Cached) -> None:
        """Keep `found` as the run's latest, unless a fresher one of it is kept already."""
        if self.size == 0:
            return
        cached = self._runs.get(run_id)
        if (
            cached is not None
            and cached.snapshot is not None
            and found.snapshot is not None
            and cached.first_position == found.first_position
            and cached.snapshot.last_sequence > found.snapshot.last_sequence
        ):
            return  # a slower task must not replace a fresher snapshot of the same run
        self._runs[run_id] = found
        self._runs.move_to_end(run_id)
        while len(self._runs) > self.size:
            self._runs.popitem(last=False)

    async def missed(
        self, run_id: str, before: Snapshot | None, known_sequence: int | None
    ) -> tuple[Envelope, ...]:
        """What was appended after `known_sequence` up to `before`'s head."""
        if known_sequence is None or before is None or before.last_sequence <= known_sequence:
            return ()
        return tuple(
            await self.store.read(
                run_id, after=known_sequence, limit=before.last_sequence - known_sequence
            )
        )


def _creates_run(command: Command) -> bool:
    """Whether `command` creates its run (so the run is usually new)."""
    return isinstance(command, CreateRun) or (
        isinstance(command, StartRun) and command.create is not None
    )
