"""Order workflows SIGKILLed at random moments finish, in a fresh process, as if never killed.

Real child processes (`tests/support/flow_worker.py`) drive the runs on a real SQLite file and a
real PostgreSQL schema; the parent kills each after a random number of finished runs and a random
while more (seeded, so a failure names what it drew), then one more child recovers everything
and reports the outputs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runfold import MemoryStore
from runfold.flow import Flow
from runfold.stores import PostgresStore, SQLiteStore
from runfold.stores.protocol import EventStore
from runfold.testing import RoundClock, run_to_end, shape
from tests.support.child_workers import spawn_worker
from tests.support.flow_worker import approvals, order_input
from tests.support.flow_workflows import order
from tests.support.postgres_support import DSN, admin, schema_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUNS = 40
KILLS = 4


async def clean_outcomes() -> dict[str, tuple[list[Any], tuple[object, ...]]]:
    """Every run's [status, output] and recorded shape when nothing is killed."""
    clock = RoundClock()
    flow = Flow(MemoryStore(), [order], clock=clock)
    found = {}
    for i in range(RUNS):
        run = await run_to_end(
            flow, order, order_input(i), run_id=f"order-{i}", events=approvals(RUNS), clock=clock
        )
        found[run.run_id] = ([run.status, run.output], shape(run.snapshot))
    return found


def kill_at_random(args: dict[str, Any], seed: int) -> list[tuple[int, float]]:
    """Start and SIGKILL `KILLS` children in turn, each after it finished a random number of
    runs and a random while more (so the kill lands inside a run); what was drawn."""
    rng = random.Random(seed)
    drawn = []
    for generation in range(KILLS):
        child = spawn_worker("flow_worker", {**args, "generation": generation})
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            finished, delay = rng.randint(0, RUNS // (2 * KILLS)), rng.uniform(0.0, 0.02)
            drawn.append((finished, round(delay, 3)))
            for _ in range(finished):
                assert child.stdout.readline().startswith("done ")
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.communicate(timeout=30)
    return drawn


def finish(args: dict[str, Any]) -> dict[str, list[Any]]:
    child = spawn_worker("flow_worker", {**args, "generation": KILLS, "report": True})
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[0] == "ready"
    reported: dict[str, list[Any]] = json.loads(lines[-1])
    return reported


async def check(args: dict[str, Any], store: EventStore, seed: int) -> None:
    expected = await clean_outcomes()
    delays = kill_at_random(args, seed)
    # The kills landed mid-way: runs were left unstarted or live for the last process.
    ended = [
        s
        for s in (await store.list_runs(limit=100)).items
        if s.status not in ("pending", "running")
    ]
    assert len(ended) < RUNS, delays
    print(f"after {KILLS} kills ({delays}): {len(ended)} of {RUNS} runs ended")
    reported = finish(args)
    assert reported == {run_id: outcome for run_id, (outcome, _) in expected.items()}, delays
    for run_id, (_, recorded) in expected.items():
        snapshot = await Flow(store, [order]).result(run_id)
        assert shape(snapshot.snapshot) == recorded, (run_id, delays)


@pytest.mark.parametrize("seed", [1, 2])
async def test_sigkilled_orders_finish_on_sqlite(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "orders.db"
    args = {"backend": "sqlite", "path": str(path), "runs": RUNS}
    async with await SQLiteStore.open(path) as store:
        await check(args, store, seed)


@pytest.mark.postgres
async def test_sigkilled_orders_finish_on_postgres() -> None:
    admin()  # skips (or fails under CI) without a server
    schema = schema_name("flowkill")
    args = {"backend": "postgres", "dsn": DSN, "schema": schema, "runs": RUNS}
    store = await PostgresStore.open(DSN, schema=schema, pool_max=2)
    try:
        await check(args, store, seed=3)
    finally:
        await store.close()


def test_the_worker_is_importable_without_pytest() -> None:
    # A child starts quickly only if the worker pulls in no test machinery.
    source = (ROOT / "tests" / "support" / "flow_worker.py").read_text()
    assert "pytest" not in source.split('"""', 2)[2]
    assert os.path.exists(ROOT / "tests" / "support" / "flow_workflows.py")
