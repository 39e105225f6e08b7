"""Code versions: what a run records by default, and workers that serve only some versions
(a blue/green deploy draining the old one), on every store; `runfold runs --version`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from runfold import EventStore
from runfold.engine.versions import MISSING, VersionFilter
from runfold.flow import Flow, Workflow, sleep, step, workflow_info
from runfold.flow.versions import code_version
from runfold.stores import open_store
from tests.conftest import Clock
from tests.support.cli_support import ok, runfold_cli, store_url

RAN: list[tuple[str, str]] = []


def record(tag: str) -> str:
    RAN.append((workflow_info().run_id, tag))
    return tag


async def _blue(_: None) -> str | None:
    await step(record, "blue")
    return workflow_info().workflow_version


async def _green(_: None) -> str | None:
    await step(record, "green")
    return workflow_info().workflow_version


async def _green_sleeps(_: None) -> str:
    await sleep(timedelta(milliseconds=50))
    return str(await step(record, "green"))


async def _blue_sleeps(_: None) -> str:
    await sleep(timedelta(milliseconds=50))
    return str(await step(record, "blue"))


BLUE = Workflow(name="test-versions", fn=_blue)
GREEN = Workflow(name="test-versions", fn=_green)


async def test_a_run_records_a_digest_of_the_code_by_default(
    store: EventStore, clock: Clock
) -> None:
    blue = Flow(store, [BLUE], clock=clock)
    done = await blue.start(BLUE, None, run_id="r")
    digest = code_version([BLUE])
    assert digest.startswith("code-") and len(digest) == len("code-") + 16
    assert done.output == digest == done.snapshot.workflow_version
    assert code_version([GREEN]) != digest  # other code, another version
    assert code_version([BLUE]) == digest  # the same code, the same version
    # A start retried by the next deploy is the same start: the run keeps its version.
    again = await Flow(store, [GREEN], clock=clock).start(GREEN, None, run_id="r")
    assert again.snapshot.workflow_version == digest
    named = await Flow(store, [BLUE], clock=clock, version="2026.12").start(BLUE, None)
    assert named.output == "2026.12"


async def _serve_until(flow: Flow, versions: set[str], done: list[str]) -> None:
    serving = asyncio.create_task(
        flow.serve(poll_interval=0.02, handle_signals=False, versions=versions)
    )
    try:
        for _ in range(500):
            summaries = await flow.handler.store.get_runs(done)
            if all(s is not None and s.status == "completed" for s in summaries):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"runs {done} did not complete")
    finally:
        flow.stop()
        await serving


async def test_workers_of_one_version_leave_the_other_versions_runs(store: EventStore) -> None:
    RAN.clear()
    blue = Flow(store, [BLUE], version="blue")
    green = Flow(store, [GREEN], version="green")
    for n in range(3):
        await blue.start(BLUE, None, run_id=f"blue-{n}", queued=True)
        await green.start(GREEN, None, run_id=f"green-{n}", queued=True)
    # Runs of each version parked on a timer, released: due wakeups of both versions.
    sleepy_blue = Workflow(name="test-versions-sleepy", fn=_blue_sleeps)
    sleepy_green = Workflow(name="test-versions-sleepy", fn=_green_sleeps)
    await Flow(store, [sleepy_blue], version="blue").start(sleepy_blue, None, run_id="blue-s")
    await Flow(store, [sleepy_green], version="green").start(sleepy_green, None, run_id="green-s")

    greens = [*(f"green-{n}" for n in range(3)), "green-s"]
    await _serve_until(Flow(store, [GREEN, sleepy_green], version="green"), {"green"}, greens)
    assert {run for run, _ in RAN} == set(greens)
    assert {tag for _, tag in RAN} == {"green"}
    waiting = await store.get_runs(["blue-0", "blue-1", "blue-2", "blue-s"])
    assert [s.status for s in waiting if s is not None] == ["pending"] * 3 + ["running"]

    blues = [*(f"blue-{n}" for n in range(3)), "blue-s"]
    await _serve_until(Flow(store, [BLUE, sleepy_blue], version="blue"), {"blue"}, blues)
    assert sorted(run for run, tag in RAN if tag == "blue") == sorted(blues)
    assert len(RAN) == 8  # each body once


async def test_a_version_filter_serves_runs_that_recorded_no_version(store: EventStore) -> None:
    flow = Flow(store, [BLUE], version="blue")
    await flow.start(BLUE, None, run_id="a", queued=True)
    await flow.engine.start("test-versions", b"null", run_id="ticked", queued=True)  # no version
    filter_ = VersionFilter(flow.handler, {"blue"})
    assert await filter_.keep(["a", "nobody", "ticked"]) == ["a", "ticked"]
    assert await filter_.version_of("a") == "blue"
    assert await filter_.version_of("nobody") is MISSING
    assert await VersionFilter(flow.handler, {"green"}).keep(["a", "ticked"]) == ["ticked"]
    with pytest.raises(ValueError, match="at least one version"):
        VersionFilter(flow.handler, set())


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from store_url(request.param, tmp_path / "v.db", "versions")


@pytest.mark.slow
async def test_runs_lists_one_version(url: str) -> None:
    store = await open_store(url)
    try:
        for n in range(7):
            version = "blue" if n % 3 else "green"
            await Flow(store, [BLUE], version=version).start(
                BLUE, None, run_id=f"r{n}", queued=True
            )
    finally:
        await store.close()
    listed = json.loads(
        ok(runfold_cli("runs", "--version", "blue", "--limit", "3", "--json", "--store", url))
    )
    assert [r["run_id"] for r in listed["runs"]] == ["r5", "r4", "r2"]
    assert listed["has_more"]
    rest = runfold_cli(
        "runs", "--version", "blue", "--cursor", listed["cursor"], "--json", "--store", url
    )
    assert [r["run_id"] for r in json.loads(ok(rest))["runs"]] == ["r1"]
    greens = json.loads(ok(runfold_cli("runs", "--version", "green", "--json", "--store", url)))
    assert [r["run_id"] for r in greens["runs"]] == ["r6", "r3", "r0"]
