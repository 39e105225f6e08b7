"""The DBOS twin of the order service (docs/examples/orders/dbos_order_service.py) runs.

It imports and registers its workflows, and serves an order to its end, and a declined one to
its refund, on DBOS's SQLite system database, in this process; and its worker and web app, each
in its own process, carry an order from `POST /orders` to its result: the twin the order
service's length is measured against (tests/flow/test_order_service.py) is a working service,
not a sketch.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dbos", reason="the DBOS twin needs dbos (the bench extra)")

from dbos import DBOS, DBOSConfig, SetWorkflowID, error

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "examples" / "orders"))
import dbos_order_service as twin  # noqa: E402

from tests.support.ui_support import free_port  # noqa: E402

pytestmark = pytest.mark.slow

ORDER = {
    "customer": "ada",
    "country": "FR",
    "lines": [
        {"sku": "lamp", "quantity": 1, "price": 3000},
        {"sku": "desk", "quantity": 2, "price": 12000},
    ],
}


def test_the_twin_registers_its_workflows_and_steps() -> None:
    from dbos._registrations import get_dbos_func_name

    names = {get_dbos_func_name(fn) for fn in (twin.checkout, twin.fulfil_line)}
    assert names == {"orders.checkout", "orders.line"}


@pytest.fixture
def launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("ORDERS_LEDGER", str(path))
    config: DBOSConfig = {
        "name": "orders-h38-test",
        "system_database_url": f"sqlite:///{tmp_path / 'dbos.sqlite'}",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        yield path
    finally:
        DBOS.destroy(destroy_registry=False)


async def send_once_there(run_id: str, message: str, topic: str) -> None:
    for _ in range(300):  # the warehouse's way: a line not started yet is refused
        try:
            return await DBOS.send_async(run_id, message, topic)
        except error.DBOSNonExistentWorkflowError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{run_id} never started")


def ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_the_twin_ships_an_order(launched: Path) -> None:
    with SetWorkflowID("d1"):
        order = await DBOS.start_workflow_async(twin.checkout, {"id": "d1", **ORDER})
    assert await DBOS.get_event_async("d1", "progress", timeout_seconds=30) is not None
    await DBOS.send_async("d1", "succeeded", "payment", idempotency_key="evt-1")
    for n in range(2):
        await send_once_there(f"d1/line-{n}", f"box-{n}", "packed")
    result = await order.get_result()
    assert result["status"] == "shipped"
    assert result["parcels"] == ["parcel-res-lamp", "parcel-res-desk"]
    assert await DBOS.get_event_async("d1", "progress", timeout_seconds=0) == "shipped"
    ops = [entry["op"] for entry in ledger(launched)]
    assert sorted(ops) == ["charge", "reserve", "reserve", "ship", "ship"]


async def test_the_twin_refunds_a_declined_payment(launched: Path) -> None:
    with SetWorkflowID("d2"):
        order = await DBOS.start_workflow_async(twin.checkout, {"id": "d2", **ORDER})
    await DBOS.send_async("d2", "declined", "payment")
    result = await order.get_result()
    assert result["status"] == "refunded"
    charged, refunded = ledger(launched)
    assert (charged["op"], refunded["op"], refunded["charge"]) == (
        "charge",
        "refund",
        result["charge"],
    )


def call(base: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(base + path, data=data), timeout=30) as r:
        return json.loads(r.read())


def until(check: Any, what: str) -> Any:
    for _ in range(600):
        try:
            found = check()
        except urllib.error.HTTPError as refused:  # not there yet: a 404
            refused.close()
            found = None
        except OSError:  # the web app is not listening yet
            found = None
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def test_the_twins_worker_and_web_app_serve_an_order(tmp_path: Path) -> None:
    url, port = f"sqlite:///{tmp_path / 'dbos.sqlite'}", free_port()
    env = {"ORDERS_LEDGER": str(tmp_path / "ledger.jsonl"), "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "processes.log").open("wb")
    started = []
    try:
        for role in (["worker"], ["web", str(port)]):  # the worker creates DBOS's tables
            started.append(
                subprocess.Popen(
                    [sys.executable, twin.__file__, url, *role], env=env, stdout=log, stderr=log
                )
            )
            if role == ["worker"]:
                until(lambda: (tmp_path / "dbos.sqlite").exists(), "the worker made its tables")
        base = f"http://127.0.0.1:{port}"
        order = {"id": "w1", **ORDER}
        # Retried while the web app starts, or the worker's tables are not all there (a 500).
        placed = until(lambda: call(base, "/orders", order), "the web app took the order")
        assert placed == {"order": "w1", "status": "ENQUEUED"}
        until(lambda: call(base, "/orders/w1")["progress"] == "paying", "charged")
        call(base, "/webhooks/payment", {"id": "evt-1", "order": "w1", "status": "succeeded"})
        for n in range(2):
            packed = {"id": f"p{n}", "line": f"w1/line-{n}", "box": "b"}
            until(lambda packed=packed: call(base, "/warehouse/packed", packed), "line started")
        shown = until(
            lambda: (s := call(base, "/orders/w1"))["status"] == "SUCCESS" and s, "shipped"
        )
        assert shown["progress"] == "shipped"
        assert shown["result"]["parcels"] == ["parcel-res-lamp", "parcel-res-desk"]
    finally:
        for process in started:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
