"""Durable functions: the 10-step sequential workflow as `runfold.flow` code (`@workflow`,
`await step(...)`) against the same workflow as DBOS code (`@DBOS.workflow`, `@DBOS.step`),
on the same SQLite file system and the same PostgreSQL server; and a workflow of 10 parallel
steps (`asyncio.gather` of steps on both sides, DBOS's async API).

Reported per backend: workflows/s one at a time and `CONCURRENT` at once, and the parallel
workflow one at a time. Both sides take and return text, so each pays its own payload
encoding (JSON for runfold.flow).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from benchmarks.backend import Backend
from benchmarks.harness import Measurement, Remark, Result, Trial, compare, event_loop, timed_rounds
from benchmarks.peers import dbos_on
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE
from benchmarks.targets import FLOW_CONCURRENT_VS_DBOS, FLOW_SEQUENTIAL_VS_DBOS
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS
from runfold.flow import Flow, step, workflow

__all__ = ["bench_flow", "flow_parallel", "flow_sequential"]

GROUP = "Durable functions"
CONCURRENT = 64
"""Workflows started at once in the concurrent rows."""
CONNECTIONS = 8
"""PostgreSQL connections runfold's store may use in the concurrent rows."""
OURS = "runfold.flow (@workflow / await step)"
PARALLEL_SHAPE = "parallel workflow (asyncio.gather of steps), one at a time"
PEER = "DBOS Transact (DBOS.workflow / DBOS.step)"


async def _work(previous: str) -> str:
    # An `async def` body runs on the loop, as DBOS runs a synchronous step inline in its
    # workflow's thread: no hop to a thread per step on either side. (A plain `def` body runs
    # in runfold's step thread pool, for bodies that may block.)
    return "o" * PAYLOAD_BYTES


@workflow(name="bench-flow-sequential")
async def flow_sequential(input: str) -> str:
    """`WORKFLOW_STEPS` steps, one after the other, each fed the previous one's output."""
    output = input
    for _ in range(WORKFLOW_STEPS):
        output = await step(_work, output)
    return output


async def _async_work(previous: str) -> str:
    return "o" * PAYLOAD_BYTES


@workflow(name="bench-flow-parallel")
async def flow_parallel(input: str) -> list[str]:
    """`WORKFLOW_STEPS` steps at once, each fed the input."""
    return list(await asyncio.gather(*(step(_async_work, input) for _ in range(WORKFLOW_STEPS))))


Trials = tuple[Trial, Trial, Trial]


@contextlib.contextmanager
def _runfold(backend: Backend, count: int, concurrent: int) -> Iterator[Trials]:
    """One at a time on a store of one connection; `concurrent` at once on `CONNECTIONS`."""
    with (
        event_loop() as loop,
        backend.store(loop) as store,
        backend.store(loop, connections=CONNECTIONS) as shared,
    ):
        one = Flow(store, [flow_sequential, flow_parallel])
        many = Flow(shared, [flow_sequential])

        def sequential() -> None:
            for _ in range(count):
                run = loop.run_until_complete(one.start(flow_sequential, "i" * PAYLOAD_BYTES))
                assert run.output == "o" * PAYLOAD_BYTES

        async def all_at_once() -> None:
            runs = await asyncio.gather(
                *(many.start(flow_sequential, "i" * PAYLOAD_BYTES) for _ in range(concurrent))
            )
            assert all(run.output == "o" * PAYLOAD_BYTES for run in runs)

        def parallel() -> None:
            for _ in range(count):
                run = loop.run_until_complete(one.start(flow_parallel, "i" * PAYLOAD_BYTES))
                assert run.output == ["o" * PAYLOAD_BYTES] * WORKFLOW_STEPS

        yield (
            Trial(run=sequential),
            Trial(run=lambda: loop.run_until_complete(all_at_once())),
            Trial(run=parallel),
        )


@contextlib.contextmanager
def _dbos(
    backend: Backend, count: int, concurrent: int, remarks: list[Result | Remark]
) -> Iterator[Trials | None]:
    """DBOS's trials on a fresh system database, or None and a remark saying why not."""
    with dbos_on(backend, GROUP, remarks) as peer:
        if peer is None:
            yield None
            return
        sequential_workflow, start = peer.sequential_workflow, peer.DBOS.start_workflow

        def sequential() -> None:
            for _ in range(count):
                assert sequential_workflow("i" * PAYLOAD_BYTES) == "o" * PAYLOAD_BYTES

        def all_at_once() -> None:
            handles = [start(sequential_workflow, "i" * PAYLOAD_BYTES) for _ in range(concurrent)]
            assert all(h.get_result() == "o" * PAYLOAD_BYTES for h in handles)

        loop = asyncio.new_event_loop()

        def parallel() -> None:
            for _ in range(count):
                outputs = loop.run_until_complete(peer.parallel_workflow("i" * PAYLOAD_BYTES))
                assert outputs == ["o" * PAYLOAD_BYTES] * WORKFLOW_STEPS

        try:
            yield Trial(run=sequential), Trial(run=all_at_once), Trial(run=parallel)
        finally:
            loop.close()


def bench_flow(quick: bool) -> list[Result | Remark]:
    count = 2 if quick else 20
    concurrent = 8 if quick else CONCURRENT
    repeats = 2 if quick else 5
    found: list[Result | Remark] = []
    for backend in (SQLITE, POSTGRES):
        if backend.version() is None:
            found.append(Remark(group=GROUP, text=f"{backend.name}: no server, not measured."))
            continue
        with (
            _runfold(backend, count, concurrent) as ours,
            _dbos(backend, count, concurrent, found) as theirs,
        ):
            contenders = {"runfold": ours} | ({"DBOS": theirs} if theirs else {})
            rates = {
                shape: {
                    name: Measurement.of([units / s for s in spent])
                    for name, spent in timed_rounds(
                        {name: trials[place] for name, trials in contenders.items()},
                        repeats=repeats,
                    ).items()
                }
                for place, (shape, units) in enumerate(
                    (
                        ("sequential workflow, one at a time", count),
                        (f"sequential workflow, {concurrent} at once", concurrent),
                        (PARALLEL_SHAPE, count),
                    )
                )
            }
        targets = (FLOW_SEQUENTIAL_VS_DBOS, FLOW_CONCURRENT_VS_DBOS, None)
        for (shape, by_name), target in zip(rates.items(), targets, strict=True):
            for name, rate in by_name.items():
                ours_row = name == "runfold"
                found.append(
                    Result(
                        group=GROUP,
                        case=f"{OURS if ours_row else PEER}: {WORKFLOW_STEPS}-step {shape}",
                        on=backend.describe(),
                        unit="workflows/s",
                        value=rate,
                        comparisons=compare(rate, "DBOS", by_name.get("DBOS"), target)
                        if ours_row
                        else (),
                    )
                )
    found.append(
        Remark(
            group=GROUP,
            text=f"DBOS runs its {concurrent} concurrent workflows on its own executor threads; "
            f"runfold.flow's run on one event loop, with {CONNECTIONS} PostgreSQL connections "
            "(SQLite: one file, shared by group commits).",
        )
    )
    return found
