"""Engine cost: what the engine itself spends, on `MemoryStore` (no I/O to hide it).

- The cost of a step in workflows of 10, 100 and 1,000 sequential steps: a decision costs
  O(new events), so the cost per step stays flat as the run grows.
- The resident set after 10,000 and after 100,000 short workflows run by one long-lived engine
  (completed runs deleted by retention as a service would): every cache and map in the handler
  and the engine is bounded, so it stays flat.
"""

from __future__ import annotations

import gc
import re
from datetime import timedelta
from pathlib import Path

from benchmarks.harness import Measurement, Remark, Result, compare, event_loop, measure
from runfold import CommandHandler, MemoryStore
from runfold.engine import (
    Complete,
    Engine,
    RuntimeDecision,
    ScheduleStep,
    StepInvocation,
    WorkflowInvocation,
)

__all__ = ["bench_engine_cost"]

GROUP = "Engine cost"
LENGTHS = (10, 100, 1_000)
SHORT_STEPS = 3
"""Steps of each workflow in the resident-set rows."""
RETENTION_EVERY = 1_000
"""Workflows between two retention passes in the resident-set rows."""
_STATUS = Path("/proc/self/status")


class Counted:
    """`steps` sequential steps; each decision looks only at the last step (O(1) per decision,
    so what grows with the run is the engine's own cost)."""

    workflow_names = ("counted",)

    def __init__(self, steps: int) -> None:
        self.steps = steps

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        run = invocation.snapshot
        done = len(run.steps)
        last = run.steps.get(f"s{done - 1}") if done else None
        if last is not None and last.status != "completed":
            return ScheduleStep(step_id=last.step_id, step_name="n", input=b"")
        if done == self.steps:
            return Complete(output=b"")
        return ScheduleStep(step_id=f"s{done}", step_name="n", input=b"")

    async def run_step(self, invocation: StepInvocation) -> bytes:
        return b"ok"


def _per_step(length: int, repeats: int) -> Measurement:
    """Microseconds per step of a `length`-step workflow, start to end."""
    with event_loop() as loop:
        store = MemoryStore()
        engine = Engine(CommandHandler(store), Counted(length))

        def one() -> None:
            run = loop.run_until_complete(engine.start("counted", b""))
            assert run.status == "completed" and len(run.steps) == length

        steps_per_second = measure(one, units=length, repeats=repeats)
    return Measurement(
        median=1e6 / steps_per_second.median,
        low=1e6 / steps_per_second.high,
        high=1e6 / steps_per_second.low,
        repeats=steps_per_second.repeats,
    )


def _resident_bytes() -> int:
    found = re.search(r"^VmRSS:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    assert found is not None
    return 1024 * int(found.group(1))


def _resident_after(marks: tuple[int, ...]) -> dict[int, int]:
    """The resident set after each number of short workflows in `marks` (one engine)."""
    found: dict[int, int] = {}
    with event_loop() as loop:
        store = MemoryStore()
        handler = CommandHandler(store)
        engine = Engine(handler, Counted(SHORT_STEPS))

        async def run(count: int) -> None:
            for n in range(count):
                await engine.start("counted", b"")
                if (n + 1) % RETENTION_EVERY == 0:
                    cutoff = handler.clock() + timedelta(seconds=1)
                    await store.delete_runs(terminal_before=cutoff, limit=RETENTION_EVERY)

        done = 0
        for mark in marks:
            loop.run_until_complete(run(mark - done))
            done = mark
            gc.collect()
            found[mark] = _resident_bytes()
    return found


def bench_engine_cost(quick: bool) -> list[Result | Remark]:
    repeats = 2 if quick else 5
    lengths = LENGTHS[:2] if quick else LENGTHS
    found: list[Result | Remark] = []
    costs = {length: _per_step(length, repeats) for length in lengths}
    shortest = costs[lengths[0]]
    anchor = f"{lengths[0]}-step workflow"
    found += [
        _row(f"cost per step, {length}-step workflow", "µs", cost, (anchor, shortest))
        for length, cost in costs.items()
    ]
    if not _STATUS.exists():
        found.append(Remark(group=GROUP, text="No /proc/self/status: resident set not measured."))
        return found
    marks = (1_000, 10_000) if quick else (10_000, 100_000)
    resident = _resident_after(marks)
    sizes = {mark: Measurement.of([resident[mark] / 1e6]) for mark in marks}
    first = sizes[marks[0]]
    for mark, value in sizes.items():
        what = f"resident set after {mark:,} {SHORT_STEPS}-step workflows (retention every 1,000)"
        found.append(_row(what, "MB", value, (f"after {marks[0]:,}", first)))
    return found


def _row(what: str, unit: str, value: Measurement, against: tuple[str, Measurement]) -> Result:
    """A row of the group, compared with the first of its kind (`against`) unless it is it."""
    anchor, first = against
    return Result(
        group=GROUP,
        case=f"Engine on MemoryStore: {what}",
        on="MemoryStore",
        unit=unit,
        value=value,
        comparisons=compare(value, anchor, first) if value is not first else (),
        lower_is_better=True,
    )
