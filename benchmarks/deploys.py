"""Safe deploys: `runfold replay-check` over recorded ten-step runs on a SQLite file (issue 33:
10,000 runs in under a minute), beside its ceiling, the store's own replay of the same runs
(read and fold, no workflow code).

The runs are one run recorded through `Flow`, then imported under new ids
(`runfold.transfer.import_runs`, one append a run). The check is timed as a user meets it: the
whole `runfold replay-check` process, its start-up and imports included."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.deploy_app import ten_steps
from benchmarks.harness import Measurement, Result, compare, event_loop
from runfold.events import Envelope
from runfold.flow import Flow
from runfold.stores import SQLiteStore
from runfold.stores.protocol import replay_run
from runfold.transfer import import_runs

__all__ = ["bench_deploys"]

GROUP = "Safe deploys"
ROOT = Path(__file__).resolve().parent.parent
CHECK = "runfold replay-check (whole process)"
CEILING = "ceiling: the store's replay of each run (read + fold)"


async def _record(path: Path, runs: int) -> list[str]:
    store = await SQLiteStore.open(path)
    try:
        flow = Flow(store, [ten_steps], step_threads=0)
        await flow.start(ten_steps, 0, run_id="template")
        template = await store.read("template")
        copies = [
            [
                Envelope(
                    run_id=f"run-{n:05d}",
                    sequence=e.sequence,
                    event=e.event,
                    recorded_at=e.recorded_at,
                )
                for e in template
            ]
            for n in range(1, runs)
        ]
        await import_runs(store, copies)
        return ["template", *(f"run-{n:05d}" for n in range(1, runs))]
    finally:
        await store.close()


async def _replay_all(path: Path, run_ids: list[str]) -> None:
    store = await SQLiteStore.open(path)
    try:
        for run_id in run_ids:
            await replay_run(store, run_id)
    finally:
        await store.close()


def _check(path: Path) -> float:
    start = time.perf_counter()
    command = ["replay-check", "--app", "benchmarks.deploy_app", "--store", f"sqlite:///{path}"]
    done = subprocess.run(
        [sys.executable, "-m", "runfold", *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"replay-check failed: {done.stdout}{done.stderr}")
    return elapsed


def bench_deploys(quick: bool) -> list[Result]:
    runs = 300 if quick else 10_000
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory() as folder, event_loop() as loop:
        path = Path(folder) / "deploys.db"
        run_ids = loop.run_until_complete(_record(path, runs))
        checks: list[float] = []
        replays: list[float] = []
        for _ in range(repeats):
            checks.append(_check(path))
            start = time.perf_counter()
            loop.run_until_complete(_replay_all(path, run_ids))
            replays.append(time.perf_counter() - start)
    check = Measurement.of([runs / s for s in checks])
    ceiling = Measurement.of([runs / s for s in replays])
    on = f"SQLite file, {runs:,} ten-step runs"
    return [
        Result(
            group=GROUP,
            case=CHECK,
            on=on,
            unit="runs/s",
            value=check,
            comparisons=compare(check, CEILING, ceiling),
            note=f"{runs:,} runs in {min(checks):.1f} s at best (goal: 10,000 in under 60 s)",
        ),
        Result(group=GROUP, case=CEILING, on=on, unit="runs/s", value=ceiling),
    ]
