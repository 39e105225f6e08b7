"""`python -m benchmarks [--quick] [--only NAME] [--out DIR] [--postgres DSN]`: run the
benchmarks, write `performance.md` and its charts (`assets/performance/*.png`) into DIR
(default `docs/`). Nothing here asserts a time."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from benchmarks.citus import bench_citus
from benchmarks.commands import bench_commands
from benchmarks.deploys import bench_deploys
from benchmarks.engine_cost import bench_engine_cost
from benchmarks.fleet import bench_fleet
from benchmarks.flow import bench_flow
from benchmarks.harness import Remark, Result
from benchmarks.inspector import bench_inspector, bench_start_up
from benchmarks.instructions import bench_instructions
from benchmarks.kernel import bench_apply, bench_fold, bench_memory
from benchmarks.pages import bench_pages
from benchmarks.postgres import POSTGRES
from benchmarks.replay import bench_replay
from benchmarks.report import format_value, render
from benchmarks.scale import bench_scale
from benchmarks.sqlite import SQLITE
from benchmarks.workflows import bench_workflows
from benchmarks.writes import bench_append, bench_contention

BENCHMARKS: dict[str, Callable[[bool], Sequence[Result | Remark]]] = {
    "fold": bench_fold,
    "apply": bench_apply,
    "replay": bench_replay,
    "memory": bench_memory,
    "sqlite-append": partial(bench_append, SQLITE),
    "postgres-append": partial(bench_append, POSTGRES),
    "sqlite-contention": partial(bench_contention, SQLITE),
    "postgres-contention": partial(bench_contention, POSTGRES),
    "citus": bench_citus,
    "scale": bench_scale,
    "commands": bench_commands,
    "workflows": bench_workflows,
    "engine-cost": bench_engine_cost,
    "instructions": bench_instructions,
    "pages": bench_pages,
    "durable-functions": bench_flow,
    "fleet": bench_fleet,
    "deploys": bench_deploys,
    "inspector": bench_inspector,
    "start-up": bench_start_up,
}
CHARTS = Path("assets") / "performance"
"""Where the charts go, relative to the page (which links them relatively)."""


def _slug(group: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", group.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repeats")
    parser.add_argument("--only", choices=list(BENCHMARKS), action="append")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs"),
        help="where performance.md and assets/performance/*.png go",
    )
    parser.add_argument(
        "--postgres",
        metavar="DSN",
        help="the PostgreSQL server of the postgres benchmarks (default: 127.0.0.1:5432)",
    )
    args = parser.parse_args(argv)
    if args.postgres:
        os.environ["RUNFOLD_BENCH_POSTGRES_DSN"] = args.postgres
    results: list[Result] = []
    remarks: list[Remark] = []
    for name in args.only or list(BENCHMARKS):
        print(f"benchmark {name} …", file=sys.stderr, flush=True)
        for found in BENCHMARKS[name](args.quick):
            if isinstance(found, Remark):
                print(f"  {found.text}", file=sys.stderr)
                remarks.append(found)
                continue
            ratio = "".join(f"  ({c.ratio:.2f}× {c.anchor})" for c in found.comparisons)
            where = found.on.split(",")[0]
            value = format_value(found.value.median, found.unit)
            print(f"  {found.case} [{where}]: {value}{ratio}")
            results.append(found)
    # Imported late: matplotlib takes a second to import, and only the charts need it.
    from benchmarks.charts import draw_group

    charts: dict[str, str] = {}
    for group in dict.fromkeys(r.group for r in results):
        chart = CHARTS / f"{_slug(group)}.png"
        draw_group(group, [r for r in results if r.group == group], args.out / chart)
        charts[group] = chart.as_posix()
    command = "python -m benchmarks" + (" --quick" if args.quick else "")
    command += "".join(f" --only {name}" for name in args.only or [])
    args.out.mkdir(parents=True, exist_ok=True)
    page = args.out / "performance.md"
    page.write_text(render(results, remarks, command=command, charts=charts))
    print(f"wrote {page} and {len(charts)} chart(s) in {args.out / CHARTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
