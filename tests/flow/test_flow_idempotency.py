"""A step's idempotency key survives a SIGKILL between its side effect and its outcome.

A real child process (`tests/support/flow_key_worker.py`) runs a payment step that writes its key to
a ledger file and is SIGKILLed before the step's outcome is recorded; a fresh process recovers
the run, the step runs again as attempt 2, and presents the same key: the payment API would
charge once.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from runfold.stores import PostgresStore, SQLiteStore
from runfold.stores.protocol import EventStore
from tests.support.child_workers import spawn_worker
from tests.support.postgres_support import DSN, admin, schema_name

pytestmark = pytest.mark.slow


async def check(args: dict[str, Any], store: EventStore) -> None:
    first = spawn_worker("flow_key_worker", {**args, "generation": 0})
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "charged"
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    step = (await store.read("pay"))[-1].event
    assert step.event_type == "step_started"  # the outcome never made it

    second = spawn_worker("flow_key_worker", {**args, "generation": 1})
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == ["completed", "charged 42"]
    lines = Path(args["ledger"]).read_text().splitlines()
    assert lines == ["pay/1 1 42", "pay/1 2 42"]  # one key, two attempts


async def test_a_sigkilled_step_presents_the_same_key_on_sqlite(tmp_path: Path) -> None:
    args = {"backend": "sqlite", "path": str(tmp_path / "pay.db"), "ledger": str(tmp_path / "l")}
    async with await SQLiteStore.open(args["path"]) as store:
        await check(args, store)


@pytest.mark.postgres
async def test_a_sigkilled_step_presents_the_same_key_on_postgres(tmp_path: Path) -> None:
    admin()  # skips (or fails under CI) without a server
    schema = schema_name("flowkey")
    args = {"backend": "postgres", "dsn": DSN, "schema": schema, "ledger": str(tmp_path / "l")}
    store = await PostgresStore.open(DSN, schema=schema, pool_max=2)
    try:
        await check(args, store)
    finally:
        await store.close()
