"""The DBOS twin of the order service (docs/examples/orders/dbos_order_service.py) runs.

It imports and registers its workflows, and serves an order to its end, and a declined one to
its refund, on DBOS's SQLite system database, in this process: the twin the order service's
length is measured against (tests/flow/test_order_service.py) is a working service, not a
sketch.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dbos", reason="the DBOS twin needs dbos (the bench extra)")

from dbos import DBOS, DBOSConfig, SetWorkflowID, error

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "examples" / "orders"))
import dbos_order_service as twin  # noqa: E402

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
