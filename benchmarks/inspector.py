"""The operator's face: `runfold ui` on a run of 100,000 events, and the command line's start-up.

Inspector rows: the first screen of the long run's page (its HTML, from a server just started),
its details fragment cold (the run folded) and warm, and the bytes of each, against the goals
of issue #32 (200 ms, 1 MB). Then 200 clients, each on a kept-alive connection, ask for a mix
of the pages for 30 s while writer processes append to the same SQLite file: the requests'
p50 and p99 against the 1 s goal, and the writers' commands per second beside the same writers
alone (the inspector must not stall them), with their p99 and longest gaps between two commands.

Start-up rows: `runfold --help` and `runfold runs` in a new process, against the 300 ms goal.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Measurement, Remark, Result, compare, cpu_model, percentiles
from benchmarks.inspector_load import (
    BIG_RUN,
    fetch,
    load,
    load_paths,
    seed_store,
    serving,
    writing,
)
from benchmarks.targets import (
    CLI_START_UP,
    CLI_START_UP_MS,
    INSPECTOR_FIRST_SCREEN,
    INSPECTOR_FIRST_SCREEN_MS,
    INSPECTOR_P99,
    INSPECTOR_P99_MS,
    INSPECTOR_PAGE_BYTES,
    INSPECTOR_PAGE_LIMIT,
)

__all__ = ["bench_inspector", "bench_start_up"]

WRITERS = 2
CLIENTS = 200


def _ms(samples: list[float]) -> Measurement:
    return Measurement.of([s * 1000 for s in samples])


def _goal(value: float) -> Measurement:
    return Measurement.of([value])


def _timed_get(base: str, path: str) -> tuple[float, int]:
    start = time.perf_counter()
    status, size = asyncio.run(fetch(base, path))
    elapsed = time.perf_counter() - start
    if status != 200:
        raise RuntimeError(f"GET {path}: HTTP {status}")
    return elapsed, size


def bench_inspector(quick: bool) -> list[Result | Remark]:
    """First screen, details and page bytes of a long run's page; the load with writers."""
    events = 10_000 if quick else 100_000
    repeats = 2 if quick else 5
    seconds = 3.0 if quick else 30.0
    group = "Inspector (runfold ui)"
    on = f"SQLite, {cpu_model()}"
    found: list[Result | Remark] = []
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "inspected.db"
        asyncio.run(seed_store(path, events))
        url = f"sqlite:///{path}"
        first: list[float] = []
        cold: list[float] = []
        warm: list[float] = []
        sizes: dict[str, int] = {}
        for _ in range(repeats):
            with serving(url) as base:
                asyncio.run(fetch(base, "/static/favicon.svg"))
                elapsed, sizes["first screen"] = _timed_get(base, f"/runs/{BIG_RUN}")
                first.append(elapsed)
                elapsed, sizes["details"] = _timed_get(base, f"/runs/{BIG_RUN}/details")
                cold.append(elapsed)
                warm.append(_timed_get(base, f"/runs/{BIG_RUN}/details?steps_from=20")[0])
        label = f"a run of {events:,} events"
        found.append(
            Result(
                group=group,
                case=f"first screen of {label} (HTML, new server)",
                on=on,
                unit="ms",
                value=_ms(first),
                comparisons=compare(
                    _ms(first),
                    f"{INSPECTOR_FIRST_SCREEN_MS} ms goal",
                    _goal(INSPECTOR_FIRST_SCREEN_MS),
                    INSPECTOR_FIRST_SCREEN,
                ),
                lower_is_better=True,
            )
        )
        for case, samples in (("details, run folded (cold)", cold), ("details, warm", warm)):
            found.append(
                Result(
                    group=group,
                    case=f"{case}, {label}",
                    on=on,
                    unit="ms",
                    value=_ms(samples),
                    lower_is_better=True,
                )
            )
        for part, size in sizes.items():
            found.append(
                Result(
                    group=group,
                    case=f"bytes of the {part}, {label}",
                    on=on,
                    unit="bytes",
                    value=_goal(size),
                    comparisons=compare(
                        _goal(size), "1 MB goal", _goal(INSPECTOR_PAGE_LIMIT), INSPECTOR_PAGE_BYTES
                    ),
                    lower_is_better=True,
                )
            )
        found += _under_load(url, events, seconds, group, on)
    return found


def _under_load(url: str, events: int, seconds: float, group: str, on: str) -> list[Result]:
    with writing(url, writers=WRITERS, seconds=seconds) as alone:
        pass
    with serving(url) as base:
        for path in load_paths(events):  # each page rendered once, as after a first visit
            asyncio.run(fetch(base, path))
        with writing(url, writers=WRITERS, seconds=seconds) as loaded:
            report = asyncio.run(load(base, load_paths(events), clients=CLIENTS, seconds=seconds))
    failed = [r.error for r in [*alone, *loaded] if r.error] + [
        f"{count} × {kind}" for kind, count in report.errors.items()
    ]
    if failed:
        raise RuntimeError(f"the load saw errors: {failed}")
    cuts = percentiles(report.latencies, [50, 99])
    p99 = _goal(cuts[99] * 1000)
    case = f"{CLIENTS} clients for {seconds:g} s, {WRITERS} writers appending"
    rate_alone = _goal(sum(r.commands / r.seconds for r in alone))
    rate_loaded = _goal(sum(r.commands / r.seconds for r in loaded))
    return [
        Result(
            group=group,
            case=f"requests/s, {case}",
            on=on,
            unit="requests/s",
            value=_goal(len(report.latencies) / seconds),
        ),
        Result(
            group=group,
            case=f"p50 latency, {case}",
            on=on,
            unit="ms",
            value=_goal(cuts[50] * 1000),
            lower_is_better=True,
        ),
        Result(
            group=group,
            case=f"p99 latency, {case}",
            on=on,
            unit="ms",
            value=p99,
            comparisons=compare(
                p99, f"{INSPECTOR_P99_MS} ms goal", _goal(INSPECTOR_P99_MS), INSPECTOR_P99
            ),
            lower_is_better=True,
        ),
        Result(
            group=group,
            case=f"writers' commands/s under the load ({WRITERS} processes)",
            on=on,
            unit="commands/s",
            value=rate_loaded,
            comparisons=compare(rate_loaded, "the same writers alone", rate_alone),
        ),
        *(
            Result(
                group=group,
                case=f"writers' {label} gap between two commands under the load",
                on=on,
                unit="ms",
                value=_goal(max(getattr(r, field) for r in loaded) * 1000),
                comparisons=compare(
                    _goal(max(getattr(r, field) for r in loaded)),
                    "the same writers alone",
                    _goal(max(getattr(r, field) for r in alone)),
                ),
                lower_is_better=True,
            )
            for label, field in (("p99", "p99_gap"), ("longest", "longest_gap"))
        ),
    ]


def bench_start_up(quick: bool) -> list[Result | Remark]:
    """`runfold --help` and `runfold runs` in a new process (the interpreter's start included)."""
    repeats = 3 if quick else 10
    on = f"Python {sys.version_info.major}.{sys.version_info.minor}, {cpu_model()}"
    found: list[Result | Remark] = []
    with tempfile.TemporaryDirectory() as directory:
        store = f"sqlite:///{Path(directory) / 'runs.db'}"
        subprocess.run(
            [sys.executable, "-m", "runfold", "migrate", "--store", store],
            check=True,
            capture_output=True,
        )
        bare = _process_ms([sys.executable, "-c", "pass"], repeats)
        for name, argv in (
            ("runfold --help", ["--help"]),
            ("runfold runs", ["runs", "--store", store]),
        ):
            taken = _process_ms([sys.executable, "-m", "runfold", *argv], repeats)
            found.append(
                Result(
                    group="Command line start-up",
                    case=f"{name}, a new process",
                    on=on,
                    unit="ms",
                    value=taken,
                    comparisons=(
                        *compare(
                            taken,
                            f"{CLI_START_UP_MS} ms goal",
                            _goal(CLI_START_UP_MS),
                            CLI_START_UP,
                        ),
                        *compare(taken, "python -c pass", bare),
                    ),
                    note=f"python -c pass takes {bare.median:.0f} ms",
                    lower_is_better=True,
                )
            )
    return found


def _process_ms(argv: list[str], repeats: int) -> Measurement:
    samples = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return _ms(samples[1:])
