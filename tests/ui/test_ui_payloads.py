"""Hostile payloads on the inspector's pages, served by a real `python -m runfold.ui`: JSON
nested 5,000 deep and a payload of megabytes give a page of bounded size, never a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runfold import CommandHandler
from runfold.commands import (
    CompleteStep,
    CreateHook,
    CreateRun,
    CreateStep,
    FailRun,
    ReceiveHook,
    RecordProgress,
    StartRun,
    StartStep,
)
from runfold.stores import SQLiteStore
from runfold.ui.payloads import MAX_JSON_DEPTH, SHOWN_LIMIT, show_payload
from tests.support.ui_support import get, serve

DEEP = ("[" * 5000 + "]" * 5000).encode()
HUGE = json.dumps({"blob": "y" * 1_500_000}).encode()
BINARY = bytes(range(256)) * 8000
QUOTES = b'"<&' * 100_000
"""Text whose every character HTML-escapes to five: the worst case for a page's bytes."""
ROWS = 40


async def _populate(path: Path) -> None:
    store = await SQLiteStore.open(path)
    handler = CommandHandler(store)
    try:
        for run_id, payload in (("deep", DEEP), ("huge", HUGE), ("binary", BINARY)):
            create = CreateRun(workflow_name="wf", input=payload)
            await handler.execute(run_id, StartRun(create=create))
            await handler.execute(run_id, FailRun(error=payload))
        await handler.execute("rows", StartRun(create=CreateRun(workflow_name="wf", input=QUOTES)))
        for n in range(ROWS):
            step = f"step-{n:02d}"
            await handler.execute("rows", CreateStep(step_id=step, step_name="s", input=QUOTES))
            await handler.execute("rows", StartStep(step_id=step))
            await handler.execute("rows", CompleteStep(step_id=step, output=QUOTES))
            hook = f"hook-{n:02d}"
            hooked = CreateHook(hook_id=hook, token=f"token-{n}", metadata=QUOTES)
            await handler.execute("rows", hooked)
            for delivery in range(4):
                delivered = ReceiveHook(hook_id=hook, payload=QUOTES, delivery_id=f"d{delivery}")
                await handler.execute("rows", delivered)
            progress = RecordProgress(progress_id=f"p{n}", completed=1, message=QUOTES.decode())
            await handler.execute("rows", progress)
    finally:
        await store.close()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("payloads") / "runs.db"
    asyncio.run(_populate(path))
    yield from serve(f"sqlite:///{path}")


@pytest.mark.parametrize("run_id", ["deep", "huge", "binary"])
def test_a_hostile_payload_gives_a_bounded_page(base: str, run_id: str) -> None:
    status, body, _ = get(f"{base}/runs/{run_id}")
    assert status == 200, body[:500]
    assert len(body.encode()) < 1_000_000
    assert "cut: the payload is larger" in body or run_id == "deep"


@pytest.mark.parametrize(
    "path",
    ["/runs/rows", "/runs/rows?limit=500", "/runs/rows/details", "/runs/rows/events?limit=500"],
)
def test_rows_of_hostile_payloads_give_bounded_pages(base: str, path: str) -> None:
    status, body, _ = get(base + path)
    assert status == 200, body[:500]
    assert "&#34;&lt;&amp;" in body  # the payloads are there, escaped
    assert len(body.encode()) < 1_000_000


def test_deep_json_is_shown_as_text_and_long_forms_are_cut() -> None:
    deep = show_payload(DEEP)
    assert (deep.label, deep.size) == ("text", len(DEEP))
    nested = (b"[" * MAX_JSON_DEPTH) + (b"]" * MAX_JSON_DEPTH)
    assert show_payload(nested).label == "json"
    assert show_payload(b"[" + nested + b"]").label == "text"
    huge = show_payload(HUGE)
    assert huge.label == "json" and huge.size == len(HUGE)
    assert len(huge.text) < SHOWN_LIMIT + 100
    assert show_payload(BINARY).label == "base64" and len(show_payload(BINARY).text) < 20_000
