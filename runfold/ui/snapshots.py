"""The inspector's snapshots of the runs it shows, kept and caught up with only their new events.

Folding a run's whole history costs time in proportion to it (a 100,000-event run: a fifth of a
second); a page that did so on every view, or every second while it follows a live run, would
not scale. So the app keeps the snapshots of the runs it showed last and, when a run's head has
moved, reads only the events after the snapshot and `apply`s them. Requests for a run nobody has
folded yet share one fold. A run deleted and created again has a head below the kept snapshot's,
or events that do not follow it: it is folded again from the start.
"""

from __future__ import annotations

import asyncio
import gc
from collections import OrderedDict
from datetime import datetime

from runfold.kernel import HistoryError, Snapshot, apply
from runfold.stores import EventStore
from runfold.stores.protocol import replay_run

__all__ = ["FROZEN_FROM", "KEPT_RUNS", "SnapshotCache"]

KEPT_RUNS = 32
"""How many runs' snapshots the inspector keeps (the least recently shown go first)."""
FROZEN_FROM = 10_000
"""Events from which a folded snapshot is moved out of the cycle collector's sight."""


class SnapshotCache:
    """Snapshots of recently shown runs over one store, caught up on each `get`."""

    def __init__(self, store: EventStore, *, kept: int = KEPT_RUNS) -> None:
        self._store = store
        self._kept = kept
        self._snapshots: OrderedDict[str, Snapshot] = OrderedDict()
        self._folding: dict[str, asyncio.Task[Snapshot | None]] = {}

    async def get(self, run_id: str, *, created_at: datetime | None = None) -> Snapshot | None:
        """The run's snapshot at its current head, or None for a run without events.

        `created_at`, the run's creation time as its index row says, tells a run made again
        under the same id (and grown past the kept snapshot) from the one that was kept.

        Raises what `replay_run` raises for a history that cannot be folded.
        """
        head = await self._store.head(run_id)
        if head == 0:
            self._snapshots.pop(run_id, None)
            return None
        kept = self._snapshots.get(run_id)
        if kept is not None and created_at is not None and kept.created_at != created_at:
            kept = None
        if kept is not None and kept.last_sequence <= head:
            if kept.last_sequence < head:
                newer = await self._store.read(run_id, after=kept.last_sequence)
                try:
                    kept = apply(kept, newer)
                except HistoryError:  # not the run we folded: deleted and created again
                    kept = None
            if kept is not None:
                self._keep(run_id, kept)
                return kept
        return await self._fold(run_id)

    async def _fold(self, run_id: str) -> Snapshot | None:
        task = self._folding.get(run_id)
        if task is None:
            task = asyncio.ensure_future(self._replay(run_id))
            self._folding[run_id] = task
            task.add_done_callback(lambda _: self._folding.pop(run_id, None))
        return await asyncio.shield(task)

    async def _replay(self, run_id: str) -> Snapshot | None:
        replayed = await replay_run(self._store, run_id)
        if replayed is None:
            return None
        self._keep(run_id, replayed.snapshot)
        if replayed.snapshot.last_sequence >= FROZEN_FROM:
            gc.freeze()
        return replayed.snapshot

    def _keep(self, run_id: str, snapshot: Snapshot) -> None:
        self._snapshots[run_id] = snapshot
        self._snapshots.move_to_end(run_id)
        while len(self._snapshots) > self._kept:
            self._snapshots.popitem(last=False)
