"""The inspector's operator actions in a real Chromium against a real `runfold ui`: absent
without `--allow-actions`; with it, deliver, resume and cancel work from a run's page; a
forged cross-origin form, or a POST without the session's token, is refused and changes
nothing."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from benchmarks.inspector_load import serving
from tests.support.ui_support import chromium, data_digest, get, run_async, shop_run, token_for


async def _populate(path: Path) -> None:
    for run_id in ("live-a", "live-b", "live-c"):
        await shop_run(path, run_id, {"item": run_id}, deliver=False)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("actions") / "runs.db"
    run_async(_populate(path))
    return path


@pytest.fixture(scope="module")
def operator_base(store_path: Path) -> Iterator[str]:
    with serving(
        f"sqlite:///{store_path}", "--allow-actions", "--runtime", "tests.support.ui_support:Shop"
    ) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from chromium()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    opened = context.new_page()
    yield opened
    context.close()


def _status(base: str, run_id: str) -> str:
    status, body, _ = get(f"{base}/api/head?run_id={run_id}")
    assert status == 200, body
    found: str = json.loads(body)["status"]
    return found


def test_without_the_flag_there_are_no_actions(page: Page, store_path: Path) -> None:
    before = data_digest(store_path)
    with serving(f"sqlite:///{store_path}") as base:
        page.goto(f"{base}/runs/live-a")
        page.wait_for_selector("#details[data-status]")
        assert page.locator("#actions").count() == 0
        assert page.locator("form").count() == 0
        assert page.locator("header .note").inner_text() == "read-only"
        refused = page.request.post(
            f"{base}/actions/cancel",
            form={"run_id": "live-a"},
            headers={"Origin": base},
        )
        assert refused.status in (404, 405)
        assert _status(base, "live-a") == "running"
    assert data_digest(store_path) == before


def test_deliver_resume_and_cancel_from_a_runs_page(page: Page, operator_base: str) -> None:
    page.goto(f"{operator_base}/runs/live-a")
    assert page.locator("header .note").inner_text() == "operator actions on"
    deliver = page.locator("#action-deliver")
    deliver.locator('input[name="token"]').fill(token_for("live-a"))
    deliver.locator('textarea[name="payload"]').fill('{"tracking": "BY-HAND"}')
    deliver.locator('input[name="delivery_id"]').fill("d-hand")
    deliver.locator("button").click()
    page.wait_for_url(f"{operator_base}/runs/live-a")
    page.wait_for_selector("#details[data-status]")
    assert "BY-HAND" in page.locator("#hooks").inner_text()
    assert page.locator("#run-status").inner_text() == "running"  # delivered, not yet driven
    page.locator("#action-resume button").click()
    page.wait_for_url(f"{operator_base}/runs/live-a")
    assert page.locator("#run-status").inner_text() == "completed"
    page.wait_for_selector("#details[data-status]")
    assert "BY-HAND" in page.locator("#run-output").inner_text()
    assert page.locator("#actions").count() == 0  # an ended run offers none

    page.goto(f"{operator_base}/runs/live-b")
    page.locator('#action-cancel input[name="reason"]').fill("<b>by hand</b>")
    page.locator("#action-cancel button").click()
    page.wait_for_url(f"{operator_base}/runs/live-b")
    assert page.locator("#run-status").inner_text() == "cancelled"
    page.wait_for_selector("#details[data-status]")
    assert "<b>by hand</b>" in page.locator("#history").inner_text()  # the reason, as text


def test_a_refused_action_names_why(page: Page, operator_base: str) -> None:
    page.goto(f"{operator_base}/runs/live-c")
    deliver = page.locator("#action-deliver")
    deliver.locator('input[name="token"]').fill("not-a-token")
    deliver.locator("button").click()
    assert "hook" in page.locator(".error-message").inner_text().lower()
    assert _status(operator_base, "live-c") == "running"


@pytest.fixture
def attacker(tmp_path: Path, operator_base: str) -> Iterator[str]:
    """Another origin (a page on another port of this machine) with a form aimed at the
    inspector's cancel action, as a malicious site would serve it."""
    (tmp_path / "evil.html").write_text(
        f'<form method="post" action="{operator_base}/actions/cancel">'
        '<input type="hidden" name="run_id" value="live-c">'
        '<input type="hidden" name="csrf" value="guessed">'
        '<button id="go" type="submit">win a prize</button></form>'
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_forged_cross_origin_post_is_refused(
    page: Page, operator_base: str, attacker: str
) -> None:
    page.goto(f"{operator_base}/runs/live-c")  # the operator's browser holds a session
    assert page.locator("#action-cancel").count() == 1
    page.goto(f"{attacker}/evil.html")
    with page.expect_navigation():
        page.locator("#go").click()
    assert "refused" in page.content()
    assert _status(operator_base, "live-c") == "running"


def test_a_same_origin_post_without_the_sessions_token_is_refused(
    page: Page, operator_base: str
) -> None:
    page.goto(f"{operator_base}/runs/live-c")
    token = page.locator('#action-cancel input[name="csrf"]').get_attribute("value")
    assert token
    forms: list[dict[str, str | float | bool]] = [
        {"run_id": "live-c"},
        {"run_id": "live-c", "csrf": token[::-1]},
    ]
    for form in forms:
        refused = page.request.post(
            f"{operator_base}/actions/cancel", form=form, headers={"Origin": operator_base}
        )
        assert refused.status == 403
        assert "refused" in refused.text()
    other = page.context.browser
    assert other is not None
    stranger = other.new_context()  # another session cannot use this one's token
    try:
        refused = stranger.request.post(
            f"{operator_base}/actions/cancel",
            form={"run_id": "live-c", "csrf": token},
            headers={"Origin": operator_base},
        )
        assert refused.status == 403
    finally:
        stranger.close()
    assert _status(operator_base, "live-c") == "running"
