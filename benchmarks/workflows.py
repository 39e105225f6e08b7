"""Workflows: a 10-step sequential workflow driven by `runfold.engine.Engine`, against the
same workflow on DBOS Transact, on the same SQLite file system and the same PostgreSQL
server. Reports workflows/s (one workflow at a time) and step latency percentiles."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from benchmarks.backend import Backend
from benchmarks.harness import (
    Measurement,
    Remark,
    Result,
    StepClock,
    Trial,
    compare,
    event_loop,
    percentiles,
    timed_rounds,
)
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS
from runfold import CommandHandler
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


class SequentialWorkflow:
    """`WORKFLOW_STEPS` steps, one after the other, each fed the previous one's output."""

    def __init__(self, clock: StepClock) -> None:
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
        self.clock.step()
        return b"o" * PAYLOAD_BYTES


def _workflows(count: int, clock: StepClock, start_one: Callable[[], object]) -> Trial:
    """`count` workflows one after the other, each stamped on `clock`, a new clock round per
    round."""

    def run() -> None:
        for _ in range(count):
            clock.begin()
            start_one()
            clock.end()

    return Trial(prepare=clock.new_round, run=run)


@contextlib.contextmanager
def _contenders(
    backend: Backend, count: int, remarks: list[Result | Remark]
) -> Iterator[dict[str, tuple[Trial, StepClock]]]:
    """runfold's engine on a fresh store, and DBOS on a fresh system database when it is
    installed and starts there (else a remark says why not)."""
    with event_loop() as loop, backend.store(loop) as store, contextlib.ExitStack() as stack:
        clock = StepClock()
        engine = Engine(CommandHandler(store), SequentialWorkflow(clock))

        def runfold_one() -> None:
            run = loop.run_until_complete(engine.start("sequential", b"i" * PAYLOAD_BYTES))
            assert run.status == "completed"

        found = {"runfold": (_workflows(count, clock, runfold_one), clock)}
        dbos = _dbos(backend, count, stack, remarks)
        if dbos is not None:
            found["DBOS"] = dbos
        yield found


def _dbos(
    backend: Backend, count: int, stack: contextlib.ExitStack, remarks: list[Result | Remark]
) -> tuple[Trial, StepClock] | None:
    """DBOS launched on a fresh system database (until `stack` closes), or None and a remark."""
    try:
        from benchmarks.dbos_peer import CLOCK, dbos_launched, sequential_workflow
    except ImportError:
        remarks.append(Remark(group=GROUP, text="DBOS is not installed: no peer rows."))
        return None
    try:
        stack.enter_context(dbos_launched(stack.enter_context(backend.dbos_config())))
    except Exception as exc:  # a peer that cannot run here is reported, not hidden
        remarks.append(
            Remark(group=GROUP, text=f"DBOS could not start on {backend.name}: {exc!r}.")
        )
        return None

    def dbos_one() -> None:
        assert sequential_workflow("i" * PAYLOAD_BYTES) == "o" * PAYLOAD_BYTES

    return _workflows(count, CLOCK, dbos_one), CLOCK


def bench_workflows(quick: bool) -> list[Result | Remark]:
    count = 2 if quick else 20
    repeats = 2 if quick else 5
    found: list[Result | Remark] = []
    for backend in (SQLITE, POSTGRES):
        if backend.version() is None:
            found.append(Remark(group=GROUP, text=f"{backend.name}: no server, not measured."))
            continue
        with _contenders(backend, count, found) as contenders:
            seconds = timed_rounds(
                {name: trial for name, (trial, _) in contenders.items()}, repeats=repeats
            )
        # Only the timed rounds' latencies: the warm-up round's are dropped, as its time is.
        latencies = {}
        for name, (_, clock) in contenders.items():
            by_round = [percentiles(r, PERCENTILES) for r in clock.rounds[-repeats:]]
            latencies[name] = {
                p: Measurement.of([1000 * cuts[p] for cuts in by_round]) for p in PERCENTILES
            }
        rates = {
            name: Measurement.of([count / s for s in spent]) for name, spent in seconds.items()
        }
        found += _rows(backend.describe(), rates, latencies)
    return found


def _rows(
    on: str, rates: dict[str, Measurement], latencies: dict[str, dict[int, Measurement]]
) -> list[Result | Remark]:
    rows: list[Result | Remark] = []
    for name, rate in rates.items():
        what = (
            "runfold Engine (CommandHandler on the store)"
            if name == "runfold"
            else "DBOS Transact (DBOS.workflow / DBOS.step)"
        )
        peer = "DBOS" if name == "runfold" and "DBOS" in rates else None
        rows.append(
            Result(
                group=GROUP,
                case=f"{what}: {WORKFLOW_STEPS}-step sequential workflow, one at a time",
                on=on,
                unit="workflows/s",
                value=rate,
                comparisons=compare(rate, "DBOS", rates[peer] if peer else None),
            )
        )
        rows += [
            Result(
                group=GROUP,
                case=f"{what}: step latency p{p}",
                on=on,
                unit="ms",
                value=latencies[name][p],
                comparisons=compare(
                    latencies[name][p], f"DBOS p{p}", latencies[peer][p] if peer else None
                ),
                lower_is_better=True,
            )
            for p in PERCENTILES
        ]
    return rows
