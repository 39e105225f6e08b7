"""`DelegatingStore`: an `EventStore` that passes every call to another one.

The base of wrappers that stage what a real store does under trouble (`CrashingStore` fails or
stops around writes; a test's subclass lets other tasks in before each call) without faking
storage. It is a `StoreBase` whose hooks pass each call on: a wrapper overrides only the hook of
the call it changes (`_append_if_sequence`, say) or `pause()`, and still refuses what the
contract refuses before it does anything. Every hook is written out, not forwarded by
`__getattr__`, so that a wrapper is an `EventStore` to the type checker.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

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
from runfold.stores.base import StoreBase
from runfold.stores.due_work import DueRun, DueWork, Queue
from runfold.stores.leases import WorkerLeases
from runfold.stores.protocol import EventStore
from runfold.stores.signals import RunSignals

__all__ = ["DelegatingStore"]


_LEASE_METHODS = ("renew_lease", "drop_lease", "list_leases", "orphaned_runs")
"""The methods of `WorkerLeases`."""
_DUE_METHODS = ("claim_due", "hold_dedup")
"""The methods of `DueWork`."""
_SIGNAL_METHODS = ("wait_for_work", "wait_for_end")
"""The methods of `RunSignals`."""


class DelegatingStore(StoreBase):
    """Passes every call to `inner` after awaiting `pause()`, which subclasses override.

    Its public methods are `StoreBase`'s: the arguments are checked first, then the hook
    (`_read`, …) awaits `pause()` and calls the inner store's method.

    When `inner` keeps worker leases (`WorkerLeases`), so does the wrapper: it passes the four
    lease methods on too, and is a `WorkerLeases` to an `isinstance` check exactly then; the
    same for `DueWork` (so that a wrapper of a fleet's store serves a fleet) and for
    `RunSignals` (its waits go straight through, without `pause()`).
    """

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner
        # Set on the instance, not written on the class: a wrapper of a store without leases
        # (signals) must not pass for one that keeps them. A subclass's own method stays.
        if isinstance(inner, WorkerLeases):
            for name in _LEASE_METHODS:
                if not hasattr(type(self), name):
                    setattr(self, name, getattr(self, f"_forward_{name}"))
        if isinstance(inner, DueWork):
            for name in _DUE_METHODS:
                if not hasattr(type(self), name):
                    setattr(self, name, getattr(self, f"_forward_{name}"))
        if isinstance(inner, RunSignals):
            for name in _SIGNAL_METHODS:
                if not hasattr(type(self), name):
                    setattr(self, name, getattr(inner, name))

    async def pause(self) -> None:
        """Runs before every call but `close`; a no-op here."""

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

    async def _read(
        self, run_id: str, after: int, limit: int | None, descending: bool, /
    ) -> list[Envelope]:
        await self.pause()
        return await self.inner.read(run_id, after=after, limit=limit, descending=descending)

    async def _head(self, run_id: str, /) -> int:
        await self.pause()
        return await self.inner.head(run_id)

    async def _read_by_correlation(
        self,
        run_id: str,
        correlation_id: str,
        after: int,
        limit: int | None,
        descending: bool,
        /,
    ) -> list[Envelope]:
        await self.pause()
        return await self.inner.read_by_correlation(
            run_id, correlation_id, after=after, limit=limit, descending=descending
        )

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
        await self.pause()
        return await self.inner.list_runs(
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
        )

    async def _get_runs(self, run_ids: Sequence[str], /) -> list[RunSummary | None]:
        await self.pause()
        return await self.inner.get_runs(run_ids)

    async def _find_hook(self, token: str, now: datetime, /) -> HookHolder | None:
        await self.pause()
        return await self.inner.find_hook(token, now=now)

    async def _list_hooks(
        self, run_id: str | None, cursor: str | None, limit: int, now: datetime, /
    ) -> Page[HookHolder]:
        await self.pause()
        return await self.inner.list_hooks(run_id=run_id, cursor=cursor, limit=limit, now=now)

    async def _due_wakeups(
        self, now: datetime, limit: int, workflow_names: Collection[str] | None, /
    ) -> list[Wakeup]:
        await self.pause()
        return await self.inner.due_wakeups(now, limit=limit, workflow_names=workflow_names)

    async def _next_wakeup(self, workflow_names: Collection[str] | None, /) -> Wakeup | None:
        await self.pause()
        return await self.inner.next_wakeup(workflow_names=workflow_names)

    async def _read_all(self, after_position: int, limit: int, /) -> list[Envelope]:
        await self.pause()
        return await self.inner.read_all(after_position=after_position, limit=limit)

    async def _delete_runs(
        self, terminal_before: datetime, limit: int, run_ids: Collection[str] | None, /
    ) -> int:
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

    def _due(self) -> DueWork:
        assert isinstance(self.inner, DueWork)
        return self.inner

    async def _forward_claim_due(
        self,
        worker_id: str,
        now: datetime,
        *,
        hold_until: datetime,
        limit: int,
        workflow_names: Collection[str] | None = None,
        queues: Collection[Queue] = (),
    ) -> list[DueRun]:
        """`pause()`, then the inner store's `claim_due`."""
        await self.pause()
        return await self._due().claim_due(
            worker_id,
            now,
            hold_until=hold_until,
            limit=limit,
            workflow_names=workflow_names,
            queues=queues,
        )

    async def _forward_hold_dedup(
        self, queue_name: str, dedup_id: str, run_id: str, *, now: datetime
    ) -> bool:
        """`pause()`, then the inner store's `hold_dedup`."""
        await self.pause()
        return await self._due().hold_dedup(queue_name, dedup_id, run_id, now=now)

    async def close(self) -> None:
        """Close the inner store (without `pause()`: closing always goes through)."""
        await self.inner.close()
