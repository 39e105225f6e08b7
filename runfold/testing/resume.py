"""`crash_and_resume`: run a workflow under a fault schedule, resume it, compare with a clean run.

The property a durable runtime owes: however the process dies or the store fails, a fresh
process that recovers the run ends it with the same output as a run nothing happened to. The
helper plays both: the clean run on a `MemoryStore`, the faulty one on `CrashingStore(store)`,
with a fresh `Flow` (a new process: no cache, no live coroutine) after every stop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

import attrs

from runfold.flow import Flow, FlowRun, PayloadCodec, Workflow
from runfold.kernel import (
    HookNotFound,
    RunExpired,
    RunNotFound,
    Snapshot,
    StoreUnavailable,
    TerminalState,
)
from runfold.stores.memory import MemoryStore
from runfold.stores.protocol import EventStore
from runfold.testing.crash import CrashingStore, Fault, SimulatedCrash

__all__ = [
    "CrashOutcome",
    "Message",
    "RoundClock",
    "crash_and_resume",
    "family",
    "run_to_end",
    "shape",
]

_START = datetime(2026, 1, 1, tzinfo=UTC)
_ROUND = timedelta(days=1)
_LIVE = ("pending", "running", "cancelling")


class RoundClock:
    """A clock `run_to_end` moves a day per round, so every sleep and retry falls due."""

    def __init__(self, start: datetime = _START) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@attrs.frozen(kw_only=True)
class CrashOutcome:
    """The clean run, the faulty run as it ended, and what happened on the way."""

    expected: FlowRun
    actual: FlowRun
    restarts: int
    struck: tuple[Fault, ...]
    same_if_failed: bool = False
    """Whether two runs that did not complete but ended alike count as `same`."""
    expected_family: tuple[tuple[object, ...], ...] = ()
    """The clean run's children (and theirs), each as `family` describes it."""
    actual_family: tuple[tuple[object, ...], ...] = ()
    """The faulty run's children (and theirs), each as `family` describes it."""

    @property
    def same(self) -> bool:
        """Whether both runs completed (or, with `same_if_failed`, ended) `alike`.

        Two runs that failed alike are not the same by default: a workflow meant to complete
        that fails in both the clean and the faulty run proves nothing about crashes.
        """
        if self.expected.status != "completed" and not self.same_if_failed:
            return False
        return self.alike

    @property
    def alike(self) -> bool:
        """Whether both runs ended alike, and recorded the same calls with the same outcomes.

        That is status, output, error, and `shape` (attempt counts may differ: a crash costs an
        attempt), and the same of every child run, at any depth (`family`).
        """
        a, b = self.expected, self.actual
        return (a.status, a.output, a.error, shape(a.snapshot), self.expected_family) == (
            b.status,
            b.output,
            b.error,
            shape(b.snapshot),
            self.actual_family,
        )


def shape(run: Snapshot) -> tuple[object, ...]:
    """What a run recorded, less what a crash may change (times, attempts, retry errors)."""
    steps = tuple(
        (s.step_id, s.step_name, s.input, s.status, s.output if s.status == "completed" else None)
        for s in run.steps.values()
    )
    waits = tuple((w.wait_id, w.status) for w in run.waits.values())
    hooks = tuple((h.hook_id, h.status, len(h.deliveries)) for h in run.hooks.values())
    return steps, waits, hooks


Message: TypeAlias = tuple[str, str | None, Any]
"""A message `crash_and_resume` sends: (run id, topic, message), as `Flow.send` takes them."""


async def family(flow: Flow, run: FlowRun, *, rounds: int = 10) -> tuple[tuple[object, ...], ...]:
    """Every child run of `run`, at any depth, once each ended, in link order.

    Each is (run id, status, output, error, `shape`). A child still live when its parent ended
    is carried on first (`recover`, then what is due), as a fresh process would: a parent's end
    cancels its live children.

    Raises:
        AssertionError: A child run that does not end within `rounds`.
    """
    found: list[tuple[object, ...]] = []
    pending = [link.child_run_id for link in run.snapshot.children.values()]
    while pending:
        child_id = pending.pop(0)
        if child_id is None:
            continue
        child = await flow.result(child_id)
        for _ in range(rounds):
            if child.status not in _LIVE:
                break
            await flow.recover()
            await flow.run_until_idle()
            child = await flow.result(child_id)
        else:
            raise AssertionError(f"child run {child_id!r} did not end: {child.status}")
        found.append((child_id, child.status, child.output, child.error, shape(child.snapshot)))
        pending.extend(link.child_run_id for link in child.snapshot.children.values())
    return tuple(found)


async def run_to_end(
    flow: Flow,
    workflow: Workflow,
    input: Any,
    *,
    run_id: str,
    events: Mapping[str, Any],
    clock: RoundClock,
    rounds: int = 50,
    messages: Sequence[Message] = (),
) -> FlowRun:
    """Start (or find) the run, then recover, resume and deliver `events` until it ends.

    Each round moves `clock` a day on, resumes what is due and delivers every
    event (by token; each is recorded once, by its token as delivery id) whose hook is live,
    then sends every message (`Flow.send`, each recorded once by its index as idempotency key)
    to its run, if that run exists and is live.

    Raises:
        AssertionError: The run did not end within `rounds`.
    """
    run = await drive_rounds(
        flow,
        workflow,
        input,
        run_id=run_id,
        events=events,
        clock=clock,
        rounds=rounds,
        messages=messages,
    )
    if run.status in _LIVE:
        raise AssertionError(f"run {run_id!r} did not end in {rounds} rounds: {run.status}")
    return run


async def drive_rounds(
    flow: Flow,
    workflow: Workflow,
    input: Any,
    *,
    run_id: str,
    events: Mapping[str, Any],
    clock: RoundClock,
    rounds: int,
    messages: Sequence[Message] = (),
) -> FlowRun:
    """`run_to_end`'s rounds: the run as it stands once it ended or `rounds` went by."""
    await flow.recover()
    run = await flow.start(workflow, input, run_id=run_id)
    for _ in range(rounds):
        if run.status not in _LIVE:
            return run
        clock.now += _ROUND
        await flow.run_until_idle()
        for token, payload in events.items():
            with contextlib.suppress(HookNotFound, RunExpired):  # not live (yet, or any more)
                await flow.deliver(token, payload, delivery_id=token)
        for number, (target, topic, message) in enumerate(messages):
            key = f"crash-and-resume-message-{number}"
            with contextlib.suppress(RunNotFound, TerminalState):  # not there (yet, or any more)
                await flow.send(target, message, topic=topic, idempotency_key=key)
        run = await flow.result(run_id)
    return run


async def crash_and_resume(
    workflow: Workflow,
    input: Any,
    *,
    store: EventStore,
    schedule: Iterable[Fault],
    events: Mapping[str, Any] | None = None,
    run_id: str = "crash-test",
    codec: PayloadCodec | None = None,
    max_restarts: int = 100,
    workflows: Iterable[Workflow] = (),
    same_if_failed: bool = False,
    messages: Sequence[Message] = (),
) -> CrashOutcome:
    """Run `workflow(input)` cleanly, then on `store` under `schedule`, resuming after faults.

    `events` maps hook tokens to the payloads delivered to them once their hooks are live.
    After a `stop` a fresh `Flow` (a new process) recovers and carries on; after a `fail` the
    same `Flow` does, as a process that saw a transient store error would. The Flows' handlers
    do not retry store faults (`store_retry=None`), so that each `fail` reaches them. Every
    `Flow` serves `workflow` and `workflows` (the children a parent starts, say); the child runs
    are compared too (`family`). `messages` are sent each round, as `run_to_end` says: to the
    run, or to a child (`<run id>/<call id>`), once it exists. The outcome is `same` only when
    the clean run completed, unless `same_if_failed`.

    Raises:
        AssertionError: More than `max_restarts` faults, or a run that does not end.
    """
    events = dict(events or {})
    served = {w.name: w for w in (workflow, *workflows)}.values()
    clean_clock = RoundClock()
    clean = Flow(MemoryStore(), served, codec=codec, clock=clean_clock)
    expected = await run_to_end(
        clean,
        workflow,
        input,
        run_id=run_id,
        events=events,
        clock=clean_clock,
        messages=messages,
    )
    expected_family = await family(clean, expected)
    crashing = CrashingStore(store, schedule)
    clock = RoundClock()
    restarts = 0
    flow = _unretried(Flow(crashing, served, codec=codec, clock=clock))
    while True:
        try:
            actual = await run_to_end(
                flow,
                workflow,
                input,
                run_id=run_id,
                events=events,
                clock=clock,
                messages=messages,
            )
            actual_family = await family(flow, actual)
        except (SimulatedCrash, StoreUnavailable) as exc:
            restarts += 1
            if restarts > max_restarts:
                raise AssertionError(f"more than {max_restarts} restarts") from None
            if isinstance(exc, SimulatedCrash):  # a new process: nothing kept in memory
                crashing.restart()
                flow = _unretried(Flow(crashing, served, codec=codec, clock=clock))
            # A failed write leaves the process as it was: the same Flow carries on, its live
            # coroutines facing a store that may or may not hold what they were shown.
            continue
        return CrashOutcome(
            expected=expected,
            actual=actual,
            restarts=restarts,
            struck=tuple(crashing.struck),
            same_if_failed=same_if_failed,
            expected_family=expected_family,
            actual_family=actual_family,
        )


def _unretried(flow: Flow) -> Flow:
    """`flow`, its handler raising store faults at once: a `fail` is seen where it strikes."""
    flow.handler.store_retry = None
    return flow
