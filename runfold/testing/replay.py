"""`replay`: check workflow code against recorded histories, in a test, without a database.

Export the runs to check once (`runfold export --all > histories.jsonl`, from production, say),
keep the file with the tests, and in CI:

    results = replay("histories.jsonl", [order])
    assert all(r.passed for r in results), [str(r.divergence) for r in results if not r.passed]

Each run is replayed as `runfold replay-check` does (`runfold.flow.replay.ReplayChecker`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from runfold.flow.definition import Workflow
from runfold.flow.encoding import PayloadCodec
from runfold.flow.replay import ReplayChecker, ReplayResult
from runfold.kernel import Envelope, project_run
from runfold.transfer import read_export

__all__ = ["replay"]


def replay(
    histories: str | os.PathLike[str] | Iterable[Sequence[Envelope]],
    workflows: Iterable[Workflow],
    *,
    codec: PayloadCodec | None = None,
) -> list[ReplayResult]:
    """Replay each run's history against `workflows`; one result per run, in order.

    `histories` is an export file's path (`runfold export`), or runs' histories (each a
    sequence of envelopes, as `EventStore.read` or `runfold.transfer.read_export` give them).

    Raises:
        ExportFormatError: The file holds a line this runfold cannot read.
        HistoryError: A history breaks a law of `project_run`.
    """
    checker = ReplayChecker(workflows, codec=codec)
    if isinstance(histories, str | os.PathLike):
        with Path(histories).open(encoding="utf-8") as lines:
            return [checker.check(project_run(history)) for history in read_export(lines)]
    return [checker.check(project_run(history)) for history in histories]
