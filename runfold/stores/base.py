"""`StoreBase`: the `EventStore` contract written once, for stores to build on (optional).

A store that derives from `StoreBase` writes only what is its own: one hook per method of the
protocol, named after it with a leading underscore (`append_if_sequence` → `_append_if_sequence`,
as eventsourcing's recorders have `insert_events` → `_insert_events`), and `close`. The public
methods are `StoreBase`'s: each runs the method's argument check (`runfold.stores.arguments`)
first, so the store refuses what the contract refuses, the same way as every other store and
before any I/O, then calls the hook with every argument in order, defaults filled in. A hook
takes its arguments positionally only, so a subclass that passes some of them on untouched may
take them as `*rest`.

`EventStore` stays the contract a third-party store meets: deriving from `StoreBase` is one way
to meet it, never a requirement. `runfold.testing.DelegatingStore` is the base of wrappers, a
`StoreBase` whose hooks pass each call on to another store.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from datetime import datetime
from types import TracebackType
from typing import Self

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
from runfold.stores import arguments

__all__ = ["StoreBase"]


class StoreBase(abc.ABC):
    """An `EventStore` whose public methods check their arguments, then call the store's hooks.

    A subclass writes `close` and the hooks below; it is then an `EventStore`, and an async
    context manager that closes itself on exit. The public methods' documentation is
    `EventStore`'s; a hook is given arguments that passed its method's check, and raises what
    the method raises (`SequenceConflict`, `StoreClosed`, …) but the check's `InvalidArgument`.
    """

    __slots__ = ()

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
        """Check the arguments, then `_append_if_sequence` (`EventStore.append_if_sequence`)."""
        arguments.check_append_if_sequence(
            run_id,
            expected_sequence,
            events,
            index=index,
            recorded_at=recorded_at,
            expected_position=expected_position,
        )
        return await self._append_if_sequence(
            run_id, expected_sequence, events, index, recorded_at, expected_position
        )

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """Check the arguments, then `_read` (`EventStore.read`)."""
        arguments.check_read(run_id, after=after, limit=limit, descending=descending)
        return await self._read(run_id, after, limit, descending)

    async def head(self, run_id: str) -> int:
        """Check the argument, then `_head` (`EventStore.head`)."""
        arguments.check_head(run_id)
        return await self._head(run_id)

    async def read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[Envelope]:
        """Check the arguments, then `_read_by_correlation` (`EventStore.read_by_correlation`)."""
        arguments.check_read_by_correlation(
            run_id, correlation_id, after=after, limit=limit, descending=descending
        )
        return await self._read_by_correlation(run_id, correlation_id, after, limit, descending)

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
        """Check the arguments, then `_list_runs` (`EventStore.list_runs`)."""
        arguments.check_list_runs(
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
        )
        return await self._list_runs(
            workflow_name, status, parent_run_id, created_before, cursor, limit
        )

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """Check the argument, then `_get_runs` (`EventStore.get_runs`)."""
        arguments.check_get_runs(run_ids)
        return await self._get_runs(run_ids)

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """Check the arguments, then `_find_hook` (`EventStore.find_hook`)."""
        arguments.check_find_hook(token, now=now)
        return await self._find_hook(token, now)

    async def list_hooks(
        self,
        *,
        run_id: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime,
    ) -> Page[HookHolder]:
        """Check the arguments, then `_list_hooks` (`EventStore.list_hooks`)."""
        arguments.check_list_hooks(run_id=run_id, cursor=cursor, limit=limit, now=now)
        return await self._list_hooks(run_id, cursor, limit, now)

    async def due_wakeups(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[Wakeup]:
        """Check the arguments, then `_due_wakeups` (`EventStore.due_wakeups`)."""
        arguments.check_due_wakeups(now, limit=limit, workflow_names=workflow_names)
        return await self._due_wakeups(now, limit, workflow_names)

    async def next_wakeup(self, *, workflow_names: Collection[str] | None = None) -> Wakeup | None:
        """Check the argument, then `_next_wakeup` (`EventStore.next_wakeup`)."""
        arguments.check_next_wakeup(workflow_names=workflow_names)
        return await self._next_wakeup(workflow_names)

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """Check the arguments, then `_read_all` (`EventStore.read_all`)."""
        arguments.check_read_all(after_position=after_position, limit=limit)
        return await self._read_all(after_position, limit)

    async def delete_runs(
        self, *, terminal_before: datetime, limit: int, run_ids: Collection[str] | None = None
    ) -> int:
        """Check the arguments, then `_delete_runs` (`EventStore.delete_runs`)."""
        arguments.check_delete_runs(terminal_before=terminal_before, limit=limit, run_ids=run_ids)
        return await self._delete_runs(terminal_before, limit, run_ids)

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections; later calls raise `StoreClosed`, and closing again is harmless."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- the hooks a store writes -------------------------------------------------------------

    @abc.abstractmethod
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
        """Append `events` if the run's head is `expected_sequence`, with the index rows."""

    @abc.abstractmethod
    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        """The run's envelopes in the range `after`, `limit`, `descending` says."""

    @abc.abstractmethod
    async def _head(self, run_id: str, /) -> int:
        """The run's last sequence; 0 for an unknown run."""

    @abc.abstractmethod
    async def _read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        after: int,
        limit: int | None,
        descending: bool,
        /,
    ) -> list[Envelope]:
        """The run's envelopes of `correlation_id`, in the range as in `_read`."""

    @abc.abstractmethod
    async def _list_runs(
        self,
        workflow_name: str | None,
        status: RunStatus | None,
        parent_run_id: str | None,
        created_before: datetime | None,
        cursor: str | None,
        limit: int,
        /,
    ) -> Page[RunSummary]:
        """A page of run summaries, newest first (`cursor` still to decode)."""

    @abc.abstractmethod
    async def _get_runs(self, run_ids: Sequence[str], /) -> list[RunSummary | None]:
        """Summaries in the order asked, None for unknown ids."""

    @abc.abstractmethod
    async def _find_hook(self, token: str, now: datetime, /) -> HookHolder | None:
        """The live holder of a hook token at `now`, or None."""

    @abc.abstractmethod
    async def _list_hooks(
        self, run_id: str | None, cursor: str | None, limit: int, now: datetime, /
    ) -> Page[HookHolder]:
        """A page of live and still-retained hooks at `now` (`cursor` still to decode)."""

    @abc.abstractmethod
    async def _due_wakeups(
        self, now: datetime, limit: int, workflow_names: Collection[str] | None, /
    ) -> list[Wakeup]:
        """Wakeups due at `now`, oldest first, at most `limit`."""

    @abc.abstractmethod
    async def _next_wakeup(self, workflow_names: Collection[str] | None, /) -> Wakeup | None:
        """The earliest pending wakeup, or None."""

    @abc.abstractmethod
    async def _read_all(self, after_position: int, limit: int, /) -> list[Envelope]:
        """The global feed after `after_position`, in position order."""

    @abc.abstractmethod
    async def _delete_runs(
        self, terminal_before: datetime, limit: int, run_ids: Collection[str] | None, /
    ) -> int:
        """Delete up to `limit` runs that ended before `terminal_before`; how many were."""
