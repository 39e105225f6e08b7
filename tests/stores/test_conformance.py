"""The conformance kit: our stores and the worked example pass it; every broken store fails it.

Our stores run the kit the way any store implementer would: a `StoreConformance` subclass with
`make_store` (and the optional hooks their capabilities need). PostgresStore joins the same way
(with `tests.support.postgres_support`).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from runfold.conformance import (
    CHECK_NAMES,
    CHECKS,
    Capabilities,
    StoreConformance,
    load_factory,
    run_conformance,
)
from runfold.stores import MemoryStore, PostgresStore, SQLiteStore
from runfold.stores.protocol import EventStore
from tests.support.broken_stores import (
    CAUGHT_BY,
    CorrelationByRecordedAt,
    ReplaysAllButTheLast,
    ReplaysWithoutLimits,
)
from tests.support.postgres_support import DSN, admin, schema_name

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "docs.examples.thirdparty.jsonl_store:JsonlStoreConformance"


class TestMemoryStore(StoreConformance):
    capabilities = Capabilities(corruption=True, rewrite_index=True)

    async def make_store(self) -> EventStore:
        return MemoryStore()

    async def corrupt_payload(self, store: EventStore, run_id: str, sequence: int) -> None:
        assert isinstance(store, MemoryStore)
        row = store._rows[run_id][sequence - 1]
        damaged = attrs.evolve(row, payload=b"\xff\x00")
        store._rows[run_id][sequence - 1] = damaged
        store._feed[store._feed.index(row)] = damaged


@pytest.mark.postgres
class TestPostgresStore(StoreConformance):
    capabilities = Capabilities(
        reopen=True, corruption=True, sharing=True, rewrite_index=True, replay=True
    )

    async def make_store(self) -> EventStore:
        admin()  # skips (fails under CI=true) without a server
        return await PostgresStore.open(DSN, schema=schema_name("kit"), pool_max=4)

    async def reopen_store(self, store: EventStore) -> EventStore:
        assert isinstance(store, PostgresStore)
        return await PostgresStore.open(DSN, schema=store._schema, pool_max=4)

    async def share_store(self, store: EventStore) -> EventStore:
        assert isinstance(store, PostgresStore)
        return await PostgresStore.open(DSN, schema=store._schema, pool_max=4)

    async def corrupt_payload(self, store: EventStore, run_id: str, sequence: int) -> None:
        assert isinstance(store, PostgresStore)
        admin().execute(
            f'UPDATE "{store._schema}".events SET payload = %s WHERE run_id = %s AND sequence = %s',
            (b"\xff\x00", run_id, sequence),
        )


class TestSQLiteFile(StoreConformance):
    capabilities = Capabilities(
        reopen=True, corruption=True, sharing=True, rewrite_index=True, replay=True
    )

    async def make_store(self) -> EventStore:
        return await SQLiteStore.open(self.tmp_dir / f"{self.unique_name()}.db")

    async def reopen_store(self, store: EventStore) -> EventStore:
        assert isinstance(store, SQLiteStore)
        return await SQLiteStore.open(store._path)

    async def share_store(self, store: EventStore) -> EventStore:
        assert isinstance(store, SQLiteStore)
        return await SQLiteStore.open(store._path)

    async def corrupt_payload(self, store: EventStore, run_id: str, sequence: int) -> None:
        assert isinstance(store, SQLiteStore)
        with sqlite3.connect(store._path) as db:
            db.execute(
                "UPDATE events SET payload = x'ff00' WHERE run_id = ? AND sequence = ?",
                (run_id, sequence),
            )
        db.close()


@pytest.mark.slow
class TestSQLiteInMemory(StoreConformance):
    capabilities = Capabilities(rewrite_index=True, replay=True)

    async def make_store(self) -> EventStore:
        return await SQLiteStore.open(":memory:")


def _example() -> type[StoreConformance]:
    found = load_factory(EXAMPLE)
    assert isinstance(found, type) and issubclass(found, StoreConformance)
    return found


TestJsonlExample = _example()
"""The worked example of `docs/`, a third-party JSON-lines store, passes every check."""


# --- teeth ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broken", "check"), list(CAUGHT_BY.items()), ids=[s.__name__ for s in CAUGHT_BY]
)
def test_the_kit_fails_a_broken_store_by_name(broken: type[MemoryStore], check: str) -> None:
    report = run_conformance(broken, examples=10, seed=0, shrink=False)
    assert check in report.failed, f"{check} passed {broken.__name__}:\n{report}"
    detail = report.result(check).detail
    # The line named is the check's (or the store's), never the kit's assertion helper.
    assert "(raised at " in detail and "builders.py" not in detail, detail
    assert not report.ok


@pytest.mark.slow
@pytest.mark.parametrize("broken", [ReplaysAllButTheLast, ReplaysWithoutLimits])
def test_the_kit_fails_a_wrong_replay(broken: type[MemoryStore]) -> None:
    check = "test_replay_is_the_fold_of_read"
    report = run_conformance(
        broken, capabilities=Capabilities(replay=True), checks=[check], shrink=False
    )
    assert report.failed == (check,), report


def test_a_failing_check_shows_the_values_it_compared() -> None:
    # pytest rewrote the kit's asserts (`register_assert_rewrite`): the values are in the report.
    check = "test_clock_stepping_back_keeps_sequence_order"
    detail = run_conformance(CorrelationByRecordedAt, checks=[check]).result(check).detail
    assert "assert [8, 9, 4, 6, 10, 7, ...] == [3, 4, 6, 7, 8, 9, ...]" in detail, detail
    assert "At index 0 diff: 8 != 3" in detail, detail


def test_every_broken_store_defect_is_distinct_and_named() -> None:
    assert len(CAUGHT_BY) >= 12
    assert set(CAUGHT_BY.values()) <= set(CHECK_NAMES)


# --- the kit's own contract -----------------------------------------------------------------------


def test_check_names_are_test_methods_with_docs() -> None:
    assert len(CHECK_NAMES) == len(set(CHECK_NAMES)) >= 50
    for check in CHECKS:
        assert check.name.startswith("test_")
        assert callable(getattr(StoreConformance, check.name))
        assert len(check.doc) > 40, check.name


def test_every_check_is_documented_with_what_it_proves() -> None:
    reference = (ROOT / "docs" / "reference" / "conformance.md").read_text()
    for check in CHECKS:
        row = f"| `{check.name}` | {check.doc}"
        assert row in reference, f"docs/reference/conformance.md lacks or misstates {check.name}"


def test_a_capability_not_offered_is_reported_not_passed() -> None:
    without = Capabilities(global_feed=False, retention=False, concurrency=False)
    report = run_conformance(MemoryStore, capabilities=without, examples=2)
    assert report.ok
    not_offered = set(report.not_offered)
    for check in CHECKS:
        offered = not check.missing(without)
        assert (check.name not in not_offered) == offered, check.name
    assert "test_tailing_reader_never_skips" in not_offered
    assert "test_reopen_holds_acknowledged" in not_offered
    detail = report.result("test_delete_runs_before_cutoff").detail
    assert detail == "not offered: retention"


LEASE_CHECKS = [check.name for check in CHECKS if check.capability == "leases"]


def test_lease_checks_are_not_offered_without_leases() -> None:
    declared = run_conformance(
        MemoryStore, capabilities=Capabilities(leases=False), checks=LEASE_CHECKS
    )
    assert declared.not_offered == tuple(LEASE_CHECKS), declared
    assert declared.result(LEASE_CHECKS[0]).detail == "not offered: leases"
    # A store that is no `WorkerLeases` (the worked example) is not offered them either.
    example = run_conformance(_example(), checks=LEASE_CHECKS)
    assert example.not_offered == tuple(LEASE_CHECKS), example
    assert "no WorkerLeases" in example.result(LEASE_CHECKS[0]).detail
    finished = _cli("runfold.stores:MemoryStore", "--without", "leases", "--check", LEASE_CHECKS[0])
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert [
        line.split()[:5] for line in finished.stdout.splitlines() if line.startswith("leases")
    ] == [["leases", "1", "0", "0", "1"]]


def test_declaring_a_capability_without_its_hook_fails_loudly() -> None:
    report = run_conformance(
        MemoryStore,
        capabilities=Capabilities(reopen=True),
        checks=["test_reopen_holds_acknowledged"],
    )
    assert report.failed == ("test_reopen_holds_acknowledged",)
    assert "reopen_store" in report.result("test_reopen_holds_acknowledged").detail


def test_run_conformance_takes_async_factories_and_a_selection() -> None:
    async def factory() -> EventStore:
        return MemoryStore()

    chosen = ["test_append_first_at_zero", "test_state_machine"]
    report = run_conformance(factory, checks=chosen, examples=3, seed="random")
    assert [r.name for r in report.results] == chosen
    assert report.ok and report.effort.seed is None and report.effort.examples == 3
    with pytest.raises(ValueError, match="test_nope"):
        run_conformance(factory, checks=["test_nope"])


def test_the_report_table_counts_by_capability() -> None:
    report = run_conformance(
        MemoryStore, checks=["test_append_at_head", "test_reopen_holds_acknowledged"]
    )
    lines = report.table().splitlines()
    assert lines[0].split() == [
        "capability",
        "checks",
        "passed",
        "failed",
        "not",
        "offered",
        "seconds",
    ]
    assert lines[1].split()[:5] == ["append", "1", "1", "0", "0"]
    assert lines[2].split()[:5] == ["reopen", "1", "0", "0", "1"]
    assert lines[3].split()[:5] == ["all", "2", "1", "0", "1"]
    assert str(report).endswith("PASSED")


def test_effort_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNFOLD_CONFORMANCE_EXAMPLES", "7")
    monkeypatch.setenv("RUNFOLD_CONFORMANCE_SEED", "random")
    report = run_conformance(MemoryStore, checks=["test_append_at_head"])
    assert (report.effort.examples, report.effort.seed) == (7, None)
    report = run_conformance(MemoryStore, checks=["test_append_at_head"], examples=3, seed=5)
    assert (report.effort.examples, report.effort.seed) == (3, 5)


def test_importing_the_kit_installs_no_pytest_plugin() -> None:
    code = (
        "import importlib.metadata as m, sys; import runfold.conformance;"
        "eps = [e for e in m.entry_points(group='pytest11') if 'runfold' in e.value];"
        "print(eps, 'asyncio' in sys.modules and 'pytest_asyncio' in sys.modules)"
    )
    finished = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert finished.stdout.strip() == "[] False"


@pytest.mark.slow
def test_pytest_runs_the_kit_without_any_async_plugin(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    (tmp_path / "test_mine.py").write_text(
        "from runfold.conformance import StoreConformance\n"
        "from runfold.stores import MemoryStore\n"
        "class TestMine(StoreConformance):\n"
        "    examples = 2\n"
        "    async def make_store(self):\n"
        "        return MemoryStore()\n"
    )
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:asyncio", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    summary = finished.stdout.strip().splitlines()[-1]
    skipped = sum(bool(check.missing(Capabilities())) for check in CHECKS)
    assert skipped == 8  # reopen, corruption, sharing (2), rewrite_index (2), replay (2) are off
    assert f"{len(CHECK_NAMES) - skipped} passed, {skipped} skipped" in summary, summary


# --- the command line -----------------------------------------------------------------------------


def _cli(*args: str, cwd: Path = ROOT, path: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "runfold.conformance", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=cwd,
        env=env,
    )


@pytest.mark.slow
def test_the_command_line_runs_a_store_module_outside_the_package() -> None:
    finished = _cli(EXAMPLE, "--examples", "5", "--seed", "3")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    out = finished.stdout
    assert "capability" in out and "not offered" in out
    assert out.rstrip().endswith("PASSED")
    assert "examples: 5, seed: 3" in out
    [total] = [line for line in out.splitlines() if line.startswith("all ")]
    # The example offers neither `sharing` nor `rewrite_index` nor `replay` (two checks each),
    # nor worker leases, nor signals.
    signal_checks = [check.name for check in CHECKS if check.capability == "signals"]
    missing = 6 + len(LEASE_CHECKS) + len(signal_checks)
    offered = len(CHECK_NAMES) - missing
    assert total.split()[1:5] == [str(len(CHECK_NAMES)), str(offered), "0", str(missing)]


@pytest.mark.slow
def test_the_command_line_fails_a_broken_store(tmp_path: Path) -> None:
    module = tmp_path / "my_store.py"
    module.write_text(
        "from tests.support.broken_stores import DescendingReadsWrong\n"
        "def factory():\n"
        "    return DescendingReadsWrong()\n"
    )
    finished = _cli(
        "my_store:factory",
        "--check",
        "test_read_descending_ranges",
        "--check",
        "test_read_ascending_ranges",
        "--without",
        "global_feed",
        cwd=tmp_path,
        path=str(ROOT),
    )
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert "FAILED test_read_descending_ranges (reads)" in finished.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "expected MODULE:FACTORY"),
        ("no_such_module_xyz:factory", "cannot import"),
        ("runfold.stores:no_such_factory", "has no"),
    ],
)
def test_the_command_line_refuses_a_bad_target(target: str, message: str) -> None:
    finished = _cli(target)
    assert finished.returncode == 2
    assert message in finished.stderr
