"""Where a step's time goes: a section of the page, computed from the rows of one run.

One at a time, a workflow's step is the store's work (the commit a raw driver needs for the same
appends, and the store's own statements and Python around it, both measured by replaying the
engine's appends into a store alone) plus the engine's, the handler's and the kernel's (beside
which the same step's CPU on `MemoryStore` is given). A figure the run did not measure (a group
left out, no server) is said to be missing, never taken as zero.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.harness import Result
from benchmarks.targets import ENGINE_SEQUENTIAL_VS_CEILING

__all__ = ["step_time"]

STEPS = 10
"""The steps of the workflow the Workflows rows time."""
_ENGINE = "runfold Engine (CommandHandler on the store): 10-step sequential workflow, one"
_APPENDS = "runfold Engine (CommandHandler on the store): appends per"
_ALONE = "ceiling: the store alone"
_TRANSACTIONS = "ceiling: the store's transactions"
_CPU = "Engine on MemoryStore: cost per step, 10-step"
_BACKENDS = (("SQLite", "raw sqlite3"), ("PostgreSQL", "raw psycopg"))


def _row(results: Sequence[Result], group: str, case: str, on: str = "") -> Result | None:
    """The first row of `group` whose case starts with `case` (and whose `on` starts with
    `on`), or None when it was not measured."""
    return next(
        (
            r
            for r in results
            if r.group == group and r.case.startswith(case) and r.on.startswith(on)
        ),
        None,
    )


def _per_step(rate: Result | None) -> float | None:
    """µs per step of a row in workflows/s, or None when it was not measured."""
    return None if rate is None else 1e6 / rate.value.median / STEPS


def _part(micros: float, spent: float) -> str:
    return f"{micros:,.0f} µs ({100 * micros / spent:.0f} %)"


def _backend(
    results: Sequence[Result], backend: str, floor: str, spent: float, cpu: float | None
) -> str:
    """The line of one backend whose engine took `spent` µs per step one at a time, given
    `cpu`, the µs of the same step on `MemoryStore` (None: not measured)."""
    commit = _per_step(_row(results, "Workflows", f"ceiling: {floor} ÷", backend))
    alone = _per_step(_row(results, "Workflows", _ALONE, backend))
    transactions = _per_step(_row(results, "Workflows", _TRANSACTIONS, backend))
    appends = _row(results, "Workflows", _APPENDS, backend)
    of_its = f"{appends.value.median:.0f} " if appends is not None else ""
    raw = (
        f"{_part(commit, spent)} the raw single-row commits of its {of_its}appends per "
        f"workflow ({floor})"
        if commit is not None
        else f"the raw commits ({floor}) were not measured in this run"
    )
    text = f"- **{backend}**, one workflow at a time: {spent:,.0f} µs per step. "
    parts: list[float] = []
    if alone is None:
        text += (
            "The store alone was not measured in this run, so the store's work and the "
            f"engine's are not told apart: {raw}"
        )
        if commit is not None:
            parts.append(spent - commit)
            text += f", and {_part(spent - commit, spent)} the store's and the engine's together"
    else:
        text += (
            "The store alone (the engine's own appends replayed, no engine between them) "
            f"takes {_part(alone, spent)}: {raw}"
        )
        if commit is not None and transactions is not None:
            parts += [transactions - commit, alone - transactions]
            text += (
                f", {_part(transactions - commit, spent)} more for the store's own transactions "
                "(its statements and the pages they write beyond a raw row, in Pages per append: "
                "the store's transactions called straight), and "
                f"{_part(alone - transactions, spent)} the store's Python around them (its "
                "checks, the events' encoding, its group commit and its awaits)"
            )
        elif commit is not None:
            parts.append(alone - commit)
            text += (
                f", and {_part(alone - commit, spent)} the store's own work around the commit "
                "(its statements and its Python, the pages an append writes beyond a raw row, "
                "in Pages per append, the driver's hop)"
            )
        engine = spent - alone
        parts.append(engine)
        text += (
            f". What remains, {_part(engine, spent)}, is the engine's, the handler's and the "
            "kernel's"
        )
        if cpu is not None:
            parts.append(engine - cpu)
            text += f" ({_part(engine - cpu, spent)} beyond their CPU on `MemoryStore`)"
    text += (
        f". The same step on `MemoryStore` costs {_part(cpu, spent)} of CPU."
        if cpu is not None
        else ". The same step's CPU on `MemoryStore` (Engine cost) was not measured in this run."
    )
    if commit is not None:
        text += _at_target(commit, spent, transactions)
    if any(part < 0 for part in parts):
        text += (
            " A part below zero means that the rows it is taken from, each a median under the "
            "machine's load at its turn, differ by more than the part: a noisy run."
        )
    return text


def _at_target(commit: float, spent: float, transactions: float | None) -> str:
    """What a step's time would be at the target ratio to the raw commits, and what of it is
    left beyond the store's transactions (or the raw commits) for everything else."""
    bound = ENGINE_SEQUENTIAL_VS_CEILING.bound
    budget = commit / bound
    floor, what = (
        (transactions, "the store's transactions")
        if transactions is not None
        else (commit, "the raw commits")
    )
    return (
        f" At the target, {bound}× the raw commits, a step would take {budget:,.0f} µs: "
        f"{what} take {floor:,.0f} µs of it, which leaves {budget - floor:,.0f} µs for all "
        f"the rest, against {spent - floor:,.0f} µs today."
    )


def step_time(results: Sequence[Result]) -> list[str]:
    """The section's lines, or none when this run timed no engine workflow one at a time."""
    cpu_row = _row(results, "Engine cost", _CPU)
    cpu = cpu_row.value.median if cpu_row is not None else None
    spent = {
        backend: _per_step(_row(results, "Workflows", _ENGINE, backend)) for backend, _ in _BACKENDS
    }
    if all(s is None for s in spent.values()):
        return []
    lines = [
        f"- **{backend}**: not measured in this run."
        if (ours := spent[backend]) is None
        else _backend(results, backend, floor, ours, cpu)
        for backend, floor in _BACKENDS
    ]
    return [
        "",
        "## Where a step's time goes",
        "",
        "From this run's rows (Workflows, Engine cost, Pages per append): a step's wall time "
        "one workflow at a time, split into the store alone (the engine's own appends "
        "replayed into a fresh store: the commit a raw driver needs for the same appends, and "
        "the store's own work around it) and what remains, the engine's, the handler's and "
        "the kernel's, beside the same step's CPU on `MemoryStore`. A figure this run did not "
        "measure is said so. The instructions a step costs, and their split between the "
        "kernel, the handler with `MemoryStore` and the engine, are under Engine cost.",
        "",
        *lines,
    ]
