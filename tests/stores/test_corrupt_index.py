"""Index rows are data too: a row that does not decode is `CorruptIndex` naming its run, on every
SQL store and through every read that meets it; `runfold runs` says so in one line; `runfold
verify --rebuild-index` rewrites the rows from the events whatever they hold; SQLite refuses a
value of the wrong type from its schema version 3 on, including a file migrated from before."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from runfold import CommandHandler, EventStore
from runfold.cli.verify import verify_store
from runfold.commands import CreateHook, CreateRun, CreateWait, StartRun
from runfold.errors import CorruptEvent, CorruptIndex, StoreError
from runfold.kernel import project_run, run_index
from runfold.stores import PostgresStore, SQLiteStore
from runfold.stores.sqlite.schema import SCHEMA_VERSION
from tests.conftest import T0, Clock
from tests.stores.test_sqlite_store import as_older_file, plain_execute, plain_query, tampered
from tests.support.cli_support import ok, one_line_error, runfold_cli
from tests.support.postgres_support import DSN, admin, schema_name

LATER = T0 + timedelta(days=1)


@attrs.define
class Backend:
    """A SQL store's file or schema, opened as often as a test likes, and a way to damage it."""

    name: str
    url: str
    open: Callable[[], Awaitable[EventStore]]
    tamper: Callable[[str, tuple[Any, ...]], None]
    """Run one SQL statement on the store's tables (`{s}` is where they are) behind its back."""


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "sqlite":
        path = tmp_path / "runfold.db"
        yield Backend(
            name="sqlite",
            url=f"sqlite:///{path}",
            open=lambda: SQLiteStore.open(path),
            tamper=lambda sql, params: tampered(path, sql.format(s="main"), params),
        )
        return
    admin()  # skips (fails under CI=true) without a server
    schema = schema_name("corrupt")

    def tamper(sql: str, params: tuple[Any, ...]) -> None:
        admin().execute(sql.format(s=f'"{schema}"'), params)

    yield Backend(
        name="postgres",
        url=f"{DSN}?schema={schema}",
        open=lambda: PostgresStore.open(DSN, schema=schema, pool_max=2),
        tamper=tamper,
    )


async def seed(store: EventStore) -> None:
    """Runs "a" and "b", each with a hook (a token) and a wait (a wakeup)."""
    handler = CommandHandler(store, clock=Clock())
    for run_id in ("a", "b"):
        await handler.execute(run_id, StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        await handler.execute(run_id, CreateHook(hook_id="h", token=f"secret-{run_id}"))
        await handler.execute(run_id, CreateWait(wait_id="w", resume_at=LATER))


async def kernel_rows(store: EventStore, run_id: str) -> Any:
    """The summary the kernel derives for the run from its events."""
    return run_index(project_run(await store.read(run_id))).summary


DAMAGE = {
    "attributes not JSON": ("UPDATE {s}.runs SET attributes = 'not json' WHERE run_id = %s", "b"),
    "attributes a JSON array": ("UPDATE {s}.runs SET attributes = '[1]' WHERE run_id = %s", "b"),
    "attributes of numbers": (
        """UPDATE {s}.runs SET attributes = '{{"k": 1}}' WHERE run_id = %s""",
        "b",
    ),
    "unknown status": ("UPDATE {s}.runs SET status = 'sleeping' WHERE run_id = %s", "b"),
    "unknown wakeup kind": ("UPDATE {s}.wakeups SET kind = 'nap' WHERE run_id = %s", "b"),
}
SQLITE_DAMAGE = {  # what only SQLite's loose column types let in
    "created_at text": ("UPDATE {s}.runs SET created_at = 'yesterday' WHERE run_id = %s", "b"),
    "completed_at real": ("UPDATE {s}.runs SET completed_at = 1.5 WHERE run_id = %s", "b"),
    # SQLite orders text after every number: this wakeup is never due and never next, so no
    # read meets it; verify finds it missing from the listing and rewrites it.
    "due_at text": ("UPDATE {s}.wakeups SET due_at = 'soon' WHERE run_id = %s", "b"),
    "retained_until real": (
        "UPDATE {s}.hooks SET retained_until = 1800000000000000.5 WHERE run_id = %s",
        "b",
    ),
}


async def _raised(read: Callable[[], Awaitable[Any]]) -> CorruptIndex | None:
    try:
        await read()
    except CorruptIndex as exc:
        return exc
    return None


def _reads(store: EventStore) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "list_runs": lambda: store.list_runs(limit=100),
        "get_runs": lambda: store.get_runs(["a", "b"]),
        "list_hooks": lambda: store.list_hooks(now=T0, limit=100),
        "find_hook": lambda: store.find_hook("secret-b", now=T0),
        "due_wakeups": lambda: store.due_wakeups(LATER, limit=100),
        "next_wakeup": lambda: store.next_wakeup(),
    }


@pytest.mark.parametrize("damage", [*DAMAGE, *SQLITE_DAMAGE])
async def test_a_row_that_does_not_decode_is_corrupt_index_and_verify_rebuilds_it(
    backend: Backend, damage: str
) -> None:
    if damage in SQLITE_DAMAGE and backend.name != "sqlite":
        pytest.skip("PostgreSQL's column types refuse it")
    sql, run_id = {**DAMAGE, **SQLITE_DAMAGE}[damage]
    async with await backend.open() as store:
        await seed(store)
        expected = await kernel_rows(store, "b")
        before = {name: await read() for name, read in _reads(store).items()}
    backend.tamper(sql.replace("%s", "?") if backend.name == "sqlite" else sql, (run_id,))

    async with await backend.open() as store:
        raised = {name: await _raised(read) for name, read in _reads(store).items()}
        failed = {name: exc for name, exc in raised.items() if exc is not None}
        assert failed or damage == "due_at text", f"no read met the damaged row ({damage})"
        for name, exc in failed.items():
            assert isinstance(exc, StoreError) and exc.run_id == "b", (name, exc)
            assert "secret" not in str(exc), name
        # Run "a" and the events of both are untouched.
        assert [s.run_id if s else None for s in await store.get_runs(["a"])] == ["a"]
        assert len(await store.read("b")) == 4

    if "list_runs" in failed:  # the command line says it in one line, with what repairs it
        message = one_line_error(runfold_cli("--store", backend.url, "runs"), 5)
        assert "run 'b': stored index rows are corrupt" in message, message
        assert "--rebuild-index" in message
    found = runfold_cli("--store", backend.url, "verify")
    assert found.returncode == 1 and "b  index: " in found.stdout, found.stdout
    ok(runfold_cli("--store", backend.url, "verify", "--rebuild-index"))
    ok(runfold_cli("--store", backend.url, "verify"))

    async with await backend.open() as store:
        after = {name: await read() for name, read in _reads(store).items()}
        assert after == before
        assert (await store.get_runs(["b"]))[0] == expected


async def test_verify_without_rebuild_stops_at_corrupt_rows_and_says_so(
    backend: Backend,
) -> None:
    async with await backend.open() as store:
        await seed(store)
    sql, run_id = DAMAGE["attributes not JSON"]
    backend.tamper(sql.replace("%s", "?") if backend.name == "sqlite" else sql, (run_id,))
    async with await backend.open() as store:
        report = await verify_store(store, now=T0)
        assert not report.ok
        [problem] = report.problems
        assert (problem.run_id, problem.kind, problem.repaired) == ("b", "index", False)
        assert "rewrites the rows from the events" in problem.detail
        repaired = await verify_store(store, now=T0, rebuild=True)
        assert [(p.run_id, p.repaired) for p in repaired.problems] == [("b", True)]
        assert (await verify_store(store, now=T0)).ok


# --- SQLite: the types a column may hold -------------------------------------------------------


_RUN_ROW = (
    "INSERT INTO runs VALUES ('x', 'wf', 'running', NULL, {created}, 1, NULL, 1, {attributes}, "
    "{owner}, NULL, 0, NULL)"
)
WRONG_TYPES = [
    (_RUN_ROW.format(created="'now'", attributes="'{}'", owner="NULL"), "runs"),
    (_RUN_ROW.format(created="1", attributes="'not json'", owner="NULL"), "runs"),
    (_RUN_ROW.format(created="1", attributes="'[]'", owner="NULL"), "runs"),
    (_RUN_ROW.format(created="1", attributes="'{}'", owner="x'00'"), "runs"),
    ("UPDATE runs SET last_sequence = 2.5", "runs"),
    ("UPDATE runs SET owner_id = x'01'", "runs"),
    ("UPDATE runs SET queue_name = x'03'", "runs"),
    ("UPDATE runs SET priority = 'first'", "runs"),
    ("UPDATE runs SET dedup_id = x'02'", "runs"),
    ("UPDATE wakeups SET due_at = 'soon'", "wakeups"),
    ("UPDATE hooks SET retained_until = 0.5", "hooks"),
    ("UPDATE hooks SET token = x'00' WHERE run_id = 'a'", "hooks"),
]


@pytest.mark.parametrize(("sql", "table"), WRONG_TYPES, ids=[w[0][:40] for w in WRONG_TYPES])
async def test_sqlite_refuses_a_value_of_the_wrong_type(
    tmp_path: Path, sql: str, table: str
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await seed(store)
    with pytest.raises(sqlite3.IntegrityError, match=f"wrong type in {table}"):
        plain_execute(path, sql)
    tampered(path, sql)  # past the triggers, as a file from before them holds it


async def test_a_file_from_before_the_types_is_migrated_and_its_bad_rows_repaired(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runfold.db"
    async with await SQLiteStore.open(path) as store:
        await seed(store)
        expected = await kernel_rows(store, "b")
    as_older_file(path, 2)  # the file runfold wrote before the type triggers
    plain_execute(path, "UPDATE wakeups SET due_at = 'soon' WHERE run_id = 'b'")  # it took that
    plain_execute(path, "UPDATE runs SET attributes = 'oops' WHERE run_id = 'b'")
    plain_execute(path, "UPDATE events SET recorded_at = 1.5 WHERE run_id = 'a' AND sequence = 4")

    async with await SQLiteStore.open(path) as store:
        assert store.migrated_from == 2
        with pytest.raises(CorruptIndex, match="run 'b'"):
            await store.list_runs()
        with pytest.raises(CorruptEvent) as caught:
            await store.read("a")
        assert (caught.value.run_id, caught.value.sequence) == ("a", 4)
        report = await verify_store(store, now=T0, rebuild=True)
        assert [(p.run_id, p.kind, p.repaired) for p in report.problems] == [
            ("b", "index", True),
            ("a", "history", False),
        ]
        assert (await store.get_runs(["b"]))[0] == expected
        assert [w.run_id for w in await store.due_wakeups(LATER)] == ["a", "b"]
    assert plain_query(path, "SELECT max(version) FROM runfold_schema") == [(SCHEMA_VERSION,)]
    triggers = plain_query(path, "SELECT count(*) FROM sqlite_master WHERE type = 'trigger'")
    assert triggers == [(6,)]  # an insert and an update trigger per index table
    with pytest.raises(sqlite3.IntegrityError, match="wrong type in wakeups"):
        plain_execute(path, "UPDATE wakeups SET due_at = 'soon' WHERE run_id = 'b'")
