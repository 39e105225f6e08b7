"""Workflows: a 10-step sequential workflow driven by `runfold.engine.Engine`, against the
same workflow on DBOS Transact, on the same SQLite file system and the same PostgreSQL server.

Reported per backend: workflows/s one at a time and `CONCURRENT` at once, step latency
percentiles, the appends and store calls one workflow makes, and the ceilings those appends
allow: the raw driver's commits/s (and, on SQLite, the rate of commits each handed to the
driver's thread, as an asyncio store must) divided by the appends per workflow, and the store
alone: one engine workflow's appends replayed into a fresh store, with no engine between them
(`benchmarks.store_alone`), taking turns with the engine's workflows one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from benchmarks.backend import Backend
from benchmarks.harness import (
    Measurement,
    Remark,
    Result,
    Rows,
    StepClock,
    Trial,
    compare,
    event_loop,
    measure,
    percentiles,
    timed_rounds,
)
from benchmarks.peers import dbos_on
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE
from benchmarks.store_alone import Append, RecordingStore, replay_trial
from benchmarks.targets import (
    ENGINE_APPENDS_PER_WORKFLOW,
    ENGINE_CONCURRENT_VS_DBOS,
    ENGINE_SEQUENTIAL_VS_CEILING,
    ENGINE_SEQUENTIAL_VS_DBOS,
    ENGINE_STORE_CALLS_PER_WORKFLOW,
)
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS
from runfold import CommandHandler, EventStore
from runfold.engine import (
    Complete,
    Engine,
    RuntimeDecision,
    ScheduleStep,
    StepInvocation,
    WorkflowInvocation,
)

__all__ = ["SequentialWorkflow", "bench_workflows"]

GROUP = "Workflows"
PERCENTILES = (50, 95, 99)
CONCURRENT = 64
"""Workflows started at once in the concurrent rows."""
CONNECTIONS = 8
"""PostgreSQL connections runfold's store may use in the concurrent rows."""
APPENDS_BOUND = 11
STORE_CALLS_BOUND = 13
ENGINE = "runfold Engine (CommandHandler on the store)"
ALONE = "the store alone"
"""The ceiling of the engine's own appends replayed straight into a store (its anchor name)."""
TRANSACTIONS = "the store's transactions"
"""The ceiling of the store's own transaction of each of those appends, called straight."""
PEER = "DBOS Transact (DBOS.workflow / DBOS.step)"


class SequentialWorkflow:
    """`WORKFLOW_STEPS` steps, one after the other, each fed the previous one's output."""

    workflow_names = ("sequential",)

    def __init__(self, clock: StepClock | None = None) -> None:
        self.clock = clock

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        run = invocation.snapshot
        previous = run.input
        for number in range(WORKFLOW_STEPS):
            step = run.steps.get(f"step-{number}")
            if step is None or step.status != "completed":
                return ScheduleStep(step_id=f"step-{number}", step_name="work", input=previous)
            previous = step.output or b""
        return Complete(output=previous)

    async def run_step(self, invocation: StepInvocation) -> bytes:
        if self.clock is not None:
            self.clock.step()
        return b"o" * PAYLOAD_BYTES


class CountingStore:
    """Passes every call to `store` and counts it (`RecordingStore` keeps the appends)."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await method(*args, **kwargs)

        return counted


@attrs.frozen(kw_only=True)
class _Contender:
    """A contender's two trials, and the clock its step bodies stamp."""

    sequential: Trial
    concurrent: Trial
    clock: StepClock


def _one_at_a_time(count: int, clock: StepClock, start_one: Callable[[], object]) -> Trial:
    """`count` workflows one after the other, each stamped on `clock`, a new clock round per
    round."""

    def run() -> None:
        for _ in range(count):
            clock.begin()
            start_one()
            clock.end()

    return Trial(prepare=clock.new_round, run=run)


@contextlib.contextmanager
def _runfold(backend: Backend, count: int, concurrent: int) -> Iterator[_Contender]:
    """runfold's trials: one at a time on a store of one connection, `concurrent` at once on a
    store of `CONNECTIONS` (SQLite has one whatever it is asked)."""
    with (
        event_loop() as loop,
        backend.store(loop) as store,
        backend.store(loop, connections=CONNECTIONS) as shared,
    ):
        clock = StepClock()
        engine = Engine(CommandHandler(store), SequentialWorkflow(clock))
        many = Engine(CommandHandler(shared), SequentialWorkflow())

        def one() -> None:
            run = loop.run_until_complete(engine.start("sequential", b"i" * PAYLOAD_BYTES))
            assert run.status == "completed"

        async def all_at_once() -> None:
            runs = await asyncio.gather(
                *(many.start("sequential", b"i" * PAYLOAD_BYTES) for _ in range(concurrent))
            )
            assert all(run.status == "completed" for run in runs)

        yield _Contender(
            sequential=_one_at_a_time(count, clock, one),
            concurrent=Trial(run=lambda: loop.run_until_complete(all_at_once())),
            clock=clock,
        )


@contextlib.contextmanager
def _dbos(
    backend: Backend, count: int, concurrent: int, remarks: list[Result | Remark]
) -> Iterator[_Contender | None]:
    """DBOS's trials on a fresh system database, or None and a remark saying why not."""
    with dbos_on(backend, GROUP, remarks) as peer:
        if peer is None:
            yield None
            return
        sequential_workflow, start = peer.sequential_workflow, peer.DBOS.start_workflow

        def one() -> None:
            assert sequential_workflow("i" * PAYLOAD_BYTES) == "o" * PAYLOAD_BYTES

        def all_at_once() -> None:
            handles = [start(sequential_workflow, "i" * PAYLOAD_BYTES) for _ in range(concurrent)]
            assert all(h.get_result() == "o" * PAYLOAD_BYTES for h in handles)

        yield _Contender(
            sequential=_one_at_a_time(count, peer.CLOCK, one),
            concurrent=Trial(run=all_at_once),
            clock=peer.CLOCK,
        )


def _store_calls(backend: Backend) -> tuple[int, int, list[Append]]:
    """The appends and store calls of one workflow (the second started on a fresh store), and
    the appends themselves, as the engine made them."""
    with event_loop() as loop, backend.store(loop) as store:
        recording = RecordingStore(store)
        counting = CountingStore(recording)
        engine = Engine(CommandHandler(counting), SequentialWorkflow())
        loop.run_until_complete(engine.start("sequential", b"warm-up"))
        counting.calls = 0
        recording.appends.clear()
        loop.run_until_complete(engine.start("sequential", b"i" * PAYLOAD_BYTES))
        return len(recording.appends), counting.calls, recording.appends


def _ceilings(backend: Backend, repeats: int, count: int) -> dict[str, Measurement]:
    """Single-row commits/s of the raw driver, and (SQLite) through the driver's thread."""
    found: dict[str, Measurement] = {}
    with event_loop() as loop:
        with backend.raw_inserts(loop, writers=1, count=count, batch=1) as raw:
            found[backend.floor] = measure(raw, units=count, repeats=repeats)
        with backend.raw_through_driver(loop, count=count) as hop:
            if hop is not None:
                found[f"{backend.floor} through the driver's thread"] = measure(
                    hop, units=count, repeats=repeats
                )
    return found


def bench_workflows(quick: bool) -> list[Result | Remark]:
    count = 2 if quick else 20
    concurrent = 8 if quick else CONCURRENT
    repeats = 2 if quick else 5
    found: list[Result | Remark] = []
    for backend in (SQLITE, POSTGRES):
        if backend.version() is None:
            found.append(Remark(group=GROUP, text=f"{backend.name}: no server, not measured."))
            continue
        appends, calls, workflow = _store_calls(backend)
        with (
            event_loop() as loop,
            backend.store(loop) as alone,
            backend.store_transactions(loop, workflow, count) as transactions,
            _runfold(backend, count, concurrent) as ours,
            _dbos(backend, count, concurrent, found) as theirs,
        ):
            contenders = {"runfold": ours} | ({"DBOS": theirs} if theirs else {})
            # The replay takes turns with the workflows one at a time: load slows them alike.
            one_at_a_time = {name: c.sequential for name, c in contenders.items()}
            stores = {ALONE: replay_trial(alone, loop, workflow, count)}
            if transactions is not None:
                stores[TRANSACTIONS] = transactions
            seconds = {
                "sequential": timed_rounds(one_at_a_time | stores, repeats=repeats),
                "concurrent": timed_rounds(
                    {name: c.concurrent for name, c in contenders.items()}, repeats=repeats
                ),
            }
            latencies = {name: _latencies(c.clock, repeats) for name, c in contenders.items()}
        replayed = Measurement.of([count / s for s in seconds["sequential"].pop(ALONE)])
        transacted = seconds["sequential"].pop(TRANSACTIONS, None)
        store_ceilings = {ALONE: replayed} | (
            {TRANSACTIONS: Measurement.of([count / s for s in transacted])} if transacted else {}
        )
        rates = {
            shape: {
                name: Measurement.of([units / s for s in spent]) for name, spent in by_name.items()
            }
            for shape, by_name, units in (
                ("sequential", seconds["sequential"], count),
                ("concurrent", seconds["concurrent"], concurrent),
            )
        }
        ceilings = {
            name: Measurement.of([r / appends for r in (rate.low, rate.median, rate.high)])
            for name, rate in _ceilings(backend, repeats, 50 if quick else 500).items()
        }
        found += _rows(backend.describe(), rates, latencies, ceilings, store_ceilings, concurrent)
        found += _count_rows(backend.describe(), appends, calls)
    found.append(
        Remark(
            group=GROUP,
            text="runfold's engine commits once per step: the run's creation with the first "
            "step's start, each step's outcome with the next step's start, the last outcome "
            "with the run's end (DBOS writes each step's outcome, and the workflow's status "
            "before and after). "
            f"DBOS runs its {concurrent} concurrent workflows on its own executor threads "
            f"(its default pool); runfold's run on one event loop, with {CONNECTIONS} "
            "PostgreSQL connections (SQLite: one file, shared by group commits). "
            "A ceiling is a raw driver's single-row commits/s divided by runfold's appends per "
            "workflow. On SQLite, a workflow run one at a time commits on the event loop's "
            "thread (no append is in flight beside it), so raw sqlite3 is its ceiling; the "
            "concurrent ones share group commits, on the event loop's thread when nothing else "
            "is ready to run there, else on the driver's. "
            f"The ceiling of {ALONE} replays the appends one engine workflow made (the same "
            "events, index rows and expected heads, under a new run id of the same length), "
            "one after the other, into a fresh store of one connection, taking turns with the "
            "engine's workflows one at a time: the store's statements, its Python and its "
            "commits, with no engine, handler or kernel decision between them. "
            f"The ceiling of {TRANSACTIONS} (SQLite) calls the store's own transaction of each "
            "of those appends straight, as a workflow one at a time commits, each append's rows "
            "encoded beforehand: its statements, the pages they write and the commit, without "
            "the store's Python around them.",
        )
    )
    return found


def _latencies(clock: StepClock, repeats: int) -> dict[int, Measurement]:
    """The step latency percentiles of the timed rounds (the warm-up round is dropped)."""
    by_round = [percentiles(r, PERCENTILES) for r in clock.rounds[-repeats:]]
    return {p: Measurement.of([1000 * cuts[p] for cuts in by_round]) for p in PERCENTILES}


def _rows(
    on: str,
    rates: dict[str, dict[str, Measurement]],
    latencies: dict[str, dict[int, Measurement]],
    ceilings: dict[str, Measurement],
    stores: dict[str, Measurement],
    concurrent: int,
) -> list[Result | Remark]:
    """The rows of one backend; `stores` holds the ceilings of the store alone (and, where
    measured, of its transactions)."""
    rows: list[Result | Remark] = []
    row = Rows(GROUP, on)
    sequential, together = rates["sequential"], rates["concurrent"]
    for name in sequential:
        what = ENGINE if name == "runfold" else PEER
        ours = name == "runfold"
        peer = "DBOS" if ours and "DBOS" in sequential else None
        against = compare(
            sequential[name],
            "DBOS",
            sequential[peer] if peer else None,
            ENGINE_SEQUENTIAL_VS_DBOS,
        )
        if ours:
            for ceiling, rate in ceilings.items():
                # The raw driver's own commits bound the engine one at a time (the first
                # ceiling); the hop through the driver's thread is shown beside it.
                target = ENGINE_SEQUENTIAL_VS_CEILING if ceiling == next(iter(ceilings)) else None
                against += compare(sequential[name], f"ceiling: {ceiling}", rate, target)
            for ceiling, rate in stores.items():
                against += compare(sequential[name], f"ceiling: {ceiling}", rate)
        workflow = f"{what}: {WORKFLOW_STEPS}-step sequential workflow"
        rows.append(row(f"{workflow}, one at a time", "workflows/s", sequential[name], against))
        rows.append(
            row(
                f"{workflow}, {concurrent} at once",
                "workflows/s",
                together[name],
                compare(
                    together[name],
                    "DBOS",
                    together[peer] if peer else None,
                    ENGINE_CONCURRENT_VS_DBOS,
                ),
            )
        )
        rows += [
            row(
                f"{what}: step latency p{p}",
                "ms",
                latencies[name][p],
                compare(latencies[name][p], f"DBOS p{p}", latencies[peer][p] if peer else None),
                lower_is_better=True,
            )
            for p in PERCENTILES
        ]
    rows += [
        row(f"ceiling: {ceiling} ÷ runfold's appends per workflow", "workflows/s", rate)
        for ceiling, rate in ceilings.items()
    ]
    raw, raw_rate = next(iter(ceilings.items()))
    if TRANSACTIONS in stores:
        rows.append(
            row(
                f"ceiling: {TRANSACTIONS}: each of the engine's appends as the store commits it",
                "workflows/s",
                stores[TRANSACTIONS],
                compare(stores[TRANSACTIONS], f"ceiling: {raw}", raw_rate),
            )
        )
    rows.append(
        row(
            f"ceiling: {ALONE}: the engine's own appends replayed",
            "workflows/s",
            stores[ALONE],
            compare(stores[ALONE], f"ceiling: {raw}", raw_rate)
            + compare(stores[ALONE], f"ceiling: {TRANSACTIONS}", stores.get(TRANSACTIONS)),
        )
    )
    return rows


def _count_rows(on: str, appends: int, calls: int) -> list[Result | Remark]:
    counted = (
        ("appends", appends, APPENDS_BOUND, ENGINE_APPENDS_PER_WORKFLOW),
        ("store calls", calls, STORE_CALLS_BOUND, ENGINE_STORE_CALLS_PER_WORKFLOW),
    )
    row = Rows(GROUP, on)
    return [
        row(
            f"{ENGINE}: {what} per {WORKFLOW_STEPS}-step workflow",
            what.split()[-1],
            Measurement.of([count]),
            compare(
                Measurement.of([count]), f"the bound of {bound}", Measurement.of([bound]), target
            ),
            lower_is_better=True,
        )
        for what, count, bound, target in counted
    ]
