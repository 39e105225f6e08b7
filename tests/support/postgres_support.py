"""The PostgreSQL server the tests use, and schemas of their own on it.

`RUNFOLD_TEST_POSTGRES_DSN` names the server; without it, the local one on 127.0.0.1:5432
(`scripts/ensure-postgres.sh` starts it). A server that cannot be reached skips the PostgreSQL
tests with the reason, except under `CI=true`, where it fails them.

The generic suite (`tests/conftest.py`, backend `postgres`) shares one migrated schema per test
session and empties it before each test; `tests/stores/test_postgres_store.py` makes schemas of its
own. Every schema made here is dropped when the session ends.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from runfold.stores.postgres import PostgresStore

DSN = os.environ.get("RUNFOLD_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SESSION = f"runfold_test_{uuid.uuid4().hex[:10]}"
"""The prefix of every schema this test session makes."""
SUITE_SCHEMA = f"{SESSION}_suite"
"""The schema the generic suite shares."""

CITUS = os.environ.get("RUNFOLD_TEST_CITUS") == "1"
"""Whether `DSN` is a Citus coordinator whose suite schema is distributed (`make test-citus`)."""
_SUITE_DSN = make_conninfo(DSN, options="-c synchronous_commit=off")
_TABLES = (
    "events",
    "runs",
    "hooks",
    "tokens",
    "wakeups",
    "leases",
    "due_holds",
    "queue_starts",
    "queue_dedups",
)
_admin: psycopg.Connection[tuple[Any, ...]] | None = None


def admin() -> psycopg.Connection[tuple[Any, ...]]:
    """A plain autocommit connection for setting up and inspecting; skips or fails (under
    `CI=true`) the test when the server cannot be reached."""
    global _admin
    if _admin is None or _admin.closed:
        try:
            _admin = psycopg.connect(DSN, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            reason = f"no PostgreSQL server at {DSN}: {exc}".strip()
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
    return _admin


def schema_name(label: str) -> str:
    """A fresh schema name for this session (dropped at its end by `drop_session_schemas`)."""
    return f"{SESSION}_{label}_{uuid.uuid4().hex[:6]}"


def postgres_url(label: str) -> Iterator[str]:
    """A store URL on a fresh schema named after `label`, dropped afterwards: for a fixture to
    `yield from`. Skips (fails under `CI=true`) without a server."""
    admin()
    name = schema_name(label)
    yield f"{DSN}?schema={name}"
    admin().execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


async def suite_store() -> PostgresStore:
    """A store on the suite schema, emptied (the first call migrates it). Its commits do not
    wait for the disk (`synchronous_commit=off`): nothing here survives a server crash anyway,
    and hundreds of tests append."""
    admin()
    store = await PostgresStore.open(_SUITE_DSN, schema=SUITE_SCHEMA, pool_max=4, distributed=CITUS)
    admin().execute("; ".join(f'DELETE FROM "{SUITE_SCHEMA}".{table}' for table in _TABLES))
    return store


def drop_session_schemas() -> None:
    """Drop every schema this session made (if it ever reached the server)."""
    try:
        conn = (
            _admin
            if _admin is not None and not _admin.closed
            else psycopg.connect(DSN, autocommit=True, connect_timeout=5)
        )
    except psycopg.OperationalError:
        return  # no server, so nothing was made
    with conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (SESSION,)
        ).fetchall()
        for (name,) in rows:
            quoted = name.replace('"', '""')
            conn.execute(f'DROP SCHEMA "{quoted}" CASCADE')
