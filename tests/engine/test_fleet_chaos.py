"""The fleet under chaos: real `runfold worker` processes on one store, killed and paused.

Small rounds here (`make test`); `python -m tests.support.fleet_chaos --store URL` runs the long
one. What each count means is in `tests/support/fleet_chaos.py`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runfold.stores import open_store
from tests.support.fleet_chaos import run_chaos
from tests.support.postgres_support import DSN, admin, schema_name


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'fleet.db'}"


def postgres_url() -> str:
    admin()  # skips (or fails under CI=true) without a server
    schema = schema_name("fleet")
    separator = "&" if "?" in DSN else "?"
    return f"{DSN}{separator}schema={schema}"


async def _prepare(url: str) -> None:
    store = await open_store(url)
    await store.close()


@pytest.mark.parametrize(("backend", "workers"), [("sqlite", 3), ("postgres", 4)])
def test_chaos_loses_nothing_and_never_runs_a_step_twice_at_once(
    backend: str, workers: int, tmp_path: Path
) -> None:
    url = sqlite_url(tmp_path) if backend == "sqlite" else postgres_url()
    asyncio.run(_prepare(url))
    figures = asyncio.run(
        # Enough work for several kills and stops (the fleet drains 24 runs in about 4 s).
        run_chaos(url, workers=workers, runs=48, every=1.0, lease=1.5, work=0.2, limit=150.0)
    )
    print(figures)
    assert figures["unfinished"] == 0, figures
    assert figures["failed"] == 0, figures
    assert figures["overlaps_live"] == 0, figures
    assert figures["zombie_outcomes"] == 0, figures
    assert figures["past_budget"] == 0, figures
    assert figures["ran_twice"] == figures["explained"], figures
    assert figures["kills"] + figures["stops"] >= 3, figures
    # A killed worker's runs are taken over within twice the lease (issue's takeover bound).
    assert figures["takeover_seconds"] <= 2 * figures["lease_seconds"], figures
    assert set(figures["exit_codes"]) == {0}, figures
