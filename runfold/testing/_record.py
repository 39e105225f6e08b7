"""Record the history a `runfold.flow` workflow makes when its steps fail and its process dies.

`record_history` plays one life of a run: the workflow on a `MemoryStore` under a fault schedule
(`CrashingStore`, a fresh `Flow` after every stop), with the step attempts it is told to fail
raising a retryable `StepFailure`. The history is what the store holds at the end, with the
sequence of each durable append: every prefix that ends at one is a moment the run really passed
through. `runfold.testing.strategies.workflow_histories` draws the failures and the faults.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from runfold.engine import StepFailure, StepInvocation
from runfold.flow import Flow, PayloadCodec, Workflow
from runfold.kernel import Envelope, StoreUnavailable
from runfold.stores.memory import MemoryStore
from runfold.stores.protocol import EventStore
from runfold.testing.crash import CrashingStore, Fault, SimulatedCrash
from runfold.testing.delegating import DelegatingStore
from runfold.testing.resume import RoundClock, drive_rounds

__all__ = ["RecordedHistory", "record_history", "run_sync"]

T = TypeVar("T")
_MAX_RESTARTS = 100
"""Each fault strikes once; more restarts than this means the code under test crashes itself."""


@attrs.frozen(kw_only=True)
class RecordedHistory:
    """A run's history and the sequences at which its appends ended (the moments it stood at)."""

    history: list[Envelope]
    heads: tuple[int, ...]


class _Heads(DelegatingStore):
    """Notes the head of the run after each append that reached the store."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.heads: list[int] = []

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        """The inner store's append; its last sequence noted once it is durable."""
        written = await super()._append_if_sequence(*call)
        if written:
            self.heads.append(written[-1].sequence)
        return written


class _FailingFlow(Flow):
    """A `Flow` whose step bodies fail at the attempts `failing` names (1 = the first body run
    by any process of this life), before the body runs, as a retryable `StepFailure`."""

    def __init__(
        self,
        store: EventStore,
        workflow: Workflow,
        *,
        codec: PayloadCodec | None,
        clock: RoundClock,
        failing: Collection[int],
        counter: list[int],
    ) -> None:
        super().__init__(store, [workflow], codec=codec, clock=clock)
        self.handler.store_retry = None  # a `fail` fault reaches the Flow where it strikes
        self.failing = failing
        self.counter = counter  # shared by the Flows of one life: body runs so far

    async def run_step(self, invocation: StepInvocation) -> bytes:
        """The step's body, unless this body run is one to fail."""
        self.counter[0] += 1
        if self.counter[0] in self.failing:
            message = f"injected failure of {invocation.step_name} attempt {invocation.attempt}"
            raise StepFailure(message.encode(), code="injected", retryable=True)
        return await super().run_step(invocation)


async def record_history(
    workflow: Workflow,
    input: Any,
    *,
    run_id: str,
    events: Mapping[str, Any],
    codec: PayloadCodec | None,
    failing: Iterable[int],
    schedule: Iterable[Fault],
    rounds: int,
) -> RecordedHistory:
    """One life of run `run_id` of `workflow(input)`: the history it leaves.

    The run goes on for up to `rounds` rounds (a day of the clock each, delivering `events` by
    token once their hooks are live), whether or not it ends.
    """
    heads = _Heads(MemoryStore())
    store = CrashingStore(heads, schedule)
    clock = RoundClock()
    counter = [0]
    failures = frozenset(failing)

    def fresh() -> Flow:  # a new process: nothing kept in memory
        return _FailingFlow(
            store, workflow, codec=codec, clock=clock, failing=failures, counter=counter
        )

    flow = fresh()
    for _ in range(_MAX_RESTARTS):
        try:
            await drive_rounds(
                flow, workflow, input, run_id=run_id, events=events, clock=clock, rounds=rounds
            )
        except SimulatedCrash:
            store.restart()
            flow = fresh()
        except StoreUnavailable:
            pass  # a failed write: the same process carries on
        else:
            break
    else:
        raise AssertionError(f"run {run_id!r} did not get through {_MAX_RESTARTS} restarts")
    return RecordedHistory(history=await heads.inner.read(run_id), heads=tuple(heads.heads))


def run_sync(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(main())`, in a thread of its own when this one already runs an event loop.

    That is a strategy drawn inside an async test (`data.draw(...)`).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(main())).result()
