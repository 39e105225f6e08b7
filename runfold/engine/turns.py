"""`DriveTurns`: one drive of a run at a time in one engine, and never from behind.

Two drives of one run in one engine (a worker's, and one that a delivery or a child's end
started) would share the run's workflow state and race on it; waiting for the other instead
could wait for ever (a step body delivering to its own run). So a drive asked for while another
of the engine drives the run is folded into it: the running one drives the run once more when it
is done, and the asker gets the run as it stands. And a drive handed a snapshot read before the
engine's last drive of the run appended reads the run again first: the workflow's live state in
this process is past that snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

from runfold.kernel import Command, Snapshot

__all__ = ["REMEMBERED_RUNS", "DriveTurns"]

REMEMBERED_RUNS = 1_024
"""How many live runs an engine remembers where its last drive left."""

Driver = Callable[[Snapshot | None, tuple[Command, ...], str | None], Awaitable[Snapshot]]
"""Drives a run once from a snapshot (None: a new run) with pending commands, displacing an
owner or not."""


class _Turn:
    """A run being driven; `again`: drive it once more when done."""

    __slots__ = ("again",)

    def __init__(self) -> None:
        self.again = False


class DriveTurns:
    """The runs an engine's drives are driving, and where its last drives left live runs."""

    __slots__ = ("_driving", "_left_at", "_read")

    def __init__(self, read: Callable[[str], Awaitable[Snapshot]]) -> None:
        self._read = read  # the run as it stands (the handler's `snapshot`)
        self._driving: dict[str, _Turn] = {}
        self._left_at: OrderedDict[str, int] = OrderedDict()

    async def drive(
        self,
        run_id: str,
        snapshot: Snapshot | None,
        pending: tuple[Command, ...],
        displacing: str | None,
        driver: Driver,
    ) -> Snapshot:
        """Drive the run with `driver` in its turn (see the module); the run where it left."""
        turn = self._driving.get(run_id)
        if turn is not None:
            turn.again = True
            return await self._read(run_id)
        turn = self._driving[run_id] = _Turn()
        try:
            left_at = self._left_at.get(run_id)
            if snapshot is not None and left_at is not None and snapshot.last_sequence < left_at:
                snapshot = await self._read(run_id)
            while True:
                turn.again = False
                done = await driver(snapshot, pending, displacing)
                if not turn.again or done.is_terminal:
                    self._left(run_id, done)
                    return done
                snapshot, pending, displacing = await self._read(run_id), (), None
        finally:
            del self._driving[run_id]

    def _left(self, run_id: str, done: Snapshot) -> None:
        left_at = self._left_at
        if done.is_terminal:
            left_at.pop(run_id, None)
            return
        left_at[run_id] = done.last_sequence
        left_at.move_to_end(run_id)
        if len(left_at) > REMEMBERED_RUNS:
            left_at.popitem(last=False)
