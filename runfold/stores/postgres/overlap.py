"""How large a group commit must be to start beside another: chosen by the rate each size gives.

Two group commits in flight at once overlap one's statements with the other's WAL flush, and the
client's encoding with the server's work, but pay a transaction and a flush each. Which wins
depends on the machine, and changes with it: where a commit's flush is quick and the cores have
time to spare, two groups of four write more appends per second than one group of eight; where
flushes are slow (they queue one behind the other) or the cores are busy anyway, the one larger
group does. So the writer does not fix the size: `OverlapChooser` tries each candidate in turn
while the store is busy, keeps the one that wrote more appends per busy second, and tries the
other again now and then, since the machine's state moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CANDIDATES", "EPOCHS_KEPT", "EPOCH_SECONDS", "OverlapChooser"]

CANDIDATES = (4, 16)
"""The smallest group commit allowed to start beside another, from which the chooser picks.

From four, two groups side by side can beat one twice their size; sixteen or more puts eight
writers in one group at a time."""
EPOCH_SECONDS = 0.2
"""Busy seconds a candidate is measured over.

Hundreds of group commits, so that a few slow ones (a collection, a checkpoint) do not decide;
with much shorter epochs the choice flapped with the noise."""
EPOCHS_KEPT = 8
"""Epochs the better candidate keeps before the other one is measured again."""


class OverlapChooser:
    """Picks `overlap` among `CANDIDATES` by the appends written per busy second under each.

    The writer reports each write's appends (`written`) and when it starts and stops being busy
    (`busy`, `idle`); only busy time counts, so that a quiet spell does not count against the
    candidate in use.
    """

    def __init__(
        self,
        candidates: tuple[int, ...] = CANDIDATES,
        *,
        epoch: float = EPOCH_SECONDS,
        kept: int = EPOCHS_KEPT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """A chooser among `candidates`, measuring each over `epoch` busy seconds."""
        self._candidates = candidates
        self._epoch = epoch
        self._kept = kept
        self._clock = clock
        self._rates: dict[int, float] = {}  # the last rate measured for each candidate
        self.overlap = candidates[0]
        """The candidate in use."""
        self._appends = 0  # written in this epoch
        self._busy_time = 0.0  # busy seconds in this epoch, but for the spell in progress
        self._busy_since: float | None = None  # start of the busy spell in progress
        self._stayed = 0  # epochs in a row on the best candidate

    def busy(self) -> None:
        """The writer has a write in flight, from now on."""
        if self._busy_since is None:
            self._busy_since = self._clock()

    def idle(self) -> None:
        """The writer has nothing in flight or queued, from now on."""
        if self._busy_since is not None:
            self._busy_time += self._clock() - self._busy_since
            self._busy_since = None

    def written(self, appends: int) -> None:
        """A write of `appends` appends ended; an epoch that is over picks the next candidate."""
        self._appends += appends
        now = self._clock()
        busy_time = self._busy_time
        if self._busy_since is not None:
            busy_time += now - self._busy_since
            self._busy_since = now  # what follows counts toward the next epoch, if this ends
        self._busy_time = busy_time
        if busy_time < self._epoch:
            return
        self._rates[self.overlap] = self._appends / busy_time
        self._appends = 0
        self._busy_time = 0.0
        self.overlap = self._next()

    def _next(self) -> int:
        unmeasured = [c for c in self._candidates if c not in self._rates]
        if unmeasured:
            return unmeasured[0]
        best = max(self._candidates, key=self._rates.__getitem__)
        if best != self.overlap:
            self._stayed = 0
            return best
        self._stayed += 1
        others = [c for c in self._candidates if c != best]
        if self._stayed < self._kept or not others:
            return best
        # Measure the runner-up again: what was slower a while ago may be faster now.
        self._stayed = 0
        return max(others, key=self._rates.__getitem__)
