"""Instructions per step: the CPU the engine and the kernel spend on one step of a 10-step
workflow on `MemoryStore`, counted by callgrind (valgrind), so the same whatever the load; and
what `runfold.flow` spends on the same workflow written as `@workflow` code.

The probe (`benchmarks.instructions_probe`) runs under `valgrind --tool=callgrind` with no
workflow, and with `WORKFLOWS` workflows after the same warm-up; the difference of the two
counts, divided by the steps, is what one step costs past start-up: the engine, the handler,
the kernel's decide / apply, `MemoryStore` and the event loop's turns, all in the one process.
The probe's smaller parts (the kernel's decisions alone; those and the handler's appends on
`MemoryStore`) split the count: where a step's instructions go.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.harness import Measurement, Remark, Result, compare
from benchmarks.instructions_probe import PARTS
from benchmarks.targets import ENGINE_INSTRUCTIONS_PER_STEP, ENGINE_INSTRUCTIONS_PER_STEP_BEFORE
from benchmarks.workloads import WORKFLOW_STEPS

__all__ = ["bench_instructions", "instructions_per_step"]

GROUP = "Engine cost"
WORKFLOWS = 20
"""Workflows counted (after the warm-up) in the second of the two runs."""
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def _counted(part: str, workflows: int, folder: Path) -> int:
    """The instructions callgrind counts for the probe running `workflows` workflows."""
    out = folder / f"callgrind.{part}.{workflows}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.instructions_probe",
            part,
            str(workflows),
        ],
        check=True,
        capture_output=True,
        env=os.environ | {"PYTHONHASHSEED": "0"},
    )
    found = _TOTAL.search(out.read_text())
    assert found is not None, f"no total in {out}"
    return int(found.group(1))


def _baseline(part: str) -> str:
    """The part whose run with no workflow is `part`'s start-up: every part imports the same
    modules, but the `flow` ones also make a `Flow` (its code's digest) and warm up their own
    code (and threads)."""
    return part if part.startswith("flow") else "engine"


def instructions_per_step(
    workflows: int = WORKFLOWS, parts: tuple[str, ...] = PARTS
) -> dict[str, float]:
    """Instructions per step past start-up of each of the probe's `parts` (see the module).

    The probe's runs are counted side by side, one per core: a count does not depend on the
    load, so only the wall time shrinks.
    """
    steps = workflows * WORKFLOW_STEPS
    runs = sorted({(part, workflows) for part in parts} | {(_baseline(p), 0) for p in parts})
    with (
        tempfile.TemporaryDirectory(prefix="runfold-callgrind-") as folder,
        ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool,
    ):
        counts = dict(
            zip(
                runs,
                pool.map(lambda run: _counted(run[0], run[1], Path(folder)), runs),
                strict=True,
            )
        )
    return {part: (counts[part, workflows] - counts[_baseline(part), 0]) / steps for part in parts}


def bench_instructions(quick: bool) -> list[Result | Remark]:
    if shutil.which("valgrind") is None:
        return [Remark(group=GROUP, text="No valgrind: instructions per step not counted.")]
    # Quick: the whole engine and runfold.flow only, on few workflows (each count is a process
    # under valgrind).
    parts = instructions_per_step(
        *((3, ("flow", "flow-threads", "engine")) if quick else (WORKFLOWS, PARTS))
    )
    count = Measurement.of([parts["engine"]])
    before = Measurement.of([ENGINE_INSTRUCTIONS_PER_STEP_BEFORE])

    found: list[Result | Remark] = [
        Result(
            group=GROUP,
            case=f"Engine on MemoryStore: instructions per step, {WORKFLOW_STEPS}-step workflow "
            "(callgrind)",
            on="MemoryStore",
            unit="instructions",
            value=count,
            comparisons=compare(
                count,
                f"before issue 36 ({ENGINE_INSTRUCTIONS_PER_STEP_BEFORE:,.0f})",
                before,
                ENGINE_INSTRUCTIONS_PER_STEP,
            ),
            lower_is_better=True,
            note="counted once: the count does not depend on the load",
        ),
    ]
    flow = Measurement.of([parts["flow"]])
    found.append(
        Result(
            group=GROUP,
            case=f"runfold.flow on MemoryStore: instructions per step, {WORKFLOW_STEPS}-step "
            "workflow (callgrind)",
            on="MemoryStore",
            unit="instructions",
            value=flow,
            comparisons=compare(flow, "the Engine alone", count),
            lower_is_better=True,
            note="counted once: the same workflow as `@workflow` code (`Flow.start`); over "
            "the engine, the interpreter, the step calls and bodies, the JSON payloads",
        )
    )
    threads = Measurement.of([parts["flow-threads"]])
    found.append(
        Result(
            group=GROUP,
            case=f"runfold.flow on MemoryStore, plain `def` step bodies: instructions per step, "
            f"{WORKFLOW_STEPS}-step workflow (callgrind)",
            on="MemoryStore",
            unit="instructions",
            value=threads,
            comparisons=compare(threads, "`async def` bodies", flow),
            lower_is_better=True,
            note="counted once: each body handed to the Flow's step threads and back",
        )
    )
    if "kernel" in parts:
        found.append(_split(parts["engine"], parts["handler"], parts["kernel"]))
    return found


def _split(engine: float, handler: float, kernel: float) -> Remark:
    """Where a step's instructions go, from the counts of the probe's parts."""

    def share(value: float) -> str:
        return f"{value:,.0f} ({100 * value / engine:.0f} %)"

    return Remark(
        group=GROUP,
        text=f"Where a step's {engine:,.0f} instructions go (callgrind, the probe's parts "
        "subtracted from one another): the kernel's decisions and folds (`decide_many` of "
        "the step's outcome, `decide_after` of the next start, each folded into a new "
        f"snapshot) {share(kernel)}; the handler's append of them on `MemoryStore` "
        "(the decision reused, checked to be the kernel's own on the cached snapshot; the "
        "run's index rows; the store's argument checks, the events' encoding, its rows) "
        f"{share(handler - kernel)}; the engine around them (asking the workflow, "
        f"the step's body and its invocation, the drive's bookkeeping, the event loop's "
        f"turns) {share(engine - handler)}. On a disk store the commit adds its own wait "
        "and the driver's CPU: see the Workflows rows against the raw-commit ceiling, and "
        "the pages each append writes in Pages per append.",
    )


if __name__ == "__main__":
    for name, count in instructions_per_step().items():
        print(f"{name}: {count:,.0f} instructions per step")
