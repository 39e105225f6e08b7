"""The store alone (`benchmarks.store_alone`): an engine workflow's appends, recorded and
replayed into another store, write the same events and index rows under new run ids."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from benchmarks.backend import Backend
from benchmarks.harness import event_loop
from benchmarks.postgres import POSTGRES
from benchmarks.sqlite import SQLITE, transaction_trial
from benchmarks.store_alone import RecordingStore, renamed, replay_trial
from benchmarks.workflows import SequentialWorkflow
from benchmarks.workloads import WORKFLOW_STEPS
from runfold import CommandHandler
from runfold.engine import Engine
from runfold.kernel import HookClaim
from runfold.stores import SQLiteStore


@pytest.mark.parametrize(
    "backend",
    [SQLITE, pytest.param(POSTGRES, marks=pytest.mark.postgres)],
    ids=["sqlite", "postgres"],
)
def test_a_replay_writes_what_the_engine_wrote_under_new_run_ids(backend: Backend) -> None:
    with event_loop() as loop, backend.store(loop) as first, backend.store(loop) as second:
        recording = RecordingStore(first)
        engine = Engine(CommandHandler(recording), SequentialWorkflow())
        original = loop.run_until_complete(engine.start("sequential", b"input")).run_id
        workflow = recording.appends
        assert len(workflow) == WORKFLOW_STEPS + 1
        trial = replay_trial(second, loop, workflow, count=2)
        for _ in range(2):  # two rounds: four copies, each after runs already in the store
            trial.prepare()
            trial.run()
        history = [e.event for e in loop.run_until_complete(first.read(original))]
        [summary] = loop.run_until_complete(first.get_runs([original]))
        assert summary is not None and summary.status == "completed"
        copies = loop.run_until_complete(second.list_runs(limit=10)).items
        assert len({c.run_id for c in copies}) == 4
        for copied in copies:
            run_id = copied.run_id
            assert len(run_id) == len(original) and run_id != original
            assert copied == attrs.evolve(summary, run_id=run_id)
            assert [e.event for e in loop.run_until_complete(second.read(run_id))] == history


def test_only_the_appends_of_one_run_without_hooks_are_renamed() -> None:
    with event_loop() as loop, SQLITE.store(loop) as store:
        recording = RecordingStore(store)
        engine = Engine(CommandHandler(recording), SequentialWorkflow())
        for _ in range(2):
            loop.run_until_complete(engine.start("sequential", b"input"))
    one, other = recording.appends[0], recording.appends[-1]
    with pytest.raises(ValueError, match="one run"):
        renamed([one, other], "run_new")
    claim = HookClaim(token="t", hook_id="h", retained_until=None)
    hooked = attrs.evolve(other, index=attrs.evolve(other.index, hooks=(claim,)))
    with pytest.raises(ValueError, match="hook tokens"):
        renamed([hooked], "run_new")
    [moved] = renamed([other], "run_new")
    assert moved == attrs.evolve(
        other,
        run_id="run_new",
        index=attrs.evolve(
            other.index, summary=attrs.evolve(other.index.summary, run_id="run_new")
        ),
    )


def test_the_store_s_transactions_write_what_the_engine_wrote(tmp_path: Path) -> None:
    with event_loop() as loop, SQLITE.store(loop) as first:
        recording = RecordingStore(first)
        engine = Engine(CommandHandler(recording), SequentialWorkflow())
        original = loop.run_until_complete(engine.start("sequential", b"input")).run_id
        history = loop.run_until_complete(first.read(original))
        [summary] = loop.run_until_complete(first.get_runs([original]))
        path = tmp_path / "transactions.db"
        with transaction_trial(path, loop, recording.appends, count=2) as trial:
            for _ in range(2):  # four copies, the later ones after runs already in the file
                trial.prepare()
                trial.run()
        second = loop.run_until_complete(SQLiteStore.open(path))
        try:
            copies = loop.run_until_complete(second.list_runs(limit=10)).items
            assert len({c.run_id for c in copies}) == 4
            positions: list[int] = []
            for copied in copies:
                assert summary is not None and copied == attrs.evolve(summary, run_id=copied.run_id)
                written = loop.run_until_complete(second.read(copied.run_id))
                assert [e.event for e in written] == [e.event for e in history]
                positions += [e.position or 0 for e in written]
            assert sorted(positions) == list(range(1, 4 * len(history) + 1))
        finally:
            loop.run_until_complete(second.close())
