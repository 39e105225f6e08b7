"""Instructions per step: the CPU the engine and the kernel spend on one step of a 10-step
workflow on `MemoryStore`, counted by callgrind (valgrind), so the same whatever the load.

The probe (`benchmarks.instructions_probe`) runs under `valgrind --tool=callgrind` twice, with
none and with `WORKFLOWS` workflows after the same warm-up; the difference of the two counts,
divided by the steps, is what one step costs past start-up: the engine, the handler, the
kernel's decide / apply, `MemoryStore` and the event loop's turns, all in the one process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import Measurement, Remark, Result, compare
from benchmarks.targets import ENGINE_INSTRUCTIONS_PER_STEP, ENGINE_INSTRUCTIONS_PER_STEP_BEFORE
from benchmarks.workloads import WORKFLOW_STEPS

__all__ = ["bench_instructions", "instructions_per_step"]

GROUP = "Engine cost"
WORKFLOWS = 20
"""Workflows counted (after the warm-up) in the second of the two runs."""
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def _counted(workflows: int, folder: Path) -> int:
    """The instructions callgrind counts for the probe running `workflows` workflows."""
    out = folder / f"callgrind.{workflows}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.instructions_probe",
            str(workflows),
        ],
        check=True,
        capture_output=True,
        env=os.environ | {"PYTHONHASHSEED": "0"},
    )
    found = _TOTAL.search(out.read_text())
    assert found is not None, f"no total in {out}"
    return int(found.group(1))


def instructions_per_step(workflows: int = WORKFLOWS) -> float:
    """Instructions per step past start-up (see the module)."""
    with tempfile.TemporaryDirectory(prefix="runfold-callgrind-") as folder:
        none = _counted(0, Path(folder))
        some = _counted(workflows, Path(folder))
    return (some - none) / (workflows * WORKFLOW_STEPS)


def bench_instructions(quick: bool) -> list[Result | Remark]:
    if shutil.which("valgrind") is None:
        return [Remark(group=GROUP, text="No valgrind: instructions per step not counted.")]
    count = Measurement.of([instructions_per_step(5 if quick else WORKFLOWS)])
    before = Measurement.of([ENGINE_INSTRUCTIONS_PER_STEP_BEFORE])
    return [
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


if __name__ == "__main__":
    print(f"{instructions_per_step():,.0f} instructions per step")
