"""The page: machine and command, the summary of targets, how peers are configured, one
section per benchmark group (chart, table, remarks), and what misses its target."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from collections.abc import Mapping, Sequence

from benchmarks.harness import Comparison, Remark, Result, Target, cpu_model
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE, default_synchronous
from benchmarks.step_time import step_time
from benchmarks.targets import ALL_TARGETS
from benchmarks.workloads import PAYLOAD_BYTES

__all__ = ["format_value", "render"]


def format_value(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.2f} ms"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.1f} {unit}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _machine() -> list[str]:
    postgres = POSTGRES.version()
    return [
        f"- CPU: {cpu_model()}",
        f"- Python {sys.version.split()[0]} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}",
        f"- SQLite {SQLITE.version()}; "
        + (f"PostgreSQL {postgres} (local server)" if postgres else "no PostgreSQL server"),
        f"- runfold {_version('runfold')}; peers: eventsourcing {_version('eventsourcing')}, "
        f"DBOS Transact (`dbos`) {_version('dbos')}; drivers: aiosqlite "
        f"{_version('aiosqlite')}, psycopg {_version('psycopg')}",
    ]


def _fairness() -> list[str]:
    return [
        "- **Same run, same machine, taking turns.** Every contender runs in this one process "
        "(but the fleet's, whose workers are processes of their own: see its remark). "
        "Contenders of a comparison take turns, one timed run each per round, after a warm-up "
        "round, so that other load on the machine slows them alike. Set-up (fresh runs, warm "
        "caches, peers' aggregates) happens before each timed run and is not timed.",
        "- **SQLite**: every contender writes a file of its own under the same temporary "
        "directory (one file system), in WAL mode with `synchronous=FULL`: runfold's "
        "`SQLiteStore`, the raw "
        "`sqlite3` loop (`BEGIN IMMEDIATE`, the INSERTs, `COMMIT`), `eventsourcing`'s SQLite "
        "recorder (which puts a file in WAL mode and keeps SQLite's default `synchronous`), "
        "and DBOS's SQLite system database (put in WAL mode before DBOS opens it; DBOS keeps "
        f"SQLite's default `synchronous`, {default_synchronous()} here).",
        "- **PostgreSQL**: the same server for everyone, each contender in a fresh schema, "
        "`synchronous_commit=on`. The raw psycopg loop commits one INSERT per transaction "
        "(batched: `executemany` of the batch in one transaction); `eventsourcing` uses its "
        "PostgreSQL recorder; DBOS its system database; runfold's pool size is in each row. "
        "Runfold's statement ceiling sends, with the same bare psycopg loop, the very statement "
        "`PostgresStore` sends for a single-event append (the run's row moved and the event "
        "inserted, on runfold's schema): the ratio of runfold to it is runfold's client cost, "
        "the ratio of it to the raw INSERT what runfold's schema costs the server.",
        f"- **Payloads**: {PAYLOAD_BYTES} bytes for every input and output, as `bytes` for "
        "runfold and the raw loops, as strings for `eventsourcing` (its default transcoder "
        "has no bytes) and DBOS (which serializes Python values).",
        "- **eventsourcing** runs its documented path: an `Application`, aggregates saved with "
        "`save`, replayed with `repository.get`, no snapshots; its aggregate holds exactly as "
        "many events as runfold's run.",
        "- **DBOS Transact** runs the same 10-step sequential workflow as `runfold.engine."
        "Engine`: `@DBOS.workflow` calling a `@DBOS.step` ten times, each fed the previous "
        "output, with DBOS's primary (synchronous) API and its default settings otherwise; "
        "one workflow at a time, like the engine. Step latency is measured the same way for "
        "both, from stamps taken inside the step bodies.",
        "- **Raw floors** do only what the database needs for the same durability, with no "
        "runfold logic: they bound what any store on that driver can reach.",
    ]


def _ratios(result: Result) -> str:
    if not result.comparisons:
        return "–"
    return "<br>".join(_comparison(c) for c in result.comparisons)


def _comparison(comparison: Comparison) -> str:
    text = f"{comparison.ratio:.2f}× {comparison.anchor}"
    target = comparison.target
    if target is not None:
        bound = f"{'≤' if target.at_most else '≥'} {target.bound:g}×"
        text += f" (target {bound}{'' if target.met(comparison.ratio) else ', **below**'})"
    return text


def _with_target(results: Sequence[Result], target: Target) -> list[tuple[Result, Comparison]]:
    return [(r, c) for r in results for c in r.comparisons if c.target is target]


def _summary(results: Sequence[Result]) -> list[str]:
    lines = [
        "| target | measured (worst row) | met | row |",
        "| --- | ---: | :---: | --- |",
    ]
    for target in ALL_TARGETS:
        found = _with_target(results, target)
        if not found:
            lines.append(f"| {target.goal} | not measured | – | – |")
            continue
        worst = target.worst([c.ratio for _, c in found])
        result, _ = next((r, c) for r, c in found if c.ratio == worst)
        met = "yes" if all(target.met(c.ratio) for _, c in found) else "**no**"
        row = f"{result.case} ({format_value(result.value.median, result.unit)}, {result.on})"
        lines.append(f"| {target.goal} | {worst:.2f}× | {met} | {row} |")
    return lines


def _below_target(results: Sequence[Result]) -> list[str]:
    missed = [
        f"- **{r.group}**: {r.case} ({r.on}): **{c.ratio:.2f}×** {c.anchor}; the target: "
        f"{c.target.goal}."
        for r in results
        for c in r.comparisons
        if c.target is not None and not c.target.met(c.ratio)
    ]
    if not missed:
        return ["", "## Below target", "", "Nothing: every target measured is met."]
    return ["", "## Below target", "", "Where runfold misses a target, as measured:", "", *missed]


def _section(
    group: str, results: Sequence[Result], remarks: Sequence[Remark], chart: str | None
) -> list[str]:
    lines = ["", f"## {group}", ""]
    if chart is not None:
        lines += [f"![{group}: medians with min–max spread]({chart})", ""]
    if results:
        lines += [
            "| what was measured | on | median | spread | ratio |",
            "| --- | --- | ---: | ---: | --- |",
        ]
        for r in results:
            median = format_value(r.value.median, r.unit)
            spread = f"±{r.value.spread_percent():.0f}% (n={r.value.repeats})"
            case = r.case + (f"; {r.note}" if r.note else "")
            lines.append(f"| {case} | {r.on} | {median} | {spread} | {_ratios(r)} |")
    for remark in remarks:
        lines += ["", remark.text]
    return lines


def render(
    results: Sequence[Result],
    remarks: Sequence[Remark],
    *,
    command: str,
    charts: Mapping[str, str],
) -> str:
    """The whole page; `charts` maps a group to its chart's path relative to the page."""
    groups = list(dict.fromkeys([r.group for r in results] + [m.group for m in remarks]))
    lines = [
        "# Performance",
        "",
        "Measured on:",
        "",
        *_machine(),
        "",
        f"Reproduce with `{command}` from a clone (`make bench` installs the peers and runs "
        "it). Nothing here asserts a time.",
        "",
        "## Summary",
        "",
        *_summary(results),
        "",
        "Each figure is the median of several timed runs after a warm-up; the spread is half "
        "the range (max − min) as a percentage of the median, with the number of timed runs. "
        "A ratio is the row's median divided by the median of the anchor it names, measured in "
        "the same run; for latencies and memory, lower is better.",
        "",
        "## How the peers are configured",
        "",
        *_fairness(),
    ]
    for group in groups:
        lines += _section(
            group,
            [r for r in results if r.group == group],
            [m for m in remarks if m.group == group],
            charts.get(group),
        )
    lines += step_time(results)
    lines += _below_target(results)
    return "\n".join(lines) + "\n"
