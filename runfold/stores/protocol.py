"""The `EventStore` protocol (the store contract page of the docs): what every store offers.

A store keeps, per run, an append-only list of encoded events numbered 1, 2, 3 … and the run's
index rows, which the kernel computes (`run_index`). It knows no workflow rules; its one job is to
make "check the head, then append (events and index rows)" atomic, plus the one cross-run rule:
a live hook token is held by one hook only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from datetime import datetime
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

import attrs

from runfold.kernel import (
    Envelope,
    Event,
    HookHolder,
    Limits,
    Page,
    RunIndex,
    RunStatus,
    RunSummary,
    Snapshot,
    Wakeup,
    project_run,
)
from runfold.kernel.limits import DEFAULT_LIMITS

__all__ = [
    "EventStore",
    "FeedSubscriber",
    "IndexRewriter",
    "ReplayedRun",
    "Replayer",
    "SchemaMigrator",
    "replay_run",
]


@runtime_checkable
class EventStore(Protocol):
    """An async store of run histories and their index rows; stores are async context managers.

    Every method of a closed store raises `StoreClosed`; a store that cannot be reached raises
    `StoreUnavailable` (transient: safe to retry). Every method refuses an argument the contract
    does not allow (a type, a range, a naive time, text UTF-8 cannot encode) with
    `InvalidArgument`, a `ValueError`, before any I/O and before `StoreClosed`: the checks of
    `runfold.stores.arguments`, one per method, called first thing (`StoreBase` calls them for
    a store built on it). `runfold.conformance.StoreConformance` checks a store against this
    contract.
    """

    async def append_if_sequence(
        self,
        run_id: str,
        expected_sequence: int,
        events: Sequence[Event],
        *,
        index: RunIndex,
        recorded_at: datetime,
        expected_position: int | None = None,
    ) -> list[Envelope]:
        """Append `events` and replace the index rows, if the run's head is `expected_sequence`.

        All or nothing: the events get sequences `expected_sequence + 1 …` and the run's index
        rows become `index`, in one atomic step, or nothing is written.

        Args:
            run_id: The run to append to.
            expected_sequence: The head the caller decided on; 0 means the run must not exist.
            events: The events to append, at least one.
            index: The run's index rows after the append (`run_index` of the new snapshot).
            recorded_at: Stamped on every envelope; hook retention is judged at this time.
            expected_position: The feed position of the event at `expected_sequence`, when the
                caller knows it. The append then also conflicts when the run's head event is
                another one: the run was deleted (retention) and created again since the caller
                read it, and a decision made on the old run must not land in the new one. A
                position is never handed out twice, so it names one incarnation of a run.
                Ignored when `expected_sequence` is 0.

        Returns:
            The envelopes written, in sequence order.

        Raises:
            SequenceConflict: The head is not `expected_sequence` (`actual` says what it is),
                or its event's position is not `expected_position`.
            TokenConflict: A token in `index` is held by another run's live or retained hook.
            InvalidArgument: `events` is empty, or `index` is another run's.
        """
        ...

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """The run's envelopes after `after`, in sequence order, at most `limit`; `[]` if unknown.

        Descending, the envelopes come newest first, below `after` when `after > 0`.

        Raises:
            CorruptEvent: A stored event of the run does not decode.
        """
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
        """Run summaries, newest first (`created_at`, then `run_id`); pass `cursor` back for more.

        Filters combine. A page never repeats or skips a run, even while runs are created.

        Raises:
            InvalidArgument: `cursor` is not one this store made.
        """
        ...

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids; one query however many ids."""
        ...

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """The live holder of a hook token, or None.

        A hook retained past its run's end holds its token until `retained_until` (judged at
        `now`); after that the token is free.
        """
        ...

    async def list_hooks(
        self,
        *,
        run_id: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime,
    ) -> Page[HookHolder]:
        """Live and still-retained hooks (at `now`), by `(run_id, hook_id)`, a page at a time.

        Raises:
            InvalidArgument: `cursor` is not one this store made.
        """
        ...

    async def due_wakeups(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[Wakeup]:
        """Wakeups with `due_at <= now`, oldest first (then run id, kind, subject id).

        With `workflow_names`, only those of runs of these workflows: the filter is part of the
        query, so a page is never filled by other workflows' wakeups (services sharing a store
        each ask for their own).
        """
        ...

    async def next_wakeup(self, *, workflow_names: Collection[str] | None = None) -> Wakeup | None:
        """The earliest pending wakeup (of a run of `workflow_names`, when given), or None."""
        ...

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The global feed: envelopes of every run after `after_position`, in position order.

        No event may later appear with a position below one already returned, so a tailing
        reader never skips one.
        """
        ...

    async def delete_runs(
        self, *, terminal_before: datetime, limit: int, run_ids: Collection[str] | None = None
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before`, with all their rows.

        With `run_ids`, only runs among those (an operator deleting one run by id); the rules
        are the same. Retention: a run whose hook still retains its token past
        `terminal_before` is kept.
        Deleted run ids and freed tokens may be used again.

        Returns:
            How many runs were deleted.
        """
        ...

    async def close(self) -> None:
        """Release connections; later calls raise `StoreClosed`, and closing again is harmless."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class IndexRewriter(Protocol):
    """The optional store capability `runfold verify --rebuild-index` needs.

    Every bundled store offers it, and the conformance kit checks it
    (`Capabilities(rewrite_index=True)`). It replaces a run's index rows without appending,
    fenced on the run's head.
    """

    async def rewrite_index(self, run_id: str, index: RunIndex | None, *, now: datetime) -> None:
        """Replace the run's index rows with `index` (None: remove them), appending nothing.

        Raises:
            SequenceConflict: `index` does not describe the run's head
                (`index.summary.last_sequence`; 0, no events, for None).
            TokenConflict: Another run's live or retained hook holds a token of `index` at
                `now`.
            InvalidArgument: `index` is another run's.
        """
        ...


@runtime_checkable
class SchemaMigrator(Protocol):
    """The optional store capability `runfold migrate` needs: a versioned schema.

    A store that keeps its data in a schema of its own creates or migrates it when opened for
    writing, and says from which version. `SQLiteStore` and `PostgresStore` offer it.
    """

    @property
    def schema_version(self) -> int:
        """The schema version this runfold writes and reads."""
        ...

    @property
    def migrated_from(self) -> int | None:
        """The version the store last migrated from (0: it created the schema), or None.

        None while it has migrated nothing: the schema was already at `schema_version`.
        """
        ...

    async def migrate(self) -> None:
        """Create or upgrade the schema to `schema_version`; idempotent.

        Raises:
            StoreOpenError: The schema was written by a newer runfold, or is not runfold's, or
                the store cannot write it (opened read-only).
        """
        ...


@runtime_checkable
class FeedSubscriber(Protocol):
    """The optional store capability of pushing the global feed: `subscribe`.

    `PostgresStore` offers it (`LISTEN`/`NOTIFY`); on other stores a tail polls `read_all`.
    """

    def subscribe(
        self, after_position: int = 0, *, poll_interval: float = 1.0, batch: int = 1000
    ) -> AsyncIterator[Envelope]:
        """Every envelope of the feed after `after_position`, in feed order, as it commits.

        An endless async iterator: end it with `aclose()`, e.g. via `contextlib.aclosing`. It
        reads at least every `poll_interval` seconds, `batch` envelopes at a time, and raises
        what `read_all` raises.
        """
        ...


@attrs.frozen(kw_only=True)
class ReplayedRun:
    """A run's snapshot, folded from its whole history, and where that history lies in the feed."""

    snapshot: Snapshot
    first_position: int | None
    """The feed position of the run's first event (None from a store without positions)."""
    last_position: int | None
    """The feed position of the run's last event (None from a store without positions)."""


@runtime_checkable
class Replayer(Protocol):
    """The optional store capability of folding a run's whole history as it is read.

    `replay` answers what `read` and `project_run` answer together, faster: a store that
    fetches a run's rows in bulk folds them with `project_rows`, which builds no events and no
    envelopes. `CommandHandler` loads a run it has not cached this way, and `runfold verify`
    checks each run so (both through `replay_run`). Both SQL stores offer it, and the
    conformance kit checks it (`Capabilities(replay=True)`).
    """

    async def replay(self, run_id: str, *, limits: Limits = DEFAULT_LIMITS) -> ReplayedRun | None:
        """The run's snapshot (`project_run(read(run_id), limits=limits)`) and feed positions.

        Returns:
            None for a run without events.

        Raises:
            CorruptEvent: A stored event of the run does not decode.
            HistoryError: The history breaks a law of `project_run`.
            RunNotSupported: The run was stamped by a newer kernel spec.
        """
        ...


async def replay_run(
    store: EventStore, run_id: str, *, limits: Limits = DEFAULT_LIMITS
) -> ReplayedRun | None:
    """The run's `store.replay` if the store is a `Replayer`, else the same from `read`.

    Returns:
        None for a run without events.

    Raises:
        CorruptEvent: A stored event of the run does not decode.
        HistoryError: The history breaks a law of `project_run`.
        RunNotSupported: The run was stamped by a newer kernel spec.
    """
    if isinstance(store, Replayer):
        return await store.replay(run_id, limits=limits)
    history = await store.read(run_id)
    if not history:
        return None
    return ReplayedRun(
        snapshot=project_run(history, limits=limits),
        first_position=history[0].position,
        last_position=history[-1].position,
    )
