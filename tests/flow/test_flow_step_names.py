"""A flow run's steps by name, not call id: `runfold show`, `runfold history` (a real
subprocess) and the inspector's timeline and history (a real Chromium), with hostile names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from runfold.flow import Flow, code_version, step, workflow
from runfold.kernel.naming import step_label, step_names
from runfold.stores import SQLiteStore, open_store
from tests.support.cli_support import cells, ok, runfold_cli
from tests.support.postgres_support import DSN, admin, schema_name
from tests.support.ui_support import HOSTILE, checked_page, chromium, run_async, serve

# A name a browser would run and a terminal would show reversed, with rich markup in it.
NASTY = HOSTILE + "\u202egnp.exe[bold]x[/]"
RUN = "named-1"


def charge(amount: int) -> str:
    return f"charged {amount}"


def note(text: str) -> str:
    return text


@workflow(name="test-named-steps")
async def named(amount: int) -> list[str]:
    paid = await step(charge, amount)
    both = await asyncio.gather(step(note, "a", name=NASTY), step(note, "b", name="ship"))
    return [paid, *both]


async def _populate(url: str) -> None:
    async with await open_store(url) as store:
        run = await Flow(store, [named]).start(named, 30, run_id=RUN)
        assert run.status == "completed", run.error


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('names') / 'runs.db'}"
    run_async(_populate(url))
    return url


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def cli_url(request: pytest.FixtureRequest, store_url: str) -> Iterator[str]:
    """The flow run on a SQLite file, or the same run written to PostgreSQL."""
    if request.param == "sqlite":
        yield store_url
        return
    admin()  # skips without a server (fails under CI=true)
    name = schema_name("names")
    url = f"{DSN}?schema={name}"
    run_async(_populate(url))
    yield url
    admin().execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def test_a_step_label_is_its_name_and_id_unless_they_are_one() -> None:
    assert step_label("2", "charge") == "charge #2"
    assert step_label("reserve-stock", "reserve-stock") == "reserve-stock"
    assert step_label("7", None) == "7"


@pytest.mark.slow
def test_show_names_a_flow_runs_steps(cli_url: str) -> None:
    text = ok(runfold_cli("--store", cli_url, "show", RUN))
    version = next(line for line in text.splitlines() if line.strip().startswith("version"))
    assert cells(version) == ["version", code_version([named])]  # not "vcode-…" after the name
    rows = {cells(line)[0]: cells(line) for line in text.splitlines() if line.startswith("  ")}
    assert rows["charge #1"][1:3] == ["completed", "1"]
    assert rows["ship #3"][1] == "completed"
    inert_name = HOSTILE + "\\u202egnp.exe[bold]x[/]"
    assert rows[f"{inert_name} #2"][1] == "completed"  # shown inert, markup as text
    assert "\u202e" not in text
    shown = json.loads(ok(runfold_cli("--store", cli_url, "show", RUN, "--json")))
    assert shown["steps"]["2"]["step_name"] == NASTY  # JSON keeps ids and names apart


@pytest.mark.slow
def test_history_names_a_flow_runs_steps(cli_url: str) -> None:
    lines = ok(runfold_cli("--store", cli_url, "history", RUN)).splitlines()
    rows = [cells(line) for line in lines[1:]]
    subjects = [(row[2], row[3]) for row in rows if row[2].startswith("step_")]
    assert ("step_created", "charge #1") in subjects
    assert ("step_completed", "charge #1") in subjects
    assert ("step_started", "ship #3") in subjects
    assert not any(row[3] in ("1", "2", "3") for row in rows if row[2].startswith("step_"))
    created = [row for row in rows if row[2] == "step_created" and row[3] == "charge #1"]
    assert "step_name=" not in " ".join(created[0])  # the label says it already
    assert "\u202e" not in "\n".join(lines)


@pytest.fixture(scope="module")
def base(store_url: str) -> Iterator[str]:
    yield from serve(store_url)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from chromium()


@pytest.fixture
def page(browser: Browser, base: str) -> Iterator[Page]:
    yield from checked_page(browser, base)


def test_the_inspector_names_a_flow_runs_steps(page: Page) -> None:
    page.goto(f"/runs/{RUN}")
    chart = page.locator("svg#timeline")
    chart.locator("g.row-step").first.wait_for()  # the timeline comes with the details fragment
    labels = chart.locator("g.row-step").evaluate_all(
        "rows => rows.map(r => r.getAttribute('data-row'))"
    )
    assert labels == ["charge #1", f"{NASTY} #2", "ship #3"]
    charge_row = chart.locator('g.row-step[data-row="charge #1"]')
    title = charge_row.locator("rect.attempt-completed title").text_content() or ""
    assert title.startswith("charge #1 attempt 1: completed")
    subjects = page.locator("#history tbody td.id").all_inner_texts()
    assert "charge #1" in subjects and f"{NASTY} #2" in subjects
    assert page.evaluate("typeof window.__pwned") == "undefined"  # the name stayed text
    assert page.locator("script:not([src])").count() == 0


def test_names_come_from_the_history_alone(store_url: str) -> None:
    async def labels() -> dict[str, str]:
        path = store_url.removeprefix("sqlite:///")
        async with await SQLiteStore.open(path) as store:
            return step_names(await store.read(RUN))

    assert run_async(labels()) == {"1": "charge #1", "2": f"{NASTY} #2", "3": "ship #3"}
