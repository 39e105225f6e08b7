"""Pages per append: what one append of the engine's 10-step workflow writes to the disk.

- SQLite: the frames the appends add to the write-ahead log (one per page a commit dirties),
  read from the log itself after `WORKFLOWS` workflows (too few for an automatic checkpoint
  to restart it), per commit, and the log's bytes per commit.
- PostgreSQL: the write-ahead log the appends' transactions write (`pg_walinspect`, the
  records touching the store's schema and their commits, so other databases' writers on the
  server do not count), in bytes and in distinct pages (blocks) per append. The extension is
  created in the store's schema, dropped with it, unless the database has it already.

Each count is also split by the table or index the pages belong to (SQLite's `dbstat`, where
the library has it; PostgreSQL's relation file nodes), so that a change to what an append writes
shows where it saved: the run's row (`runs` and its indexes) apart from the events.
"""

from __future__ import annotations

import re
import sqlite3
import struct
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from benchmarks.harness import Measurement, Remark, Result, event_loop, opened
from benchmarks.postgres import POSTGRES, dsn, fresh_schema
from benchmarks.workflows import SequentialWorkflow
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS
from runfold import CommandHandler
from runfold.engine import Engine
from runfold.stores import PostgresStore, SQLiteStore
from runfold.stores.postgres.schema import quote

__all__ = ["WalPerAppend", "bench_pages", "postgres_wal_per_append", "sqlite_wal_per_append"]

GROUP = "Pages per append"
WORKFLOWS = 10
"""Workflows measured (after one warm-up workflow)."""
_WAL_HEADER = 32
_FRAME_HEADER = 24
_BLOCK = re.compile(r"rel (\d+)/(\d+)/(\d+)(?: fork \w+)? blk (\d+)")
RUNS = "runs"
"""The table of the run's index row: it and the indexes named after it (`runs_…`) are the
row's pages."""
SHOWN = 6
"""Tables and indexes the remark names, most pages first."""


class WalPerAppend(NamedTuple):
    """What an append writes to the log: pages (SQLite: frames; PostgreSQL: distinct blocks),
    bytes, and pages by the table or index they belong to (empty where not known)."""

    pages: float
    wal_bytes: float
    by_table: dict[str, float]


def runs_pages(by_table: dict[str, float]) -> float:
    """The pages per append of the run's index row: `runs` and its indexes."""
    return sum(n for name, n in by_table.items() if name == RUNS or name.startswith(RUNS + "_"))


def _run(engine: Engine, workflows: int) -> None:
    with event_loop() as loop:
        for _ in range(workflows):
            run = loop.run_until_complete(engine.start("sequential", b"i" * PAYLOAD_BYTES))
            assert run.status == "completed"


def _wal_frames(wal: Path) -> tuple[list[int], int, bytes]:
    """The page numbers of the valid frames of a SQLite write-ahead log, its commits, and its
    salt (which a checkpoint that restarts the log changes)."""
    data = wal.read_bytes()
    page_size = struct.unpack(">I", data[8:12])[0]
    salt = data[16:24]
    pages: list[int] = []
    commits = 0
    at = _WAL_HEADER
    while at + _FRAME_HEADER + page_size <= len(data):
        header = data[at : at + _FRAME_HEADER]
        if header[8:16] != salt:
            break
        pages.append(struct.unpack(">I", header[0:4])[0])
        commits += struct.unpack(">I", header[4:8])[0] != 0
        at += _FRAME_HEADER + page_size
    return pages, commits, salt


def _page_owners(path: Path) -> dict[int, str]:
    """The table or index each page of a SQLite file belongs to (`dbstat`); empty if this
    SQLite was built without it. Page 1 holds the schema and the file's header."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT pageno, name FROM dbstat").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()
    return {int(page): str(name) for page, name in rows}


def sqlite_wal_per_append(workflows: int = WORKFLOWS) -> tuple[WalPerAppend, int]:
    """Frames (pages) and log bytes per append, and the page size, on a fresh SQLite file."""
    with tempfile.TemporaryDirectory(prefix="runfold-pages-") as folder, event_loop() as loop:
        path = Path(folder) / "pages.db"
        with opened(loop, SQLiteStore.open(path, synchronous="FULL")) as store:
            engine = Engine(CommandHandler(store), SequentialWorkflow())
            run = loop.run_until_complete(engine.start("sequential", b"warm-up"))
            assert run.status == "completed"
            wal = path.with_name(path.name + "-wal")
            before, commits_before, salt = _wal_frames(wal)
            for _ in range(workflows):
                run = loop.run_until_complete(engine.start("sequential", b"i" * PAYLOAD_BYTES))
                assert run.status == "completed"
            after, commits_after, salt_after = _wal_frames(wal)
            page_size = struct.unpack(">I", wal.read_bytes()[8:12])[0]
        owners = _page_owners(path)  # closed: its log checkpointed, pages where they stay
    written, commits = after[len(before) :], commits_after - commits_before
    assert salt == salt_after and commits > 0, "the log restarted: measure fewer workflows"
    frames = len(written)
    tables = Counter(owners.get(page, "(a page freed since)") for page in written)
    by_table = {name: n / commits for name, n in tables.items()} if owners else {}
    wal_bytes = frames * (_FRAME_HEADER + page_size) / commits
    return WalPerAppend(frames / commits, wal_bytes, by_table), page_size


def _walinspect(admin: psycopg.Connection[Any], schema: str) -> str:
    """The schema of `pg_walinspect` in the database: created in `schema` (so it goes with it)
    unless the database has it already."""
    found = admin.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'pg_walinspect'"
    ).fetchone()
    if found is not None:
        return quote(str(found[0]))
    admin.execute(f"CREATE EXTENSION pg_walinspect SCHEMA {quote(schema)}")
    return quote(schema)


def postgres_wal_per_append(workflows: int = WORKFLOWS) -> WalPerAppend:
    """Distinct pages and WAL bytes per append of the store's transactions on PostgreSQL."""
    with (
        psycopg.connect(dsn(), autocommit=True) as admin,
        fresh_schema() as schema,
        event_loop() as loop,
    ):
        inspect = _walinspect(admin, schema)
        opening = PostgresStore.open(dsn(), schema=schema, pool_min=1, pool_max=1)
        with opened(loop, opening) as store:
            engine = Engine(CommandHandler(store), SequentialWorkflow())
            run = loop.run_until_complete(engine.start("sequential", b"warm-up"))
            assert run.status == "completed"
            nodes = {
                str(row[0]): str(row[1])
                for row in admin.execute(
                    "SELECT pg_relation_filenode(c.oid), c.relname FROM pg_class c "
                    "JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = %s "
                    "AND pg_relation_filenode(c.oid) IS NOT NULL",
                    (schema,),
                )
            }
            start = admin.execute("SELECT pg_current_wal_lsn()").fetchone()
            for _ in range(workflows):
                run = loop.run_until_complete(engine.start("sequential", b"i" * PAYLOAD_BYTES))
                assert run.status == "completed"
            end = admin.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert start is not None and end is not None
        records = admin.execute(
            "SELECT xid, resource_manager, record_type, record_length, block_ref "
            f"FROM {inspect}.pg_get_wal_records_info(%s, %s)",
            (start[0], end[0]),
        ).fetchall()
    ours: dict[int, int] = defaultdict(int)
    pages: dict[int, set[tuple[str, str]]] = defaultdict(set)
    for xid, _, _, length, blocks in records:
        touched = [m for m in _BLOCK.findall(blocks or "") if m[2] in nodes]
        if touched:
            ours[xid] += length
            pages[xid].update((m[2], m[3]) for m in touched)
    commits = {
        xid: length
        for xid, manager, kind, length, _ in records
        if manager == "Transaction" and kind.startswith("COMMIT") and xid in ours
    }
    appends = len(commits)
    assert appends, "no append of the store's schema in the log"
    wal = sum(ours[x] for x in commits) + sum(commits.values())
    tables = Counter(nodes[node] for x in commits for node, _ in pages[x])
    by_table = {name: n / appends for name, n in tables.items()}
    return WalPerAppend(sum(len(pages[x]) for x in commits) / appends, wal / appends, by_table)


def _row(what: str, on: str, unit: str, value: float) -> Result:
    return Result(
        group=GROUP,
        case=f"Engine, {WORKFLOW_STEPS}-step workflow: {what} per append",
        on=on,
        unit=unit,
        value=Measurement.of([value]),
        lower_is_better=True,
        note="counted once: the count does not depend on the load",
    )


def _split(backend: str, found: WalPerAppend) -> list[Result | Remark]:
    """A remark naming where `found`'s pages go, most first."""
    if not found.by_table:
        return [Remark(group=GROUP, text=f"{backend}: pages not split by table (no `dbstat`).")]
    ranked = sorted(found.by_table.items(), key=lambda item: (-item[1], item[0]))
    named = ", ".join(f"{name} {n:.2f}" for name, n in ranked[:SHOWN])
    return [
        Remark(group=GROUP, text=f"{backend}: pages per append by table or index: {named}."),
    ]


def bench_pages(quick: bool) -> list[Result | Remark]:
    workflows = 3 if quick else WORKFLOWS
    found: list[Result | Remark] = []
    sqlite, page_size = sqlite_wal_per_append(workflows)
    on = f"SQLite, WAL, synchronous=FULL, {page_size}-byte pages"
    found += [
        _row("pages (WAL frames)", on, "pages", sqlite.pages),
        _row("WAL bytes", on, "B", sqlite.wal_bytes),
    ]
    if sqlite.by_table:
        found.append(
            _row(
                "pages of the run's row (runs, its indexes)",
                on,
                "pages",
                runs_pages(sqlite.by_table),
            )
        )
    remarks = _split("SQLite", sqlite)
    if POSTGRES.version() is None:
        found.append(Remark(group=GROUP, text="PostgreSQL: no server, not measured."))
        return found + remarks
    try:
        postgres = postgres_wal_per_append(workflows)
    except psycopg.Error as exc:  # pg_walinspect missing, or not ours to create (superuser)
        why = f"pg_walinspect not usable ({type(exc).__name__})"
        found.append(Remark(group=GROUP, text=f"PostgreSQL: {why}, not measured."))
        return found + remarks
    on = f"PostgreSQL {POSTGRES.version()}, synchronous_commit=on"
    found += [
        _row("WAL bytes", on, "B", postgres.wal_bytes),
        _row("pages (WAL block references)", on, "pages", postgres.pages),
        _row(
            "pages of the run's row (runs, its indexes)", on, "pages", runs_pages(postgres.by_table)
        ),
    ]
    found.append(
        Remark(
            group=GROUP,
            text="SQLite's count is the frames the appends add to the write-ahead log (a page "
            "each); PostgreSQL's the log records of the appends' transactions on the store's "
            "tables and indexes (full-page images after a checkpoint included, so it varies "
            "with the server's checkpoints) and the distinct pages they name. An append writes "
            "its events into the events table and two of its indexes (position, correlation). "
            "On SQLite and on PostgreSQL it writes the run's row only when the run's status, end "
            "time, owner or attributes change (the head is the events' own; on PostgreSQL the "
            "events' primary key is the run's lock): in this workflow, at its creation and at "
            "its end.",
        )
    )
    return found + remarks + _split("PostgreSQL", postgres)


if __name__ == "__main__":
    for result in bench_pages(quick=False):
        print(result)
