"""`CommandHandler` and `Flow` riding through store faults, on PostgreSQL behind a fault proxy.

The proxy (`tests/support/fault_proxy.py`) cuts connections before, during and after appends, or
stops relaying (a black hole). What must hold: no run fails that no body failed, no step attempt is
spent on a store fault, no body runs twice, nothing is recorded twice, and a command retried
after its append was lost returns the outcome it had (a lazy `StartStep` still says it created
the step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from runfold import CommandHandler
from runfold.commands import CreateRun, LazyStep, RecordLog, StartRun, StartStep
from runfold.errors import CommitUnknown, StoreUnavailable
from runfold.events import Envelope, LogRecorded
from runfold.flow import Flow, step, workflow
from runfold.store_retry import StoreFault, StoreRetry
from runfold.stores import PostgresStore
from runfold.testing import DelegatingStore
from tests.support.fault_proxy import FaultProxy, random_plan
from tests.support.postgres_support import DSN, admin, schema_name

BODY_RUNS: Counter[tuple[str, int]] = Counter()
"""How often each step body ran: (input key, step number)."""
STEPS = 10


def work(key: str, n: int) -> int:
    BODY_RUNS[(key, n)] += 1
    return n


@workflow(name="test-faults-ten-steps")
async def ten_steps(key: str) -> int:
    total = 0
    for n in range(STEPS):
        total += await step(work, key, n)
    return total


@pytest.fixture
def schema() -> Iterator[str]:
    admin()
    name = schema_name("hfaults")
    yield name
    admin().execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@contextlib.asynccontextmanager
async def proxied(schema: str, **options: Any) -> AsyncIterator[tuple[PostgresStore, FaultProxy]]:
    """A store on `schema` whose connections go through a fault proxy (migrated directly)."""
    await (await PostgresStore.open(DSN, schema=schema)).close()
    params = conninfo_to_dict(DSN)
    upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    async with FaultProxy(upstream) as proxy:
        store = await PostgresStore.open(proxy.dsn(DSN), schema=schema, **options)
        try:
            yield store, proxy
        finally:
            proxy.heal()
            await store.close()


def stored_types(schema: str, run_id: str) -> list[str]:
    rows = (
        admin()
        .execute(
            f'SELECT type FROM "{schema}".events WHERE run_id = %s ORDER BY sequence', (run_id,)
        )
        .fetchall()
    )
    return [row[0] for row in rows]


async def heal_after(proxy: FaultProxy, seconds: float) -> None:
    await asyncio.sleep(seconds)
    proxy.heal()


async def test_a_lazy_start_whose_append_was_lost_still_tells_the_caller_it_created_the_step(
    schema: str,
) -> None:
    # The reply is lost and the server then goes silent, so the store cannot settle the append
    # (CommitUnknown); once it answers again the handler reads the run back and finds its own.
    async with proxied(schema, call_timeout=0.3) as (store, proxy):
        faults: list[StoreFault] = []
        handler = CommandHandler(store, store_retry=StoreRetry(on_retry=faults.append))
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        proxy.plan = lambda: "after"
        proxy.hole_after_cut = True
        healing = asyncio.create_task(heal_after(proxy, 1.0))
        start = StartStep(step_id="s1", lazy=LazyStep(step_name="charge", input=b""))
        outcome = await handler.execute("r", start)
        await healing
        assert proxy.cuts["after"] == 1
        assert any(isinstance(f.error, CommitUnknown) for f in faults), faults
        assert outcome.created_step and outcome.snapshot.steps["s1"].attempt == 1
        assert [e.sequence for e in outcome.appended] == [3, 4]
        assert stored_types(schema, "r")[2:] == ["step_created", "step_started"]


async def test_a_log_whose_append_was_lost_is_recorded_once(schema: str) -> None:
    async with proxied(schema, call_timeout=0.3) as (store, proxy):
        handler = CommandHandler(store)
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        for cut in ("during", "after"):
            proxy.plan = lambda cut=cut: cut  # type: ignore[misc]
            proxy.hole_after_cut = True
            healing = asyncio.create_task(heal_after(proxy, 0.8))
            await handler.execute("r", RecordLog(level="info", message=f"cut {cut}"))
            await healing
            proxy.plan = lambda: None
        assert stored_types(schema, "r")[2:] == ["log_recorded", "log_recorded"]


async def test_a_named_log_whose_call_gave_up_in_doubt_is_recorded_once(schema: str) -> None:
    # The reply is lost and the server stays silent past the retry budget: CommitUnknown.
    # Executed again, by another handler (the kernel knows the log id) or by the same one (it
    # kept the append), the line is not written twice.
    async with proxied(schema, call_timeout=0.2) as (store, proxy):
        handler = CommandHandler(store, store_retry=StoreRetry(budget=0.5))
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        proxy.plan = lambda: "after"
        proxy.hole_after_cut = True
        line = RecordLog(level="info", message="charged", log_id="charge-1")
        with pytest.raises(CommitUnknown):
            await handler.execute("r", line)
        proxy.plan = lambda: None
        proxy.heal()
        assert stored_types(schema, "r")[2:] == ["log_recorded"]  # the cut came after COMMIT
        other = await CommandHandler(store).execute("r", line)
        assert other.appended == () and dict(other.snapshot.log_ids) == {"charge-1": 3}
        same = await handler.execute("r", line)
        assert [(e.sequence, e.event) for e in same.appended] == [
            (3, LogRecorded(level="info", message="charged", log_id="charge-1"))
        ]
        assert stored_types(schema, "r")[2:] == ["log_recorded"]


async def test_without_retries_the_first_fault_is_raised(schema: str) -> None:
    async with proxied(schema) as (store, proxy):
        handler = CommandHandler(store, store_retry=None)
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        proxy.plan = lambda: "before"
        with pytest.raises(StoreUnavailable):
            await handler.execute("r", RecordLog(level="info", message="lost"))


async def test_retries_give_up_after_their_budget_with_commit_unknown(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with proxied(schema, call_timeout=0.2) as (store, proxy):
        handler = CommandHandler(store, store_retry=StoreRetry(budget=0.5))
        await handler.execute("r", StartRun(create=CreateRun(workflow_name="wf", input=b"")))
        proxy.plan = lambda: "after"
        proxy.hole_after_cut = True  # and it never heals
        with caplog.at_level(logging.INFO, "runfold.handler"), pytest.raises(CommitUnknown):
            await handler.execute("r", RecordLog(level="info", message="perhaps"))
        assert any("retrying in" in r.message for r in caplog.records)
        assert any("giving up" in r.message for r in caplog.records)


@pytest.mark.parametrize(("rate", "runs"), [(0.03, 64), (0.4, 16)])
async def test_workflows_ride_through_cuts_around_commits(
    schema: str, rate: float, runs: int
) -> None:
    async with proxied(schema, pool_max=8) as (store, proxy):
        proxy.plan = random_plan(rate)
        flow = Flow(store, [ten_steps])
        keys = [f"{schema}-{n}" for n in range(runs)]
        results = await asyncio.gather(
            *(flow.start(ten_steps, key, run_id=f"run-{n}") for n, key in enumerate(keys)),
            return_exceptions=True,
        )
        proxy.plan = lambda: None
        assert sum(proxy.cuts.values()) > 0
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, failed[:3]
        assert [(r.status, r.output) for r in results] == [("completed", 45)] * runs  # type: ignore[union-attr]
        for n, key in enumerate(keys):
            snapshot = (await flow.result(f"run-{n}")).snapshot
            assert [s.attempt for s in snapshot.steps.values()] == [1] * STEPS  # none spent
            assert [BODY_RUNS[(key, i)] for i in range(STEPS)] == [1] * STEPS  # none re-run
            types = Counter(stored_types(schema, f"run-{n}"))
            assert types["step_completed"] == STEPS and types["step_started"] == STEPS
            assert types["run_completed"] == 1 and types["run_created"] == 1


class Timed(DelegatingStore):
    """Times every append and read: the longest is what a caller waited for one store call."""

    longest = 0.0

    async def append_if_sequence(self, *args: Any, **kwargs: Any) -> list[Envelope]:
        started = time.monotonic()
        try:
            return await super().append_if_sequence(*args, **kwargs)
        finally:
            self.longest = max(self.longest, time.monotonic() - started)

    async def read(self, *args: Any, **kwargs: Any) -> list[Envelope]:
        started = time.monotonic()
        try:
            return await super().read(*args, **kwargs)
        finally:
            self.longest = max(self.longest, time.monotonic() - started)


async def test_workflows_ride_through_a_black_hole_and_cuts_each_call_within_its_deadline(
    schema: str,
) -> None:
    deadline, runs = 0.5, 16
    async with proxied(schema, pool_max=8, call_timeout=deadline) as (store, proxy):
        proxy.plan = random_plan(0.4)
        timed = Timed(store)
        flow = Flow(timed, [ten_steps])
        keys = [f"{schema}-hole-{n}" for n in range(runs)]

        async def hole() -> None:
            await asyncio.sleep(0.3)
            proxy.black_hole()
            await asyncio.sleep(1.5)  # three deadlines
            proxy.heal()

        holing = asyncio.create_task(hole())
        results = await asyncio.gather(
            *(flow.start(ten_steps, key, run_id=key) for key in keys), return_exceptions=True
        )
        await holing
        proxy.plan = lambda: None
        assert not [r for r in results if isinstance(r, BaseException)]
        assert timed.longest <= deadline + 1.0, timed.longest
        for key in keys:
            snapshot = (await flow.result(key)).snapshot
            assert snapshot.status == "completed"
            assert [s.attempt for s in snapshot.steps.values()] == [1] * STEPS
            assert [BODY_RUNS[(key, i)] for i in range(STEPS)] == [1] * STEPS
            kinds = Counter(
                (e.event.event_type, getattr(e.event, "step_id", None))
                for e in await store.read(key)
            )
            assert max(kinds.values()) == 1, kinds  # no record of the run or a step twice
