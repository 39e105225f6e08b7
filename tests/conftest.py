"""Shared fixtures: every store-facing test runs against every backend through `store`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from runfold import CommandHandler, EventStore, MemoryStore
from runfold.stores import SQLiteStore
from tests.support.cli_support import Demo, ok, runfold_cli
from tests.support.postgres_support import drop_session_schemas, suite_store

# "ci" (the default) is quick and derandomized so CI is repeatable; "deep" is for `make test-deep`.
settings.register_profile(
    "ci",
    max_examples=100,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "deep",
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""The time every test clock starts at."""


class Clock:
    """A hand-driven clock for the handler: tests move time explicitly."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta = timedelta(seconds=1)) -> datetime:
        self.now += delta
        return self.now


BACKENDS = os.environ.get(
    "RUNFOLD_TEST_BACKENDS", "memory,sqlite-file,sqlite-memory,postgres"
).split(",")
"""Store backends the suite runs against; each new store adds its name here and a branch in
`_open`."""


async def _open(backend: str, tmp_path: object) -> EventStore:
    if backend == "memory":
        return MemoryStore()
    if backend == "sqlite-file":
        return await SQLiteStore.open(Path(str(tmp_path)) / "runfold.db")
    if backend == "sqlite-memory":
        return await SQLiteStore.open(":memory:")
    if backend == "postgres":
        return await suite_store()
    raise AssertionError(f"unknown backend {backend}")


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: object) -> AsyncIterator[EventStore]:
    """A fresh, empty store of each backend."""
    opened = await _open(request.param, tmp_path)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(scope="session", autouse=True)
def _postgres_schemas() -> Iterator[None]:
    """Drop the PostgreSQL schemas the test session made."""
    yield
    drop_session_schemas()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def handler(store: EventStore, clock: Clock) -> CommandHandler:
    """A command handler over `store` with the hand-driven `clock`."""
    return CommandHandler(store, clock=clock)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """`runfold demo` twice on one file: first on the default store (runfold.db in the working
    directory), then through `RUNFOLD_STORE` pointing at the same file."""
    folder = tmp_path_factory.mktemp("demo")
    first = ok(runfold_cli("demo", cwd=folder))
    path = folder / "runfold.db"
    url = f"sqlite:///{path}"
    second = ok(runfold_cli("demo", env={"RUNFOLD_STORE": url}))
    return Demo(path=path, url=url, first=first, second=second)
