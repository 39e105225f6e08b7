"""`CrashingStore`: any `EventStore` that fails or dies around chosen writes.

A fault schedule names writes by number (the first `append_if_sequence` is write 1) and says
what happens there: `fail` raises `StoreUnavailable` before the write (nothing written) and
`CommitUnknown` after it (written, the reply lost): transient errors the caller sees and may
retry, `stop` raises `SimulatedCrash` and keeps raising it for every call until `restart()`
(the process died). `before` acts before the write reaches the store (nothing written);
`after` once it is durable (written, but the caller never hears so): the two cases a durable
runtime must survive.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeAlias

import attrs

from runfold.kernel import CommitUnknown, Envelope, StoreUnavailable
from runfold.stores.protocol import EventStore
from runfold.testing.delegating import DelegatingStore

__all__ = ["CrashingStore", "Fault", "FaultKind", "FaultMoment", "SimulatedCrash"]

FaultKind: TypeAlias = Literal["fail", "stop"]
"""`fail`: a `StoreUnavailable` the caller sees; `stop`: the process dies (`SimulatedCrash`).

After the write, a `fail` is `CommitUnknown` (a `StoreUnavailable`).
"""
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


class CrashingStore(DelegatingStore):
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
        super().__init__(inner)
        self.schedule = by_write
        self.writes = 0
        self.stopped = False
        self.struck: list[Fault] = []

    def restart(self) -> None:
        """A new process: calls reach the store again (later faults still strike)."""
        self.stopped = False

    def _strike(self, fault: Fault, run_id: str, expected: int) -> None:
        self.struck.append(fault)
        if fault.kind == "stop":
            self.stopped = True
            raise SimulatedCrash(f"stopped {fault.moment} write {fault.write}")
        if fault.moment == "after":
            raise CommitUnknown(run_id, expected, f"injected failure after write {fault.write}")
        raise StoreUnavailable(f"injected failure {fault.moment} write {fault.write}")

    async def pause(self) -> None:
        """A stopped process reaches nothing: every call raises `SimulatedCrash`."""
        if self.stopped:
            raise SimulatedCrash("the process stopped")

    async def _append_if_sequence(
        self, run_id: str, expected_sequence: int, /, *rest: Any
    ) -> list[Envelope]:
        """The inner store's append, with the fault scheduled for this write, if any."""
        await self.pause()
        self.writes += 1
        fault = self.schedule.get(self.writes)
        if fault is not None and fault.moment == "before":
            self._strike(fault, run_id, expected_sequence)
        written = await super()._append_if_sequence(run_id, expected_sequence, *rest)
        if fault is not None:
            self._strike(fault, run_id, expected_sequence)
        return written
