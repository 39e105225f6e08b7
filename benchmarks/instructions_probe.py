"""`python -m benchmarks.instructions_probe PART WORKFLOWS`: run `WORKFLOWS` 10-step workflows
on `MemoryStore` after a warm-up, and nothing else; `benchmarks.instructions` runs it under
callgrind twice (with none and with some) and takes the difference.

`PART` says how much of the stack runs, so that the differences between parts say where a
step's instructions go:

- `flow`: the same workflow as `runfold.flow` code (`Flow.start` of `benchmarks.flow`'s
  `flow_sequential`): the engine and the flow layer over it (the interpreter, the step calls,
  the bodies, the JSON payloads).
- `flow-threads`: the same with a plain `def` step body, which a Flow hands to its step threads
  and back: over `flow`, what that hand-off costs per step.
- `engine`: the whole engine (`Engine.start`), as `benchmarks.workflows` runs it.
- `handler`: the same appends without the engine: the kernel's decisions as the engine's
  journal makes them (`decide_many`, then `decide_after` for the next step's start), each
  batch handed to `CommandHandler.execute_many` on `MemoryStore` with its decision.
- `kernel`: those decisions alone, each batch's snapshot the next one's start (no handler, no
  store).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime

from benchmarks.flow import flow_sequential
from benchmarks.workflows import SequentialWorkflow
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS
from runfold import CommandHandler, MemoryStore
from runfold.engine import Engine
from runfold.flow import Flow, step, workflow
from runfold.handler import new_run_id
from runfold.kernel import (
    BatchDecision,
    Command,
    CompleteRun,
    CompleteStep,
    CreateRun,
    LazyStep,
    Snapshot,
    StartRun,
    StartStep,
    decide_after,
    decide_many,
)

__all__ = ["PARTS"]

WARM_UP = 3
"""Workflows run before the counted ones, in both runs: imports, caches and first calls."""
_INPUT = b"i" * PAYLOAD_BYTES
_OUTPUT = b"o" * PAYLOAD_BYTES


_Batch = Callable[[Snapshot | None], tuple[tuple[Command, ...], BatchDecision]]


def _batches(run_id: str, clock: Callable[[], datetime]) -> list[_Batch]:
    """The engine's decisions for one workflow, batch by batch, each from the run as it stands."""

    def start_step(number: int, previous: bytes) -> StartStep:
        lazy = LazyStep(step_name="work", input=previous)
        return StartStep(step_id=f"step-{number}", lazy=lazy)

    def first(view: Snapshot | None) -> tuple[tuple[Command, ...], BatchDecision]:
        start = StartRun(create=CreateRun(workflow_name="sequential", input=_INPUT))
        step = start_step(0, _INPUT)
        started = decide_many(view, (start,), now=clock(), run_id=run_id)
        return (start, step), decide_after(started, step)

    def then(number: int) -> _Batch:
        def batch(view: Snapshot | None) -> tuple[tuple[Command, ...], BatchDecision]:
            done = CompleteStep(step_id=f"step-{number}", output=_OUTPUT)
            last = number + 1 == WORKFLOW_STEPS
            after = CompleteRun(output=_OUTPUT) if last else start_step(number + 1, _OUTPUT)
            outcome = decide_many(view, (done,), now=clock())
            return (done, after), decide_after(outcome, after)

        return batch

    return [first, *(then(n) for n in range(WORKFLOW_STEPS))]


async def _kernel(handler: CommandHandler) -> None:
    view: Snapshot | None = None
    for batch in _batches(new_run_id(), handler.clock):
        view = batch(view)[1].snapshot
    assert view is not None and view.status == "completed"


async def _handler(handler: CommandHandler) -> None:
    run_id = new_run_id()
    view: Snapshot | None = None
    for batch in _batches(run_id, handler.clock):
        commands, decided = batch(view)
        outcome = await handler.execute_many(
            run_id,
            commands,
            known_sequence=view.last_sequence if view is not None else None,
            now=decided.now,
            decided=decided,
        )
        view = outcome.snapshot
    assert view is not None and view.status == "completed"


async def _engine(engine: Engine) -> None:
    run = await engine.start("sequential", _INPUT)
    assert run.status == "completed"


async def _flow(flow: Flow) -> None:
    run = await flow.start(flow_sequential, "i" * PAYLOAD_BYTES)
    assert run.status == "completed"


def _work_in_thread(previous: str) -> str:
    return "o" * PAYLOAD_BYTES


@workflow(name="bench-flow-threads")
async def flow_threads(input: str) -> str:
    """`flow_sequential` with a plain `def` body: each step goes to a thread and back."""
    output = input
    for _ in range(WORKFLOW_STEPS):
        output = await step(_work_in_thread, output)
    return output


async def _flow_threads(flow: Flow) -> None:
    run = await flow.start(flow_threads, "i" * PAYLOAD_BYTES)
    assert run.status == "completed"


PARTS = ("flow", "flow-threads", "engine", "handler", "kernel")


async def _main(part: str, workflows: int) -> None:
    handler = CommandHandler(MemoryStore())
    one: Callable[[], Awaitable[None]]
    if part == "flow":
        flow = Flow(MemoryStore(), [flow_sequential])
        one = lambda: _flow(flow)  # noqa: E731
    elif part == "flow-threads":
        threaded = Flow(MemoryStore(), [flow_threads])
        one = lambda: _flow_threads(threaded)  # noqa: E731
    elif part == "engine":
        engine = Engine(handler, SequentialWorkflow())
        one = lambda: _engine(engine)  # noqa: E731
    elif part == "handler":
        one = lambda: _handler(handler)  # noqa: E731
    else:
        one = lambda: _kernel(handler)  # noqa: E731
    for _ in range(WARM_UP + workflows):
        await one()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2])))
