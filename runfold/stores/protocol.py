"""The `EventStore` protocol (`STORES.md`): what every runfold store offers.

A store keeps, per run, an append-only list of encoded events numbered 1, 2, 3 … and the run's
index rows, which the kernel computes (`run_index`). It knows no workflow rules; its one job is to
make "check the head, then append (events and index rows)" atomic, plus the one cross-run rule:
a live hook token is held by one hook only.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from runfold.kernel import (
    Envelope,
    Event,
    HookHolder,
    Page,
    RunIndex,
    RunStatus,
    RunSummary,
    Wakeup,
)

__all__ = ["EventStore", "check_append", "decode_cursor", "encode_cursor", "time_key"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@runtime_checkable
class EventStore(Protocol):
    """An async store of run histories and their index rows. Stores are async context managers."""

    async def append_if_sequence(
        self,
        run_id: str,
        expected_sequence: int,
        events: Sequence[Event],
        *,
        index: RunIndex,
        recorded_at: datetime,
    ) -> list[Envelope]:
        """Atomically: if the run's head is `expected_sequence` (0: no such run yet), write
        `events` at `expected+1 …`, replace the run's index rows with `index`, return the
        envelopes. Otherwise raise `SequenceConflict(run_id, expected, actual)` having written
        nothing. A token in `index` held by another run's live or still-retained hook (retention
        judged at `recorded_at`) raises `TokenConflict`, also having written nothing. An empty
        `events` is a `ValueError`."""
        ...

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """The run's envelopes with `sequence > after` (or `< after` when descending and
        `after > 0`), in order, at most `limit`. Unknown run: `[]`."""
        ...

    async def head(self, run_id: str) -> int:
        """The run's last sequence; 0 for an unknown run."""
        ...

    async def read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[Envelope]:
        """The run's events whose `correlation_id` matches, in order (ranges as in `read`)."""
        ...

    async def list_runs(
        self,
        *,
        workflow_name: str | None = None,
        status: RunStatus | None = None,
        parent_run_id: str | None = None,
        created_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 20,
    ) -> Page[RunSummary]:
        """Run summaries, newest first (`created_at`, then `run_id`, descending); filters
        combine; pass `cursor` back for the next page."""
        ...

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids; one query however many ids."""
        ...

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """The live holder of a hook token, or None. A hook retained past its run's end holds
        its token until `retained_until`; after that it is free."""
        ...

    async def list_hooks(
        self,
        *,
        run_id: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime,
    ) -> Page[HookHolder]:
        """Live and still-retained hooks, by `(run_id, hook_id)`."""
        ...

    async def due_wakeups(self, now: datetime, *, limit: int = 100) -> list[Wakeup]:
        """Wakeups with `due_at <= now`, oldest first (then run id, kind, subject id)."""
        ...

    async def next_wakeup(self) -> Wakeup | None:
        """The earliest pending wakeup, or None."""
        ...

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The global feed: envelopes of every run with `position > after_position`, in
        position order; no event may later appear with a position below one returned."""
        ...

    async def delete_runs(self, *, terminal_before: datetime, limit: int) -> int:
        """Retention: delete up to `limit` terminal runs that ended before `terminal_before`,
        with their events and index rows; a run whose hook still retains its token past
        `terminal_before` is kept. Returns how many runs were deleted."""
        ...

    async def close(self) -> None:
        """Release connections; later calls raise `StoreClosed`."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def encode_cursor(*parts: str | int) -> str:
    """An opaque, URL-safe cursor from a sort key (stores share this so cursors look alike)."""
    text = "\x1f".join(str(p) for p in parts)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, count: int) -> list[str]:
    """The `count` parts of a cursor made by `encode_cursor`; `ValueError` if it is not one."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"malformed cursor {cursor!r}") from None
    parts = text.split("\x1f")
    if len(parts) != count:
        raise ValueError(f"malformed cursor {cursor!r}")
    return parts


def time_key(value: datetime) -> int:
    """Microseconds since the Unix epoch: the exact, sortable form stores keep times in."""
    return (value - _EPOCH) // timedelta(microseconds=1)


def check_append(run_id: str, events: Sequence[Event], index: RunIndex) -> None:
    """The argument rules of `append_if_sequence` every store shares: `ValueError` for an empty
    batch or an index computed for another run."""
    if not events:
        raise ValueError("append_if_sequence needs at least one event")
    if index.summary.run_id != run_id:
        raise ValueError(f"index is for run {index.summary.run_id!r}, not {run_id!r}")
