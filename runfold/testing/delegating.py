"""`DelegatingStore`: an `EventStore` that passes every call to another one.

The base of test wrappers that stage what a real store does under trouble (`CrashingStore`
fails or stops around writes; a test's subclass lets other tasks in before each call) without
faking storage. Every method is written out, not forwarded by `__getattr__`, so that a wrapper
is an `EventStore` to the type checker.
"""

from __future__ import annotations

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
    WorkerLease,
)
from runfold.stores.leases import WorkerLeases
from runfold.stores.protocol import EventStore
from runfold.stores.signals import RunSignals

__all__ = ["DelegatingStore"]


_LEASE_METHODS = ("renew_lease", "drop_lease", "list_leases", "orphaned_runs")
"""The methods of `WorkerLeases`."""
_SIGNAL_METHODS = ("wait_for_work", "wait_for_end")
"""The methods of `RunSignals`."""


class DelegatingStore:
    """Passes every call to `inner` after awaiting `pause()`, which subclasses override.

    When `inner` keeps worker leases (`WorkerLeases`), so does the wrapper: it passes the four
    lease methods on too, and is a `WorkerLeases` to an `isinstance` check exactly then; the
    same for `RunSignals` (its waits go straight through, without `pause()`).
    """

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner
        # Set on the instance, not written on the class: a wrapper of a store without leases
        # (signals) must not pass for one that keeps them. A subclass's own method stays.
        if isinstance(inner, WorkerLeases):
            for name in _LEASE_METHODS:
                if not hasattr(type(self), name):
                    setattr(self, name, getattr(self, f"_forward_{name}"))
        if isinstance(inner, RunSignals):
            for name in _SIGNAL_METHODS:
                if not hasattr(type(self), name):
                    setattr(self, name, getattr(inner, name))

    async def pause(self) -> None:
        """Runs before every call but `close`; a no-op here."""

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
        """`pause()`, then the inner store's `append_if_sequence`."""
        await self.pause()
        return await self.inner.append_if_sequence(
            run_id,
            expected_sequence,
            events,
            index=index,
            recorded_at=recorded_at,
            expected_position=expected_position,
        )

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """`pause()`, then the inner store's `read`."""
        await self.pause()
        return await self.inner.read(run_id, after=after, limit=limit, descending=descending)

    async def head(self, run_id: str) -> int:
        """`pause()`, then the inner store's `head`."""
        await self.pause()
        return await self.inner.head(run_id)

    async def read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        *,
        after: int = 0,
        limit: int | None = None,
        descending: bool = False,
    ) -> list[Envelope]:
        """`pause()`, then the inner store's `read_by_correlation`."""
        await self.pause()
        return await self.inner.read_by_correlation(
            run_id, correlation_id, after=after, limit=limit, descending=descending
        )

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
        """`pause()`, then the inner store's `list_runs`."""
        await self.pause()
        return await self.inner.list_runs(
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
        )

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """`pause()`, then the inner store's `get_runs`."""
        await self.pause()
        return await self.inner.get_runs(run_ids)

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """`pause()`, then the inner store's `find_hook`."""
        await self.pause()
        return await self.inner.find_hook(token, now=now)

    async def list_hooks(
        self,
        *,
        run_id: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime,
    ) -> Page[HookHolder]:
        """`pause()`, then the inner store's `list_hooks`."""
        await self.pause()
        return await self.inner.list_hooks(run_id=run_id, cursor=cursor, limit=limit, now=now)

    async def due_wakeups(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[Wakeup]:
        """`pause()`, then the inner store's `due_wakeups`."""
        await self.pause()
        return await self.inner.due_wakeups(now, limit=limit, workflow_names=workflow_names)

    async def next_wakeup(self, *, workflow_names: Collection[str] | None = None) -> Wakeup | None:
        """`pause()`, then the inner store's `next_wakeup`."""
        await self.pause()
        return await self.inner.next_wakeup(workflow_names=workflow_names)

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """`pause()`, then the inner store's `read_all`."""
        await self.pause()
        return await self.inner.read_all(after_position=after_position, limit=limit)

    async def delete_runs(
        self, *, terminal_before: datetime, limit: int, run_ids: Collection[str] | None = None
    ) -> int:
        """`pause()`, then the inner store's `delete_runs`."""
        await self.pause()
        return await self.inner.delete_runs(
            terminal_before=terminal_before, limit=limit, run_ids=run_ids
        )

    # --- WorkerLeases, when the inner store keeps them (see `__init__`) ----------------------

    def _leases(self) -> WorkerLeases:
        assert isinstance(self.inner, WorkerLeases)
        return self.inner

    async def _forward_renew_lease(
        self, worker_id: str, *, lease_until: datetime, now: datetime
    ) -> bool:
        """`pause()`, then the inner store's `renew_lease`."""
        await self.pause()
        return await self._leases().renew_lease(worker_id, lease_until=lease_until, now=now)

    async def _forward_drop_lease(self, worker_id: str) -> None:
        """`pause()`, then the inner store's `drop_lease`."""
        await self.pause()
        await self._leases().drop_lease(worker_id)

    async def _forward_list_leases(self) -> list[WorkerLease]:
        """`pause()`, then the inner store's `list_leases`."""
        await self.pause()
        return await self._leases().list_leases()

    async def _forward_orphaned_runs(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[RunSummary]:
        """`pause()`, then the inner store's `orphaned_runs`."""
        await self.pause()
        return await self._leases().orphaned_runs(now, limit=limit, workflow_names=workflow_names)

    async def close(self) -> None:
        """Close the inner store (without `pause()`: closing always goes through)."""
        await self.inner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
