"""What the web inspector's browser tests share: a workflow runtime, a store of runs made by the
engine, the inspector served by a real `python -m runfold.ui` subprocess, and a headless Chromium.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from playwright.sync_api import Browser, Dialog, Page, ViewportSize, sync_playwright

from runfold import CommandHandler
from runfold.engine import (
    AwaitHook,
    Complete,
    Engine,
    Fail,
    ReportProgress,
    RuntimeDecision,
    ScheduleStep,
    ScheduleSteps,
    StepFailure,
    StepInvocation,
    WaitUntil,
    WorkflowInvocation,
)
from runfold.events import RetryPolicy
from runfold.stores import SQLiteStore

CHROMIUM = os.environ.get("RUNFOLD_TEST_CHROMIUM", "/usr/bin/chromium")
"""The browser the tests drive (`scripts/ensure-chromium.sh` installs it)."""
SHOP = "shop"
BULK = "bulk"
TOKEN_PREFIX = "hooktoken-SECRET-"
HOSTILE = "<script>window.__pwned=1</script>"
HOSTILE_ATTR = '"><img src=x onerror="window.__pwned=1">'
T = TypeVar("T")
RETRY = RetryPolicy(max_attempts=3, initial_interval=timedelta(milliseconds=5))


def run_async(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to its end on its own thread's event loop: playwright's sync API keeps one
    running on the test's thread, where `asyncio.run` refuses to start another."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work).result()


def token_for(run_id: str) -> str:
    """The hook token a shop run waits on: a secret no page may show."""
    return TOKEN_PREFIX + hashlib.sha256(run_id.encode()).hexdigest()[:12]


class Shop:
    """The tests' runtime: two steps (the charge fails once and is retried), progress, a timer,
    a hook, then completion; `{"fail": …}` fails at once, `{"binary": true}` ends with bytes."""

    workflow_names = (SHOP, BULK)

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        run = invocation.snapshot
        order = json.loads(run.input)
        if run.workflow_name == BULK:
            return Complete(output=json.dumps({"n": order["n"]}).encode())
        if "fail" in order:
            return Fail(error=order["fail"].encode(), error_code="refused")
        if "binary" in order:
            return Complete(output=bytes(range(0, 256, 9)))
        steps = [run.steps.get(s) for s in ("reserve", "charge")]
        if not all(s is not None and s.status == "completed" for s in steps):
            return ScheduleSteps(
                steps=[
                    ScheduleStep(step_id=s, step_name=s, input=run.input, retry=RETRY)
                    for s in ("reserve", "charge")
                ]
            )
        if "paid" not in run.progress:
            return ReportProgress(progress_id="paid", completed=1, total=2, message="charged")
        cool_off = run.waits.get("cool-off")
        if cool_off is None or cool_off.status == "waiting":
            charged = run.steps["charge"].completed_at
            assert charged is not None
            return WaitUntil(wait_id="cool-off", resume_at=charged + timedelta(milliseconds=20))
        shipped = run.hooks.get("shipped")
        if shipped is None or not shipped.deliveries:
            return AwaitHook(hook_id="shipped", token=token_for(run.run_id))
        return Complete(output=shipped.deliveries[0].payload)

    async def run_step(self, invocation: StepInvocation) -> bytes:
        if invocation.step_name == "charge" and invocation.attempt == 1:
            raise StepFailure(b"gateway timed out", code="timeout")
        return json.dumps({"done": invocation.step_name}).encode()


async def shop_run(
    path: Path,
    run_id: str,
    order: dict[str, object],
    *,
    deliver: bool,
    attributes: dict[str, str] | None = None,
    parent: str | None = None,
) -> None:
    """Run a shop order on the store at `path` until it ends, or waits on its hook if not
    `deliver`."""
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store)
        engine = Engine(handler, Shop())
        run = await engine.start(
            SHOP,
            json.dumps(order).encode(),
            run_id=run_id,
            attributes=attributes,
            parent_run_id=parent,
        )
        while not run.is_terminal:
            hook = run.hooks.get("shipped")
            if hook is not None and hook.status == "active":
                if not deliver:
                    return
                payload = json.dumps({"tracking": "ZX81"}).encode()
                run = await engine.deliver(token_for(run_id), payload, delivery_id="d-1")
                continue
            due = min((w.due_at for w in run.wakeups()), default=None)
            assert due is not None, f"run {run_id} waits for nothing ({run.status})"
            await asyncio.sleep(max(0.0, (due - handler.clock()).total_seconds()))
            await engine.resume_due()
            run = await handler.snapshot(run_id)


async def deliver_hook(path: Path, run_id: str) -> None:
    """Deliver the shop run's hook from outside the inspector, as a host would."""
    async with await SQLiteStore.open(path) as store:
        engine = Engine(CommandHandler(store), Shop())
        await engine.deliver(token_for(run_id), b'{"tracking": "LIVE-1"}', delivery_id="d-live")


async def bulk_runs(path: Path, count: int) -> list[str]:
    """`count` runs of the bulk workflow, each completed at once; their ids, oldest first."""
    async with await SQLiteStore.open(path) as store:
        engine = Engine(CommandHandler(store), Shop())
        ids = []
        for n in range(count):
            run = await engine.start(BULK, json.dumps({"n": n}).encode(), run_id=f"bulk-{n:02d}")
            ids.append(run.run_id)
        return ids


def data_digest(path: Path) -> str:
    """A digest of the SQLite file's data (schema and rows), not of its bytes on disk."""
    with sqlite3.connect(path) as conn:
        dump = "\n".join(conn.iterdump())
    conn.close()
    return hashlib.sha256(dump.encode()).hexdigest()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve(store_url: str) -> Iterator[str]:
    """Run `python -m runfold.ui` on a free loopback port; yield its base URL, then stop it."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "runfold.ui", "--store", store_url, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(base + "/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    _, err = process.communicate()
                    raise AssertionError(f"the inspector did not start: {err.decode()}") from None
                time.sleep(0.05)
        yield base
    finally:
        process.terminate()
        process.communicate(timeout=10)


def get(url: str) -> tuple[int, str, dict[str, str]]:
    """GET `url`: status, body and headers (error statuses too)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def chromium() -> Iterator[Browser]:
    """A headless Chromium (`CHROMIUM`) for a module's page tests, closed afterwards."""
    assert Path(CHROMIUM).exists(), f"no browser at {CHROMIUM}: run scripts/ensure-chromium.sh"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


def checked_page(
    browser: Browser, base: str, viewport: ViewportSize | None = None
) -> Iterator[Page]:
    """A page of a fresh browser context on `base`, closed afterwards, for a page fixture to
    `yield from`: the test fails if the page opened a dialog (dismissed; a hostile payload's
    `alert` among them) or one of its scripts threw meanwhile."""
    context = (
        browser.new_context(base_url=base)
        if viewport is None
        else browser.new_context(base_url=base, viewport=viewport)
    )
    opened = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    opened.on("dialog", on_dialog)
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert dialogs == [], f"a page opened a dialog: {dialogs}"
    assert errors == [], f"a page's script failed: {errors}"
