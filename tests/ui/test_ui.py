"""The web inspector (`runfold.ui`) in a real headless Chromium, served by a real
`python -m runfold.ui` over a SQLite file whose runs the engine made."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect
from psycopg.conninfo import conninfo_to_dict

from runfold import CommandHandler
from runfold.engine import Engine
from runfold.events import (
    Envelope,
    RunCreated,
    RunStarted,
    StepCompleted,
    StepCreated,
    StepRetrying,
    StepStarted,
)
from runfold.stores.postgres import PostgresStore
from runfold.ui.payloads import HEX_LIMIT, show_payload
from runfold.ui.timeline import build_timeline
from tests.conftest import T0
from tests.support.postgres_support import DSN, admin, schema_name
from tests.support.ui_support import (
    BULK,
    HOSTILE,
    HOSTILE_ATTR,
    TOKEN_PREFIX,
    Shop,
    bulk_runs,
    checked_page,
    chromium,
    data_digest,
    deliver_hook,
    get,
    run_async,
    serve,
    shop_run,
    token_for,
)

pytestmark = pytest.mark.slow

BULK_RUNS = 12
HOSTILE_KEY = "<i>key</i>"
CHILD_ERROR = "<b>refused</b> & 'quoted' " + HOSTILE


async def _populate(path: Path) -> list[str]:
    bulk = await bulk_runs(path, BULK_RUNS)
    await shop_run(path, "order-1", {"item": "lamp"}, deliver=True)
    await shop_run(path, "child-1", {"fail": CHILD_ERROR}, deliver=True, parent="order-1")
    await shop_run(
        path,
        HOSTILE,
        {"binary": True, "note": HOSTILE},
        deliver=True,
        attributes={"note": HOSTILE_ATTR, HOSTILE_KEY: HOSTILE},
    )
    await shop_run(path, "live-1", {"item": "desk"}, deliver=False)
    return bulk


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ui") / "runs.db"
    run_async(_populate(path))
    return path


@pytest.fixture(scope="module")
def base(store_path: Path) -> Iterator[str]:
    yield from serve(f"sqlite:///{store_path}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from chromium()


@pytest.fixture
def page(browser: Browser, base: str) -> Iterator[Page]:
    yield from checked_page(browser, base, viewport={"width": 1280, "height": 900})


def _pwned(page: Page) -> str:
    return str(page.evaluate("typeof window.__pwned"))


def _open_run(page: Page, path: str) -> None:
    """Open a run's page and wait for its details (fetched after the first screen)."""
    page.goto(path)
    page.wait_for_selector("#details[data-status]")


def _ids(page: Page) -> list[str]:
    return page.locator("table.runs tbody td.id > a").all_inner_texts()


# --- the runs page --------------------------------------------------------------------------------


def test_runs_page_lists_newest_first_with_counts(page: Page, base: str) -> None:
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto("/")
    ids = _ids(page)
    assert ids[:4] == ["live-1", HOSTILE, "child-1", "order-1"]
    assert ids[4:] == [f"bulk-{n:02d}" for n in reversed(range(BULK_RUNS))]
    counts = {
        s: page.locator(f'.counts a[data-status="{s}"] b').inner_text()
        for s in ("all", "completed", "failed", "running", "pending")
    }
    assert counts == {"all": "16", "completed": "14", "failed": "1", "running": "1", "pending": "0"}
    assert requested, "the page made no request"
    assert all(url.startswith(base + "/") for url in requested), requested  # nothing from a CDN


def test_runs_page_filters_by_status_workflow_and_parent(page: Page) -> None:
    page.goto("/")
    page.locator('.counts a[data-status="failed"]').click()
    assert _ids(page) == ["child-1"]
    page.goto("/")
    page.locator('input[name="workflow"]').fill("bulk")
    page.locator(".filters button").click()
    page.wait_for_url("**workflow=bulk**")
    assert len(_ids(page)) == BULK_RUNS
    assert page.locator('.counts a[data-status="all"] b').inner_text() == str(BULK_RUNS)
    page.goto("/?parent=order-1")
    assert _ids(page) == ["child-1"]
    assert "child of order-1" in page.locator("table.runs .parent").inner_text()


def test_runs_page_pages_with_a_cursor(page: Page) -> None:
    page.goto("/?workflow=bulk&limit=5")
    seen: list[list[str]] = [_ids(page)]
    while page.locator(".pager a.next").count():
        page.locator(".pager a.next").click()
        page.wait_for_load_state()
        seen.append(_ids(page))
    assert [len(ids) for ids in seen] == [5, 5, 2]
    flat = [run_id for ids in seen for run_id in ids]
    assert flat == [f"bulk-{n:02d}" for n in reversed(range(BULK_RUNS))]
    page.locator(".pager a.first").click()
    assert _ids(page) == seen[0]


# --- a run's page ---------------------------------------------------------------------------------


def test_run_page_shows_header_timeline_and_tables(page: Page, tmp_path: Path) -> None:
    page.goto("/")
    page.get_by_role("link", name="order-1", exact=True).first.click()
    page.wait_for_url("**/runs/order-1")
    page.wait_for_selector("#details[data-status]")
    assert page.locator("#run-status").inner_text() == "completed"
    assert page.locator(".live-badge").count() == 0
    output = page.locator("#run-output .payload")
    assert output.locator(".label").inner_text().startswith("JSON")
    assert json.loads(output.locator("pre").inner_text()) == {"tracking": "ZX81"}
    chart = page.locator("svg#timeline")
    assert chart.locator("g.row-run").count() == 1
    assert chart.locator("g.row-step").count() == 2
    charge = chart.locator('g.row-step[data-row="charge"]')
    assert charge.locator("rect.attempt-retried").count() == 1
    assert charge.locator("rect.backoff").count() == 1
    assert charge.locator("rect.attempt-completed").count() == 1
    reserve = chart.locator('g.row-step[data-row="reserve"]')
    assert reserve.locator("rect.attempt-completed").count() == 1
    assert reserve.locator("rect.attempt-retried").count() == 0
    assert chart.locator("g.row-wait path.mark.due").count() == 1
    assert chart.locator("g.row-hook path.mark.delivery").count() == 1
    assert chart.locator("g.row-run path.mark.progress").count() == 1
    assert "charge attempt 1: retried" in (
        charge.locator("rect.attempt-retried title").text_content() or ""
    )
    steps = page.locator("#steps tbody tr")
    assert steps.count() == 2
    assert steps.nth(1).locator("td").nth(3).inner_text() == "2"  # the charge's two attempts
    assert "gateway timed out" in steps.nth(1).inner_text()
    assert page.locator("#waits tbody tr td").first.inner_text() == "cool-off"
    assert "ZX81" in page.locator("#hooks tbody tr").inner_text()
    assert page.locator("#progress tbody tr").inner_text().split("\t")[:2] == ["paid", "1/2"]
    shot = tmp_path / "run.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_timeline_draws_an_interrupted_attempt_apart_from_a_retried_one() -> None:
    events = [
        RunCreated(workflow_name="wf", input=b""),
        RunStarted(),
        StepCreated(step_id="charge", step_name="charge", input=b""),
        StepStarted(step_id="charge", attempt=1),
        StepRetrying(step_id="charge", error=b"timeout"),
        StepStarted(step_id="charge", attempt=2),
        StepStarted(step_id="charge", attempt=3, after_interruption=True),
        StepCompleted(step_id="charge", output=b""),
    ]
    history = [
        Envelope(run_id="r", sequence=n, event=event, recorded_at=T0 + n * timedelta(seconds=1))
        for n, event in enumerate(events, start=1)
    ]
    [charge] = [row for row in build_timeline(history).rows if row.label == "charge"]
    attempts = [bar for bar in charge.bars if bar.kind.startswith("attempt")]
    assert [bar.kind for bar in attempts] == [
        "attempt-retried",
        "attempt-interrupted",
        "attempt-completed",
    ]
    assert attempts[1].title.startswith("charge attempt 2: interrupted")


@pytest.mark.parametrize(
    ("milliseconds", "labels"),
    [
        (2, ["0.0ms", "0.5ms", "1.0ms", "1.5ms", "2.0ms"]),
        (600_000, ["0m", "2m", "4m", "6m", "8m", "10m"]),
        (5_000_000, ["0m", "15m", "30m", "45m", "60m", "75m"]),
    ],
)
def test_the_timeline_axis_labels_are_distinct_and_round(
    milliseconds: int, labels: list[str]
) -> None:
    events = [RunCreated(workflow_name="wf", input=b""), RunStarted()]
    history = [
        Envelope(
            run_id="r",
            sequence=n,
            event=event,
            recorded_at=T0 + n * timedelta(milliseconds=milliseconds),
        )
        for n, event in enumerate(events)
    ]
    ticks = [tick.text for tick in build_timeline(history).ticks]
    assert ticks == labels


def test_a_completed_runs_hook_is_released_as_the_cli_says(page: Page, store_path: Path) -> None:
    _open_run(page, "/runs/order-1")
    assert page.locator("#hooks .status").all_inner_texts() == ["released"]
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "runfold",
            "show",
            "order-1",
            "--json",
            "--store",
            f"sqlite:///{store_path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [h["status"] for h in json.loads(shown.stdout)["hooks"].values()] == ["released"]
    _open_run(page, "/runs/live-1")
    assert page.locator("#hooks .status").all_inner_texts() == ["active"]


def test_run_history_is_paged_with_payloads_decoded(page: Page) -> None:
    page.goto("/runs/order-1?limit=5")
    rows = page.locator("#history tbody tr")

    def sequences() -> list[str]:
        return [rows.nth(i).get_attribute("data-sequence") or "" for i in range(rows.count())]

    assert sequences() == ["1", "2", "3", "4", "5"]
    created = rows.first.locator(".payload")
    assert created.locator(".label").inner_text().startswith("JSON")
    assert created.locator("pre").inner_text() == json.dumps({"item": "lamp"}, indent=2)
    page.locator(".pager a.next").click()
    page.wait_for_url("**after=5**")
    assert sequences() == ["6", "7", "8", "9", "10"]
    page.locator(".pager a.previous").click()
    page.wait_for_url("**after=0**")
    assert sequences()[0] == "1"
    page.goto("/runs/order-1?limit=500")
    types = page.locator("#history td.event-type").all_inner_texts()
    assert types[0] == "run_created"
    assert types[-1] == "run_completed"
    assert {"step_retrying", "wait_completed", "hook_received"} <= set(types)
    assert page.locator(".pager a").count() == 0


def test_binary_payloads_are_labelled_hex() -> None:
    assert show_payload(b'{"a": [1]}').label == "json"
    assert show_payload(b"plain words").text == "plain words"
    assert show_payload(b"\xff\x00").text == "ff 00"
    long = bytes(range(256)) * 2
    assert len(long) > HEX_LIMIT
    assert show_payload(long).label == "base64"


# --- safety ---------------------------------------------------------------------------------------


def test_hostile_stored_values_are_shown_as_text(page: Page) -> None:
    page.goto("/")
    assert _pwned(page) == "undefined"
    values = page.locator("table.runs .attr .value").all_inner_texts()
    assert HOSTILE_ATTR in values
    assert HOSTILE in values
    assert HOSTILE_KEY in page.locator("table.runs .attr .key").all_inner_texts()
    assert page.locator("img").count() == 0
    page.get_by_role("link", name=HOSTILE, exact=True).click()
    page.wait_for_selector("#run")
    assert page.locator("h1 .run-id").inner_text() == HOSTILE
    assert page.locator("#run").get_attribute("data-run-id") == HOSTILE
    assert HOSTILE_ATTR in page.locator("#run-attributes").inner_text()
    assert page.locator("#run-output .label").inner_text().startswith("HEX")
    assert HOSTILE in page.locator("#history").inner_text()  # the input payload, as text
    assert page.locator("img").count() == 0
    page.goto("/runs/child-1")
    assert page.locator("#run-error pre").inner_text() == CHILD_ERROR
    assert page.locator("#run-error code").inner_text() == "refused"
    assert _pwned(page) == "undefined"


def test_hook_tokens_never_appear(page: Page, base: str) -> None:
    for path in ("/", "/runs/order-1", "/runs/live-1", "/runs/order-1?limit=500"):
        if path == "/":
            page.goto(path)
        else:
            _open_run(page, path)
        assert TOKEN_PREFIX not in page.content(), path
        status, body, _ = get(base + path)
        assert status == 200
        assert TOKEN_PREFIX not in body, path
    assert "hook_created" in page.locator("#history").inner_text()  # the event is listed
    status, body, _ = get(base + "/api/head?run_id=live-1")
    assert status == 200
    assert json.loads(body) == {
        "last_sequence": json.loads(body)["last_sequence"],
        "status": "running",
        "live": True,
    }
    assert token_for("live-1") not in body


def test_pages_carry_a_strict_content_security_policy(base: str) -> None:
    status, _, headers = get(base + "/")
    assert status == 200
    policy = {k.lower(): v for k, v in headers.items()}["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy


def test_bad_requests_are_named(base: str) -> None:
    status, body, _ = get(base + "/runs/%3Cscript%3Enope")
    assert status == 404
    assert "no run &#39;&lt;script&gt;nope&#39;" in body
    status, body, _ = get(base + "/?status=sleeping")
    assert (status, "unknown status &#39;sleeping&#39;" in body) == (400, True)
    status, body, _ = get(base + "/?cursor=bm90LW91cnM")
    assert (status, "cursor is malformed" in body) == (400, True)
    status, body, _ = get(base + "/runs/order-1?limit=0")
    assert (status, "limit must be" in body) == (400, True)
    assert get(base + "/api/head?run_id=nope")[0] == 404


def test_the_app_never_writes_to_the_store(page: Page, base: str, store_path: Path) -> None:
    before = data_digest(store_path)
    for path in ("/", "/?status=running", "/?workflow=bulk&limit=3", "/runs/order-1"):
        page.goto(path)
    for path in (
        "/api/head?run_id=order-1",
        "/?cursor=bad",
        "/runs/nope",
        "/runs/live-1",
        "/runs/live-1/details",
        "/runs/live-1/events?after=3",
    ):
        get(base + path)
    assert data_digest(store_path) == before


def test_a_live_run_page_follows_new_events(page: Page, store_path: Path) -> None:
    _open_run(page, "/runs/live-1")
    assert page.locator("#run-status").inner_text() == "running"
    assert page.locator(".live-badge").count() == 1
    events = int(page.locator("#run-events").inner_text())
    page.evaluate("window.__sameDocument = true")
    run_async(deliver_hook(store_path, "live-1"))
    expect(page.locator("#run-status")).to_have_text("completed", timeout=10_000)
    assert int(page.locator("#run-events").inner_text()) > events
    assert "LIVE-1" in page.locator("#run-output").inner_text()
    assert page.locator(".live-badge").count() == 0
    assert page.evaluate("window.__sameDocument") is True  # updated in place, not reloaded


# --- the entry point ------------------------------------------------------------------------------


def test_serving_a_missing_file_fails_without_creating_it(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.db"
    result = subprocess.run(
        [sys.executable, "-m", "runfold.ui", "--store", f"sqlite:///{missing}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "cannot open SQLite store" in result.stderr and str(missing) in result.stderr
    assert not missing.exists()
    result = subprocess.run(
        [sys.executable, "-m", "runfold.ui", "--store", "mongo://ann:hunter2@db/x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unsupported store scheme 'mongo'" in result.stderr
    assert "hunter2" not in result.stderr


@pytest.mark.postgres
def test_a_select_only_postgres_role_can_inspect(tmp_path: Path) -> None:
    schema = schema_name("ui")
    role = f"{schema}_reader"
    dsn = conninfo_to_dict(DSN)

    async def populate() -> None:
        async with await PostgresStore.open(DSN, schema=schema) as store:
            engine = Engine(CommandHandler(store), Shop())
            await engine.start(BULK, b'{"n": 7}', run_id="pg-run")

    run_async(populate())
    admin().execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        admin().execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        admin().execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        host, port = dsn.get("host", "127.0.0.1"), dsn.get("port", "5432")
        url = f"postgresql://{role}@{host}:{port}/{dsn.get('dbname', 'postgres')}?schema={schema}"
        for base in serve(url):
            status, body, _ = get(base + "/")
            assert (status, "pg-run" in body) == (200, True)
            status, body, _ = get(base + "/runs/pg-run")
            assert (status, "run_completed" in body) == (200, True)
        denied = admin().execute(
            "SELECT has_table_privilege(%s, %s, 'INSERT')", (role, f'"{schema}".events')
        )
        assert denied.fetchone() == (False,)  # the role could not have written
    finally:
        admin().execute(f'DROP OWNED BY "{role}"')
        admin().execute(f'DROP ROLE "{role}"')


def test_without_the_extra_the_import_names_it() -> None:
    blocked = "import sys; sys.modules['uvicorn'] = None; import runfold.ui"
    result = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "ImportError: runfold.ui needs the `ui` extra: pip install 'runfold[ui]' "
        "(uvicorn is missing)"
    )
