"""`python -m benchmarks [--quick] [--only NAME] [--out DIR]`: run the benchmarks, write
`performance.md` (default into `docs/`). Nothing here asserts a time."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import Result, machine_lines
from benchmarks.kernel import bench_apply, bench_fold, bench_memory, bench_replay
from benchmarks.postgres import bench_postgres_append, bench_postgres_concurrency
from benchmarks.sqlite import (
    bench_sqlite_append,
    bench_sqlite_concurrency,
    bench_sqlite_replay,
)
from benchmarks.workloads import PAYLOAD_BYTES

BENCHMARKS: dict[str, Callable[[bool], list[Result]]] = {
    "fold": bench_fold,
    "apply": bench_apply,
    "replay": bench_replay,
    "memory": bench_memory,
    "sqlite-append": bench_sqlite_append,
    "sqlite-concurrency": bench_sqlite_concurrency,
    "sqlite-replay": bench_sqlite_replay,
    "postgres-append": bench_postgres_append,
    "postgres-concurrency": bench_postgres_concurrency,
}


def _format_rate(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}"


def _required_ratio(result: Result) -> tuple[str, float] | None:
    """The bound a row's anchor asks for: ("≥", 0.8) from "target ≥ 0.8×", ("≤", 2.0) from
    "target ≤ 2×", or ("≥", 1.0) for a fixed-rate target such as "target 1,000,000 events/s"."""
    anchor = result.anchor or ""
    found = re.search(r"target(?: for \d+:)? ([≥≤]) ([\d.]+)×", anchor)
    if found:
        return found.group(1), float(found.group(2))
    if anchor.startswith("target "):
        return "≥", 1.0
    return None


def _misses(ratio: float, required: tuple[str, float]) -> bool:
    direction, bound = required
    return ratio < bound if direction == "≥" else ratio > bound


def render(results: list[Result], command: str) -> str:
    missed: list[str] = []
    lines = [
        "# Performance",
        "",
        "Measured on:",
        "",
        *machine_lines(),
        "",
        f"Reproduce with `{command}` (from a clone, after `make install`).",
        "Each figure is the median of several timed runs after a warm-up; the spread is the "
        "range (max − min) as a percentage of the median. Ratios compare with the anchor named "
        "in the same row, measured in the same run.",
        "",
        "Peers run in the same process and run, on the same machine and file system: "
        "`eventsourcing` with its POPO, SQLite and PostgreSQL recorders (its documented "
        "`Application`/`repository.get` path, no snapshots), the raw `sqlite3` and psycopg "
        "loops with one INSERT per transaction. Every SQLite contender runs in WAL mode with "
        "`synchronous=FULL`; Postgres runs with `synchronous_commit=on`. Payloads are "
        f"{PAYLOAD_BYTES} bytes for everyone (strings for `eventsourcing`, which has no bytes "
        "transcoder by default). Each timed run follows a warm-up run.",
        "",
        "| benchmark | case | median | spread | ratio | anchor | note |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        ratio = f"{r.ratio:.2f}×" if r.ratio is not None else "–"
        required = _required_ratio(r)
        is_runfold = not r.case.startswith(("eventsourcing", "raw")) and r.ratio != 1.0
        if (
            is_runfold
            and required is not None
            and r.ratio is not None
            and _misses(r.ratio, required)
        ):
            missed.append(f"- **{r.benchmark}**: {r.case}: {ratio} against {r.anchor}.")
        lines.append(
            f"| {r.benchmark} | {r.case} | {_format_rate(r.value.median, r.unit)} | "
            f"±{r.value.spread_percent() / 2:.0f}% | {ratio} | {r.anchor or '–'} | {r.note} |"
        )
    if missed:
        lines += ["", "## Below target", "", "Where runfold misses a target, as measured:", ""]
        lines += missed
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--only", choices=sorted(BENCHMARKS), action="append")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="where performance.md goes")
    parser.add_argument(
        "--postgres",
        metavar="DSN",
        help="the PostgreSQL server of the postgres benchmarks (default: 127.0.0.1:5432)",
    )
    args = parser.parse_args(argv)
    if args.postgres:
        os.environ["RUNFOLD_BENCH_POSTGRES_DSN"] = args.postgres
    chosen = args.only or list(BENCHMARKS)
    results: list[Result] = []
    for name in chosen:
        print(f"benchmark {name} …", file=sys.stderr, flush=True)
        for result in BENCHMARKS[name](args.quick):
            ratio = f"  ({result.ratio:.2f}× {result.anchor})" if result.ratio is not None else ""
            print(f"  {result.case}: {_format_rate(result.value.median, result.unit)}{ratio}")
            results.append(result)
    command = "python -m benchmarks" + (" --quick" if args.quick else "")
    if args.only:
        command += "".join(f" --only {name}" for name in args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "performance.md").write_text(render(results, command))
    print(f"wrote {args.out / 'performance.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
