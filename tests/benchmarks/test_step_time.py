"""Where a step's time goes (`benchmarks.step_time`): the split of the page, from a run's rows,
says which figure is missing rather than guessing it."""

from __future__ import annotations

from benchmarks.harness import Measurement, Result
from benchmarks.step_time import step_time

SQLITE = "SQLite 3.40.1 file in /tmp (ext4), WAL, synchronous=FULL"
ENGINE = "runfold Engine (CommandHandler on the store)"


def _row(group: str, case: str, value: float, on: str = SQLITE) -> Result:
    return Result(group=group, case=case, on=on, unit="workflows/s", value=Measurement.of([value]))


def _rows(
    *, alone: float | None = 125, cpu: float | None = 84, transactions: float | None = None
) -> list[Result]:
    """One engine step of 1,000 µs, its raw commits 400 µs, the store alone `alone`
    workflows/s (10,000 / alone µs per step), the store's transactions `transactions`
    workflows/s and `cpu` µs on `MemoryStore`."""
    rows = [
        _row("Workflows", f"{ENGINE}: 10-step sequential workflow, one at a time", 100),
        _row("Workflows", f"{ENGINE}: 10-step sequential workflow, 64 at once", 900),
        _row("Workflows", "ceiling: raw sqlite3 ÷ runfold's appends per workflow", 250),
        _row("Workflows", f"{ENGINE}: appends per 10-step workflow", 11),
    ]
    if alone is not None:
        case = "ceiling: the store alone: the engine's own appends replayed"
        rows.append(_row("Workflows", case, alone))
    if transactions is not None:
        case = "ceiling: the store's transactions: each of the engine's appends as the store"
        rows.append(_row("Workflows", case, transactions))
    if cpu is not None:
        case = "Engine on MemoryStore: cost per step, 10-step workflow"
        rows.append(_row("Engine cost", case, cpu, on="MemoryStore"))
    return rows


def _lines(results: list[Result]) -> dict[str, str]:
    """The section's line of each backend, by backend."""
    found = [line for line in step_time(results) if line.startswith("- **")]
    return {line.split("**")[1]: line for line in found}


def test_the_store_alone_splits_the_store_s_work_from_the_engine_s() -> None:
    lines = _lines(_rows())
    sqlite = lines["SQLite"]
    assert "1,000 µs per step" in sqlite
    assert "The store alone (the engine's own appends replayed" in sqlite
    assert "takes 800 µs (80 %)" in sqlite
    assert "400 µs (40 %) the raw single-row commits of its 11 appends" in sqlite
    assert "400 µs (40 %) the store's own work around the commit" in sqlite
    assert "What remains, 200 µs (20 %), is the engine's" in sqlite
    assert "116 µs (12 %) beyond their CPU on `MemoryStore`" in sqlite
    assert "costs 84 µs (8 %) of CPU" in sqlite
    assert "below zero" not in sqlite
    assert "At the target, 0.6× the raw commits, a step would take 667 µs" in sqlite
    assert "the raw commits take 400 µs of it, which leaves 267 µs for all the rest" in sqlite
    assert "against 600 µs today" in sqlite
    assert lines["PostgreSQL"] == "- **PostgreSQL**: not measured in this run."


def test_the_store_s_transactions_split_its_statements_from_its_python() -> None:
    # The store's transactions at 200 workflows/s: 500 µs a step, 100 µs beyond the raw commits.
    sqlite = _lines(_rows(transactions=200))["SQLite"]
    assert "400 µs (40 %) the raw single-row commits of its 11 appends" in sqlite
    assert "100 µs (10 %) more for the store's own transactions" in sqlite
    assert "300 µs (30 %) the store's Python around them" in sqlite
    assert "the store's own work around the commit" not in sqlite
    assert "the store's transactions take 500 µs of it, which leaves 167 µs" in sqlite
    assert "against 500 µs today" in sqlite


def test_a_missing_figure_is_said_to_be_missing() -> None:
    sqlite = _lines(_rows(alone=None, cpu=None))["SQLite"]
    assert "The store alone was not measured in this run" in sqlite
    assert "600 µs (60 %) the store's and the engine's together" in sqlite
    assert "(Engine cost) was not measured in this run" in sqlite
    assert "What remains" not in sqlite
    sqlite = _lines(_rows(cpu=None))["SQLite"]
    assert "What remains, 200 µs (20 %)" in sqlite
    assert "beyond their CPU" not in sqlite
    assert "(Engine cost) was not measured in this run" in sqlite


def test_a_part_below_zero_is_called_noise() -> None:
    # The store alone slower than the engine with it: the rows disagree by more than a part.
    sqlite = _lines(_rows(alone=90))["SQLite"]
    assert "What remains, -111 µs" in sqlite
    assert "A part below zero" in sqlite


def test_no_section_without_an_engine_row() -> None:
    assert step_time([r for r in _rows() if "one at a time" not in r.case]) == []
