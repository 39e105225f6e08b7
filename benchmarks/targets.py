"""The goals the issues set, each a bound on one ratio; the page's summary has one row per goal,
in this order, and lists every row that misses one under "Below target"."""

from __future__ import annotations

from benchmarks.harness import Target

__all__ = [
    "ALL_TARGETS",
    "CLI_START_UP",
    "CLI_START_UP_MS",
    "COMMAND_COST_FLAT",
    "DECODE_FOLD_VS_EVENTSOURCING",
    "ENGINE_APPENDS_PER_WORKFLOW",
    "ENGINE_CONCURRENT_VS_DBOS",
    "ENGINE_INSTRUCTIONS_PER_STEP",
    "ENGINE_INSTRUCTIONS_PER_STEP_BEFORE",
    "ENGINE_SEQUENTIAL_VS_CEILING",
    "ENGINE_SEQUENTIAL_VS_DBOS",
    "ENGINE_STORE_CALLS_PER_WORKFLOW",
    "FLEET_CPU_2_VS_1",
    "FLEET_IO_4_VS_1",
    "FLEET_VS_DBOS",
    "FLOW_CONCURRENT_VS_DBOS",
    "FLOW_SEQUENTIAL_VS_DBOS",
    "FOLD_RATE",
    "FOLD_RATE_EVENTS_PER_SECOND",
    "INSPECTOR_FIRST_SCREEN",
    "INSPECTOR_FIRST_SCREEN_MS",
    "INSPECTOR_P99",
    "INSPECTOR_P99_MS",
    "INSPECTOR_PAGE_BYTES",
    "INSPECTOR_PAGE_LIMIT",
    "POSTGRES_8_WRITERS_VS_RAW",
    "POSTGRES_APPEND_VS_EVENTSOURCING",
    "POSTGRES_APPEND_VS_RAW",
    "SCALE_FLAT",
    "SNAPSHOT_BYTES_PER_EVENT_BEFORE",
    "SNAPSHOT_MEMORY",
    "SQLITE_64_TASKS_VS_ONE",
    "SQLITE_APPEND_VS_EVENTSOURCING",
    "SQLITE_APPEND_VS_ONE_HOP",
    "SQLITE_REPLAY_VS_EVENTSOURCING",
]

FOLD_RATE_EVENTS_PER_SECOND = 1_000_000
FOLD_RATE = Target(goal="fold ≥ 1,000,000 events/s (project_run)", bound=1.0)
DECODE_FOLD_VS_EVENTSOURCING = Target(
    goal="decode + fold ≥ 10× eventsourcing replay (POPO recorder)", bound=10.0
)
SNAPSHOT_BYTES_PER_EVENT_BEFORE = 175.35
"""Bytes per event held by the snapshot of the memory benchmark's 10,000-event run before
schema version 2 (1,753,415 bytes, tracemalloc, CPython 3.11, main at 232b04d)."""
SNAPSHOT_MEMORY = Target(
    goal="snapshot memory per event ≤ 1× what it was before schema version 2",
    bound=1.0,
    at_most=True,
)
SQLITE_APPEND_VS_ONE_HOP = Target(
    goal="SQLite sequential append ≥ 0.9× the asyncio one-hop ceiling (raw sqlite3's "
    "transaction as one call on the driver's thread, synchronous=FULL)",
    bound=0.9,
)
SQLITE_APPEND_VS_EVENTSOURCING = Target(
    goal="SQLite sequential append ≥ 1× eventsourcing SQLite recorder", bound=1.0
)
SQLITE_64_TASKS_VS_ONE = Target(
    goal="SQLite 64 tasks on distinct runs ≥ 3× one sequential writer", bound=3.0
)
SQLITE_REPLAY_VS_EVENTSOURCING = Target(
    goal="SQLite read + fold of 25,000 events ≥ 8× eventsourcing SQLite replay", bound=8.0
)
POSTGRES_APPEND_VS_EVENTSOURCING = Target(
    goal="Postgres sequential append ≥ 1× eventsourcing PostgreSQL recorder", bound=1.0
)
POSTGRES_APPEND_VS_RAW = Target(goal="Postgres sequential append ≥ 0.8× raw psycopg", bound=0.8)
POSTGRES_8_WRITERS_VS_RAW = Target(
    goal="Postgres 8 writers on distinct runs ≥ 0.8× raw psycopg with 8 connections", bound=0.8
)
SCALE_FLAT = Target(
    goal="retention, run listings and due wakeups at 100,000 runs ≥ 0.5× their rate at 1,000 "
    "(SQLite and PostgreSQL)",
    bound=0.5,
)
COMMAND_COST_FLAT = Target(
    goal="command cost independent of history length: execute on a 20,000-event run "
    "≥ 0.8× the rate on a 10-event run (every store)",
    bound=0.8,
)

ENGINE_SEQUENTIAL_VS_DBOS = Target(
    goal="Engine, 10-step workflow one at a time ≥ 3× DBOS Transact (SQLite and PostgreSQL)",
    bound=3.0,
)
ENGINE_CONCURRENT_VS_DBOS = Target(
    goal="Engine, 64 10-step workflows at once ≥ 20× DBOS Transact (SQLite and PostgreSQL)",
    bound=20.0,
)
ENGINE_SEQUENTIAL_VS_CEILING = Target(
    goal="Engine, 10-step workflow one at a time ≥ 0.6× the raw-commit ceiling (the raw "
    "driver's single-row commits/s ÷ the engine's appends per workflow; SQLite and PostgreSQL)",
    bound=0.6,
)
ENGINE_INSTRUCTIONS_PER_STEP_BEFORE = 858_490
"""Instructions per step of the engine on MemoryStore before issue 36 (callgrind,
`python -m benchmarks.instructions`, CPython 3.11, main at fb915d7)."""
ENGINE_INSTRUCTIONS_PER_STEP = Target(
    goal="Engine on MemoryStore: instructions per step ≤ 0.5× what they were before issue 36",
    bound=0.5,
    at_most=True,
)
ENGINE_APPENDS_PER_WORKFLOW = Target(
    goal="Engine, appends per 10-step workflow ≤ 11 (as a ratio to 11)", bound=1.0, at_most=True
)
ENGINE_STORE_CALLS_PER_WORKFLOW = Target(
    goal="Engine, store calls per 10-step workflow ≤ 13 (as a ratio to 13)",
    bound=1.0,
    at_most=True,
)
FLOW_SEQUENTIAL_VS_DBOS = Target(
    goal="runfold.flow, 10-step workflow one at a time ≥ 3× DBOS Transact (SQLite and PostgreSQL)",
    bound=3.0,
)
FLOW_CONCURRENT_VS_DBOS = Target(
    goal="runfold.flow, 64 10-step workflows at once ≥ 10× DBOS Transact (SQLite and PostgreSQL)",
    bound=10.0,
)
FLEET_CPU_2_VS_1 = Target(
    goal="fleet on PostgreSQL, 10-step workflow of 2 ms CPU steps: 2 `runfold worker` processes "
    "≥ 1.8× one (2 cores)",
    bound=1.8,
)
FLEET_IO_4_VS_1 = Target(
    goal="fleet on PostgreSQL, 10-step workflow of 20 ms I/O steps: 4 `runfold worker` "
    "processes ≥ 3.6× one",
    bound=3.6,
)
FLEET_VS_DBOS = Target(
    goal="fleet on PostgreSQL: runfold workers ≥ 3× DBOS Transact queue workers with the same "
    "processes and per-worker concurrency (1, 2 and 4 processes, CPU and I/O steps)",
    bound=3.0,
)
INSPECTOR_FIRST_SCREEN_MS = 200
INSPECTOR_FIRST_SCREEN = Target(
    goal="inspector: first screen of a 100,000-event run's page ≤ 200 ms", bound=1.0, at_most=True
)
INSPECTOR_PAGE_LIMIT = 1_000_000
INSPECTOR_PAGE_BYTES = Target(
    goal="inspector: each part of a 100,000-event run's page ≤ 1 MB", bound=1.0, at_most=True
)
INSPECTOR_P99_MS = 1000
INSPECTOR_P99 = Target(
    goal="inspector: p99 ≤ 1 s under 200 concurrent clients for 30 s while writers append",
    bound=1.0,
    at_most=True,
)
CLI_START_UP_MS = 300
CLI_START_UP = Target(
    goal="command line: `runfold --help` and `runfold runs` start in ≤ 300 ms",
    bound=1.0,
    at_most=True,
)

ALL_TARGETS = (
    FOLD_RATE,
    DECODE_FOLD_VS_EVENTSOURCING,
    SNAPSHOT_MEMORY,
    SQLITE_APPEND_VS_ONE_HOP,
    SQLITE_APPEND_VS_EVENTSOURCING,
    SQLITE_64_TASKS_VS_ONE,
    SQLITE_REPLAY_VS_EVENTSOURCING,
    POSTGRES_APPEND_VS_EVENTSOURCING,
    POSTGRES_APPEND_VS_RAW,
    POSTGRES_8_WRITERS_VS_RAW,
    SCALE_FLAT,
    COMMAND_COST_FLAT,
    ENGINE_SEQUENTIAL_VS_DBOS,
    ENGINE_CONCURRENT_VS_DBOS,
    ENGINE_SEQUENTIAL_VS_CEILING,
    ENGINE_INSTRUCTIONS_PER_STEP,
    ENGINE_APPENDS_PER_WORKFLOW,
    ENGINE_STORE_CALLS_PER_WORKFLOW,
    FLOW_SEQUENTIAL_VS_DBOS,
    FLOW_CONCURRENT_VS_DBOS,
    FLEET_CPU_2_VS_1,
    FLEET_IO_4_VS_1,
    FLEET_VS_DBOS,
    INSPECTOR_FIRST_SCREEN,
    INSPECTOR_PAGE_BYTES,
    INSPECTOR_P99,
    CLI_START_UP,
)
