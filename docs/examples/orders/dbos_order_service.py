"""The order service of `order_service.py`, written with DBOS Transact: the version to port from.

Checkout prices an order with two steps at once, charges it (retried, under a key the payment
provider deduplicates by), waits up to 24 hours for the provider's webhook and refunds when it
does not come, then fulfils each order line as a child workflow, which waits for the warehouse's
"packed" message. Each order has a two-day deadline. A web app starts orders, takes the webhooks
and the warehouse's messages, and shows an order's progress and result; `worker` processes run
the workflows: `python dbos_order_service.py DATABASE_URL worker` and `... DATABASE_URL web PORT`
(a DBOS system database, `sqlite:///orders.db` or `postgresql://...`, whose tables the first
worker creates). The payment provider and the warehouse are stand-ins that append what they are
asked to a ledger file (`ORDERS_LEDGER`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from typing import Any

from dbos import (
    DBOS,
    DBOSClient,
    DBOSConfig,
    EnqueueOptions,
    SetWorkflowID,
    WorkflowHandleAsync,
    error,
)

WEBHOOK_WAIT = timedelta(hours=24)
ORDER_DEADLINE = timedelta(days=2)


# --- the outside world: a payment provider and a warehouse ----------------------------------


def ledger(**entry: Any) -> None:
    """Append what the outside world was asked to do, durably (the side effect)."""
    with open(os.environ.get("ORDERS_LEDGER", "orders-ledger.jsonl"), "a") as file:
        file.write(json.dumps(entry) + "\n")
        file.flush()
        os.fsync(file.fileno())


def step_key() -> str:  # the same on every attempt of a step: one side effect per key
    return f"{DBOS.workflow_id}/{DBOS.step_id}"


@DBOS.step()
async def quote_tax(country: str, amount: int) -> int:
    return amount * {"FR": 20, "DE": 19}.get(country, 0) // 100


@DBOS.step()
async def score_fraud(customer: str, amount: int) -> float:
    return 0.99 if customer.startswith("fraud") else min(amount / 100_000, 0.5)


@DBOS.step(retries_allowed=True, max_attempts=5, interval_seconds=2)  # the payment retry
async def charge(order_id: str, amount: int) -> str:
    key = step_key()
    ledger(op="charge", order=order_id, amount=amount, key=key)
    return "ch_" + key.replace("/", "_")


@DBOS.step()
async def refund(order_id: str, charge_id: str, amount: int) -> None:
    ledger(op="refund", order=order_id, charge=charge_id, key=step_key())


@DBOS.step()
async def reserve(sku: str, quantity: int) -> str:
    ledger(op="reserve", sku=sku, quantity=quantity, key=step_key())
    return f"res-{sku}"


@DBOS.step()
async def ship(reservation: str, box: str) -> str:
    ledger(op="ship", reservation=reservation, box=box, key=step_key())
    return f"parcel-{reservation}"


# --- the workflows -----------------------------------------------------------------------------


@DBOS.workflow(name="orders.line")
async def fulfil_line(line: dict[str, Any]) -> str:
    reservation = await reserve(line["sku"], line["quantity"])
    box = await DBOS.recv_async("packed", timeout_seconds=ORDER_DEADLINE.total_seconds())
    return await ship(reservation, box)


@DBOS.workflow(name="orders.checkout")
async def checkout(order: dict[str, Any]) -> dict[str, Any]:
    order_id = DBOS.workflow_id
    assert order_id is not None
    await DBOS.update_workflow_attributes_async(order_id, {"customer": order["customer"]})
    await DBOS.set_event_async("progress", "pricing")
    amount = sum(line["price"] * line["quantity"] for line in order["lines"])
    tax, risk = await asyncio.gather(
        quote_tax(order["country"], amount), score_fraud(order["customer"], amount)
    )
    if risk > 0.9:
        return {"status": "rejected"}
    await DBOS.set_event_async("progress", "paying")
    charge_id = await charge(order_id, amount + tax)
    paid = await DBOS.recv_async("payment", timeout_seconds=WEBHOOK_WAIT.total_seconds())
    if paid != "succeeded":
        await refund(order_id, charge_id, amount + tax)
        return {"status": "refunded", "charge": charge_id}
    await DBOS.set_event_async("progress", "fulfilling")
    lines = []
    for n, line in enumerate(order["lines"]):  # one child per line, at `<order>/line-<n>`
        with SetWorkflowID(f"{order_id}/line-{n}"):
            lines.append(await DBOS.start_workflow_async(fulfil_line, line))
    parcels = [await line.get_result() for line in lines]
    await DBOS.set_event_async("progress", "shipped")
    return {"status": "shipped", "charge": charge_id, "parcels": parcels}


# --- the web app: a DBOS client, in any process ------------------------------------------------


def web(client: DBOSClient) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def place(request: Request) -> JSONResponse:
        order = await request.json()
        options: EnqueueOptions = {
            "queue_name": "orders",
            "workflow_name": "orders.checkout",
            "workflow_id": order["id"],
            "workflow_timeout": ORDER_DEADLINE.total_seconds(),
        }
        handle: WorkflowHandleAsync[dict[str, Any]] = await client.enqueue_async(options, order)
        status = await handle.get_status()
        return JSONResponse({"order": order["id"], "status": status.status}, status_code=202)

    async def show(request: Request) -> JSONResponse:
        order_id = request.path_params["order_id"]
        status = await (await client.retrieve_workflow_async(order_id)).get_status()
        latest = await client.get_event_async(order_id, "progress", timeout_seconds=0)
        return JSONResponse({"status": status.status, "progress": latest, "result": status.output})

    async def payment_webhook(request: Request) -> JSONResponse:
        event = await request.json()
        await client.send_async(event["order"], event["status"], "payment", event["id"])
        return JSONResponse({"received": event["id"]})

    async def packed(request: Request) -> JSONResponse:
        event = await request.json()  # the line's workflow: `<order id>/line-<n>`
        await client.send_async(event["line"], event["box"], "packed", event["id"])
        return JSONResponse({"received": event["id"]})

    missing = error.DBOSNonExistentWorkflowError  # an order (or a line) not placed yet: a 404
    return Starlette(
        exception_handlers={missing: lambda _, exc: JSONResponse({"error": str(exc)}, 404)},
        routes=[
            Route("/orders", place, methods=["POST"]),
            Route("/orders/{order_id}", show),
            Route("/webhooks/payment", payment_webhook, methods=["POST"]),
            Route("/warehouse/packed", packed, methods=["POST"]),
        ],
    )


async def main(database_url: str, role: str, port: int = 8000) -> None:
    if role == "worker":
        config: DBOSConfig = {"name": "orders", "system_database_url": database_url}
        DBOS(config=config)
        DBOS.launch()  # recovers this worker's workflows
        await DBOS.register_queue_async("orders")  # then takes orders from the queue
        await asyncio.Event().wait()
    else:
        import uvicorn

        client = DBOSClient(system_database_url=database_url)
        await uvicorn.Server(uvicorn.Config(web(client), port=port)).serve()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])))
