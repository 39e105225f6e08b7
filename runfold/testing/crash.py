"""`CrashingStore`: any `EventStore` that fails or dies around chosen writes.

A fault schedule names writes by number (the first `append_if_sequence` is write 1) and says
what happens there: `fail` raises `StoreUnavailable` (a transient error the caller sees and may
retry), `stop` raises `SimulatedCrash` and keeps raising it for every call until `restart()`
(the process died). `before` acts before the write reaches the store (nothing written);
`after` once it is durable (written, but the caller never hears so): the two cases a durable
runtime must survive.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Literal, Self, TypeAlias

import attrs

from runfold.kernel import (
    Envelope,
    Event,
    HookHolder,
    Page,
    RunIndex,
    RunStatus,
    RunSummary,
    StoreUnavailable,
    Wakeup,
)
from runfold.stores.protocol import EventStore

__all__ = ["CrashingStore", "Fault", "FaultKind", "FaultMoment", "SimulatedCrash"]

FaultKind: TypeAlias = Literal["fail", "stop"]
"""`fail`: a `StoreUnavailable` the caller sees; `stop`: the process dies (`SimulatedCrash`)."""
FaultMoment: TypeAlias = Literal["before", "after"]
"""Whether the fault strikes before the write reaches the store or after it is durable."""


class SimulatedCrash(BaseException):
    """The process 'died' at a `stop` fault.

    A `BaseException`, like `KeyboardInterrupt`, so that no `except Exception` in the code under
    test can handle it: a dead process runs no cleanup.
    """


@attrs.frozen(kw_only=True)
class Fault:
    """What happens at write number `write` (from 1)."""

    write: int = attrs.field(validator=attrs.validators.ge(1))
    moment: FaultMoment
    kind: FaultKind


class CrashingStore:
    """Wraps `inner` and applies `schedule` to its writes (`append_if_sequence`).

    Every other method passes through, unless the store is stopped (then it raises
    `SimulatedCrash`). `writes` counts the writes
    tried so far; `struck` lists the faults that struck.

    Raises:
        ValueError: Two faults name the same write.
    """

    def __init__(self, inner: EventStore, schedule: Iterable[Fault]) -> None:
        faults = list(schedule)
        by_write = {f.write: f for f in faults}
        if len(by_write) != len(faults):
            raise ValueError("a fault schedule names each write at most once")
        self.inner = inner
        self.schedule = by_write
        self.writes = 0
        self.stopped = False
        self.struck: list[Fault] = []

    def restart(self) -> None:
        """A new process: calls reach the store again (later faults still strike)."""
        self.stopped = False

    def _strike(self, fault: Fault) -> None:
        self.struck.append(fault)
        if fault.kind == "stop":
            self.stopped = True
            raise SimulatedCrash(f"stopped {fault.moment} write {fault.write}")
        raise StoreUnavailable(f"injected failure {fault.moment} write {fault.write}")

    def _check(self) -> None:
        if self.stopped:
            raise SimulatedCrash("the process stopped")

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
        """The inner store's append, with the fault scheduled for this write, if any."""
        self._check()
        self.writes += 1
        fault = self.schedule.get(self.writes)
        if fault is not None and fault.moment == "before":
            self._strike(fault)
        written = await self.inner.append_if_sequence(
            run_id,
            expected_sequence,
            events,
            index=index,
            recorded_at=recorded_at,
            expected_position=expected_position,
        )
        if fault is not None:
            self._strike(fault)
        return written

    # Reads pass through unless stopped: written out, not forwarded by __getattr__, so that the
    # wrapper is an `EventStore` to the type checker.

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        """The inner store's `read`."""
        self._check()
        return await self.inner.read(run_id, after=after, limit=limit, descending=descending)

    async def head(self, run_id: str) -> int:
        """The inner store's `head`."""
        self._check()
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
        """The inner store's `read_by_correlation`."""
        self._check()
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
        """The inner store's `list_runs`."""
        self._check()
        return await self.inner.list_runs(
            workflow_name=workflow_name,
            status=status,
            parent_run_id=parent_run_id,
            created_before=created_before,
            cursor=cursor,
            limit=limit,
        )

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunSummary | None]:
        """The inner store's `get_runs`."""
        self._check()
        return await self.inner.get_runs(run_ids)

    async def find_hook(self, token: str, *, now: datetime) -> HookHolder | None:
        """The inner store's `find_hook`."""
        self._check()
        return await self.inner.find_hook(token, now=now)

    async def list_hooks(
        self,
        *,
        run_id: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        now: datetime,
    ) -> Page[HookHolder]:
        """The inner store's `list_hooks`."""
        self._check()
        return await self.inner.list_hooks(run_id=run_id, cursor=cursor, limit=limit, now=now)

    async def due_wakeups(
        self, now: datetime, *, limit: int = 100, workflow_names: Collection[str] | None = None
    ) -> list[Wakeup]:
        """The inner store's `due_wakeups`."""
        self._check()
        return await self.inner.due_wakeups(now, limit=limit, workflow_names=workflow_names)

    async def next_wakeup(self, *, workflow_names: Collection[str] | None = None) -> Wakeup | None:
        """The inner store's `next_wakeup`."""
        self._check()
        return await self.inner.next_wakeup(workflow_names=workflow_names)

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The inner store's `read_all`."""
        self._check()
        return await self.inner.read_all(after_position=after_position, limit=limit)

    async def delete_runs(self, *, terminal_before: datetime, limit: int) -> int:
        """The inner store's `delete_runs` (not a scheduled write: retention is not under test)."""
        self._check()
        return await self.inner.delete_runs(terminal_before=terminal_before, limit=limit)

    async def close(self) -> None:
        """Close the inner store."""
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
