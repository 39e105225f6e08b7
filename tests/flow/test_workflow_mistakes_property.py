"""Property: whatever mistakes workflow code makes, every run ends or waits.

Hypothesis draws a workflow as a list of calls, each right or wrong (a step whose body raises an
exception or a `SystemExit`, never returns, returns what the codec cannot encode or what is
over the payload limit; a step name, arguments or hook token the kernel refuses; `asyncio.sleep`
in workflow code; a raise in the workflow itself; a return value it cannot encode), some of
them inside `try/except Exception`. One `runfold.flow` workflow runs the drawn list, on a real
SQLite file and a real PostgreSQL schema; time moves on by hand, and hooks get their events.
After every drive, the run has ended or waits on something (a timer, a retry, a hook); no
drive, `run_until_idle` or `recover` raises.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runfold import EventStore, Snapshot
from runfold.flow import Flow, sleep, step, wait_for_event, workflow
from runfold.kernel import RetryPolicy
from runfold.stores import PostgresStore, SQLiteStore
from tests.conftest import Clock
from tests.support.postgres_support import DSN, admin, schema_name

BIG = "x" * (3 * 1024 * 1024)
BASE = {
    "SystemExit": SystemExit(2),
    "KeyboardInterrupt": KeyboardInterrupt(),
    "GeneratorExit": GeneratorExit(),
    "CancelledError": asyncio.CancelledError(),
}


def keep(value: object) -> object:
    return value


def body(kind: str) -> object:
    if kind == "set":
        return {1, 2}
    if kind == "big":
        return BIG
    if kind == "ValueError":
        raise ValueError("a step's own failure \udc80")
    raise BASE[kind]


async def never_returns() -> None:
    await asyncio.Event().wait()


async def call(op: str, i: int, prefix: str) -> object:
    """What call `op` (the `i`-th of its run) does."""
    kind, _, detail = op.partition(":")
    if kind == "step":
        return await step(keep, i)
    if kind == "body":
        return await step(body, detail, name=f"body-{detail}", retry=RetryPolicy(max_attempts=2))
    if kind == "hang":
        return await step(never_returns, timeout=0.01, retry=RetryPolicy(max_attempts=2))
    if kind == "name":
        name = {"long": "n" * 300, "newline": "a\nb", "surrogate": "a\udc80"}[detail]
        return await step(keep, i, name=name)
    if kind == "args":
        return await step(keep, {1, 2} if detail == "set" else BIG)
    if kind == "sleep":
        return await sleep(timedelta.max if detail == "forever" else timedelta(minutes=1))
    if kind == "event":
        return await wait_for_event("e", token=f"{prefix}-{i}" if detail == "ok" else "")
    if kind == "asyncio":
        await asyncio.sleep(0)
        return None
    if kind == "raise":
        raise (ValueError("the workflow's own") if detail == "ValueError" else BASE[detail])
    raise AssertionError(op)


@workflow(name="test-mistakes-drawn")
async def drawn(program: dict[str, Any]) -> object:
    for i, (op, caught) in enumerate(program["ops"]):
        try:
            await call(op, i, program["prefix"])
        except Exception:
            if not caught:
                raise
    end = program["end"]
    return {1, 2} if end == "set" else BIG if end == "big" else "done"


KINDS = [*BASE, "ValueError"]
OPS = st.sampled_from(
    [
        "step",
        "step",
        "sleep:minute",
        "sleep:forever",
        "event:ok",
        "event:empty",
        "hang",
        "asyncio",
        *(f"body:{k}" for k in ("set", "big", *KINDS)),
        *(f"name:{k}" for k in ("long", "newline", "surrogate")),
        *(f"args:{k}" for k in ("set", "big")),
        *(f"raise:{k}" for k in KINDS),
    ]
)
PROGRAMS = st.fixed_dictionaries(
    {
        "ops": st.lists(st.tuples(OPS, st.booleans()), max_size=6),
        "end": st.sampled_from(["ok", "ok", "set", "big"]),
    }
)


def settled(run: Snapshot) -> bool:
    """Whether the run ended, or waits on a timer, a retry or a hook."""
    return run.is_terminal or bool(run.wakeups()) or bool(run.active_hooks())


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventStore]:
    opened: EventStore
    if request.param == "sqlite":
        opened = await SQLiteStore.open(tmp_path / "runfold.db")
    else:
        admin()  # skips without a server
        opened = await PostgresStore.open(DSN, schema=schema_name("mistakes"), pool_max=2)
    try:
        yield opened
    finally:
        await opened.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(program=PROGRAMS)
async def test_every_run_ends_or_waits_whatever_its_mistakes(
    store: EventStore, program: dict[str, Any]
) -> None:
    clock = Clock()
    prefix = uuid.uuid4().hex
    flow = Flow(store, [drawn], clock=clock)
    run = (await flow.start(drawn, {**program, "prefix": prefix}, run_id=prefix)).snapshot
    for _ in range(40):
        assert settled(run), run
        if run.is_terminal:
            break
        for hook in run.active_hooks():
            await flow.deliver(hook.token, "event")
        due = [w.due_at for w in run.wakeups() if w.due_at.year < 9000]
        if due:
            clock.now = max(clock.now, min(due))
        resumed = await flow.run_until_idle()
        assert all(r.error is None for r in resumed), resumed
        run = (await flow.result(prefix)).snapshot
        if not due and not run.active_hooks():
            break  # it sleeps until year 9999: a wait
    assert settled(run), run
    again = await Flow(store, [drawn], clock=clock).recover()
    assert all(r.error is None for r in again), again
