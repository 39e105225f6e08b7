"""`python -m benchmarks [--quick] [--only NAME] [--out DIR]`: run the benchmarks, write
`performance.md` (default into `docs/`). Nothing here asserts a time."""

from __future__ import annotations

import argparse
import os
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


def render(results: list[Result], command: str) -> str:
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
        "| benchmark | case | median | spread | ratio | anchor | note |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        ratio = f"{r.ratio:.2f}×" if r.ratio is not None else "–"
        lines.append(
            f"| {r.benchmark} | {r.case} | {_format_rate(r.value.median, r.unit)} | "
            f"±{r.value.spread_percent() / 2:.0f}% | {ratio} | {r.anchor or '–'} | {r.note} |"
        )
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
