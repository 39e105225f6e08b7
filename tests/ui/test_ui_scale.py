"""The inspector on a run of 100,000 events, in a real Chromium against a real `runfold ui`:
every response a run's page makes is bounded in bytes, tables and history page, a live page
fetches only the events it has not shown, and 200 concurrent clients meet no error while
writers go on appending. Times are the benchmark's (`python -m benchmarks --only inspector`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Response, expect

from benchmarks.inspector_load import (
    BIG_RUN,
    fetch,
    load,
    load_paths,
    seed_store,
    serving,
    writing,
)
from runfold import CommandHandler
from runfold.commands import RecordLog
from runfold.stores import SQLiteStore
from runfold.ui.details import TABLE_PAGE
from tests.support.ui_support import checked_page, chromium, run_async

pytestmark = pytest.mark.slow

EVENTS = 100_000
PAGE_LIMIT = 1_000_000
"""Issue #32: a run's page weighs under a megabyte, however long the run."""


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scale") / "runs.db"
    run_async(seed_store(path, EVENTS))
    return path


@pytest.fixture(scope="module")
def base(store_path: Path) -> Iterator[str]:
    with serving(f"sqlite:///{store_path}") as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from chromium()


@pytest.fixture
def page(browser: Browser, base: str) -> Iterator[Page]:
    yield from checked_page(browser, base)


def _record_sizes(page: Page) -> dict[str, int]:
    sizes: dict[str, int] = {}

    def on_response(response: Response) -> None:
        if "/static/" not in response.url:
            sizes[response.url] = len(response.body())

    page.on("response", on_response)
    return sizes


def test_a_long_runs_page_weighs_under_a_megabyte(page: Page) -> None:
    sizes = _record_sizes(page)
    page.goto(f"/runs/{BIG_RUN}")
    page.wait_for_selector("#details[data-status]")
    assert page.locator("#run-events").inner_text() == str(EVENTS)
    assert page.locator("#history tbody tr").count() == 50
    assert page.locator("#steps tbody tr").count() == TABLE_PAGE
    assert page.locator("svg#timeline g.row-step").count() == TABLE_PAGE
    assert page.locator("svg#timeline *").count() < 2_000
    assert len(sizes) == 2, sizes  # the first screen and its details
    assert all(size > 1000 for size in sizes.values()), sizes
    assert sum(sizes.values()) < PAGE_LIMIT, sizes


def test_tables_and_history_of_a_long_run_page(page: Page) -> None:
    page.goto(f"/runs/{BIG_RUN}")
    page.wait_for_selector("#details[data-status]")
    first = page.locator("#steps td.id").all_inner_texts()
    assert first[0] == "step-000000"
    page.locator('.table-pager[data-table="steps"] a.next').click()
    page.wait_for_url(f"**steps_from={TABLE_PAGE}")
    page.wait_for_selector("#details[data-status]")
    assert page.locator("#steps td.id").first.inner_text() == f"step-{TABLE_PAGE:06d}"
    assert page.locator('svg#timeline g.row-step[data-row="step-000000"]').count() == 0
    sizes = _record_sizes(page)
    page.goto(f"/runs/{BIG_RUN}?after={EVENTS - 10}")
    page.wait_for_selector("#details[data-status]")
    assert page.locator("#history tbody tr").count() == 10
    assert page.locator("#history tbody tr").last.get_attribute("data-sequence") == str(EVENTS)
    assert sum(sizes.values()) < PAGE_LIMIT, sizes


async def _log(path: Path, run_id: str, count: int) -> None:
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store)
        for n in range(count):
            await handler.execute(run_id, RecordLog(level="info", message=f"new {n}"))


def test_a_live_page_fetches_only_the_events_it_has_not_shown(page: Page, store_path: Path) -> None:
    run_id = "small-003"  # started, never ended: live
    page.goto(f"/runs/{run_id}")
    page.wait_for_selector("#details[data-status]")
    assert page.locator(".live-badge").count() == 1
    shown = page.locator("#history tbody tr").count()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.evaluate("window.__sameDocument = true")
    run_async(_log(store_path, run_id, 3))
    expect(page.locator("#history tbody tr")).to_have_count(shown + 3, timeout=10_000)
    assert page.evaluate("window.__sameDocument") is True
    events = [url for url in requested if "/events?" in url]
    assert len(events) == 1, requested
    assert f"after={shown}" in events[0]
    assert not any(url.endswith(f"/runs/{run_id}") for url in requested), requested
    types = page.locator("#history td.event-type").all_inner_texts()
    assert types[-3:] == ["log_recorded"] * 3


def test_two_hundred_clients_meet_no_error_while_writers_progress(
    base: str, store_path: Path
) -> None:
    url = f"sqlite:///{store_path}"
    with writing(url, writers=2, seconds=4.0) as writers:
        report = run_async(load(base, load_paths(EVENTS), clients=200, seconds=4.0))
    assert report.errors == {}
    assert all(len(seen) > 0 for seen in report.by_path.values()), report.by_path.keys()
    assert [w.error for w in writers] == [None, None]
    assert all(w.commands > 0 for w in writers), writers
    status, _ = run_async(fetch(base, f"/api/head?run_id={BIG_RUN}"))
    assert status == 200
