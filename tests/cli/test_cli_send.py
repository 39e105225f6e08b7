"""`runfold send RUN_ID MESSAGE`: a message for a `runfold.flow` workflow's `recv`, recorded by
the real command line in a SQLite file; the workflow, driven afterwards, receives it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runfold.flow import Flow, recv, workflow
from runfold.stores import SQLiteStore
from tests.support.cli_support import ok, one_line_error, runfold_cli


@workflow(name="test-cli-inbox")
async def cli_inbox(_: None) -> list[Any]:
    return [await recv("orders"), await recv("orders"), await recv()]


async def _start(path: Path, run_id: str) -> None:
    async with await SQLiteStore.open(path) as store:
        await Flow(store, [cli_inbox]).start(cli_inbox, None, run_id=run_id)


async def _finish(path: Path, run_id: str) -> tuple[str, Any]:
    async with await SQLiteStore.open(path) as store:
        flow = Flow(store, [cli_inbox])
        await flow.recover()  # a worker starting up drives every live run once
        done = await flow.result(run_id)
        return done.status, done.output


def test_sent_messages_reach_the_workflows_recv(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    asyncio.run(_start(path, "inbox-1"))
    shown = ok(runfold_cli("send", "inbox-1", "lamp", "--topic", "orders", "--store", url))
    assert shown.startswith("sent to run inbox-1 on topic orders")
    again = ["send", "inbox-1", "[1, 2]", "--value", "--topic", "orders"]
    ok(runfold_cli(*again, "--idempotency-key", "k", "--store", url))
    repeated = ok(runfold_cli(*again, "--idempotency-key", "k", "--store", url))
    assert "already sent: nothing changed" in repeated
    ok(runfold_cli("send", "inbox-1", "plain", "--store", url))
    assert asyncio.run(_finish(path, "inbox-1")) == ("completed", ["lamp", [1, 2], "plain"])
    ended = runfold_cli("send", "inbox-1", "late", "--store", url)
    assert "ended" in one_line_error(ended, 1) or "terminal" in ended.stderr


def test_send_refuses_an_unknown_run_and_bad_json(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    asyncio.run(_start(path, "inbox-2"))
    assert "nope" in one_line_error(runfold_cli("send", "nope", "x", "--store", url), 3)
    bad = runfold_cli("send", "inbox-2", "{not json", "--value", "--store", url)
    assert "not JSON" in one_line_error(bad, 2)
