"""An order service on runfold.flow: what a DBOS user ports on the first day.

Checkout prices an order with two steps at once, charges it (retried, under a key the payment
provider deduplicates by), waits up to 24 hours for the provider's webhook and refunds when it
does not come, then fulfils each order line as a child workflow, which waits for the warehouse's
"packed" message. Each order has a two-day deadline. A web app starts orders, takes the webhooks
and the warehouse's messages, and shows an order's progress and result; `worker` processes run
the workflows: `python order_service.py STORE_URL worker` and `... STORE_URL web PORT`. The
payment provider and the warehouse are stand-ins that append what they are asked to a ledger
file (`ORDERS_LEDGER`), as a real API would keep it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from typing import Any

from runfold.flow import (
    Flow,
    current_step,
    recv,
    report_progress,
    set_attributes,
    start_child,
    step,
    workflow,
    workflow_info,
)
from runfold.kernel import RetryPolicy, RunNotFound
from runfold.stores import open_store

PAYMENT_RETRY = RetryPolicy(max_attempts=5, initial_interval=timedelta(seconds=2))
WEBHOOK_WAIT = timedelta(hours=24)
ORDER_DEADLINE = timedelta(days=2)


# --- the outside world: a payment provider and a warehouse ----------------------------------


def ledger(**entry: Any) -> None:
    """Append what the outside world was asked to do, durably (the side effect)."""
    with open(os.environ.get("ORDERS_LEDGER", "orders-ledger.jsonl"), "a") as file:
        file.write(json.dumps(entry) + "\n")
        file.flush()
        os.fsync(file.fileno())


def quote_tax(country: str, amount: int) -> int:
    return amount * {"FR": 20, "DE": 19}.get(country, 0) // 100


def score_fraud(customer: str, amount: int) -> float:
    return 0.99 if customer.startswith("fraud") else min(amount / 100_000, 0.5)


def charge(order_id: str, amount: int) -> str:
    key = current_step().idempotency_key  # the same on every attempt: one charge per key
    ledger(op="charge", order=order_id, amount=amount, key=key)
    return "ch_" + key.replace("/", "_")


def refund(order_id: str, charge_id: str, amount: int) -> None:
    ledger(op="refund", order=order_id, charge=charge_id, key=current_step().idempotency_key)


def reserve(sku: str, quantity: int) -> str:
    ledger(op="reserve", sku=sku, quantity=quantity, key=current_step().idempotency_key)
    return f"res-{sku}"


def ship(reservation: str, box: str) -> str:
    ledger(op="ship", reservation=reservation, box=box, key=current_step().idempotency_key)
    return f"parcel-{reservation}"


# --- the workflows -----------------------------------------------------------------------------


@workflow(name="orders.line")
async def fulfil_line(line: dict[str, Any]) -> str:
    reservation = await step(reserve, line["sku"], line["quantity"])
    box = await recv("packed")  # the warehouse's message, from another process
    parcel: str = await step(ship, reservation, box)
    return parcel


@workflow(name="orders.checkout")
async def checkout(order: dict[str, Any]) -> dict[str, Any]:
    order_id = workflow_info().run_id
    await set_attributes({"customer": order["customer"]})
    await report_progress(0, total=3, message="pricing")
    amount = sum(line["price"] * line["quantity"] for line in order["lines"])
    tax, risk = await asyncio.gather(
        step(quote_tax, order["country"], amount), step(score_fraud, order["customer"], amount)
    )
    if risk > 0.9:
        return {"status": "rejected"}
    await report_progress(1, total=3, message="paying")
    charge_id = await step(charge, order_id, amount + tax, retry=PAYMENT_RETRY)
    paid = await recv("payment", timeout=WEBHOOK_WAIT)  # the provider's webhook
    if paid != "succeeded":
        await step(refund, order_id, charge_id, amount + tax)
        return {"status": "refunded", "charge": charge_id}
    await report_progress(2, total=3, message="fulfilling")
    lines = [  # one child per line, at an id the warehouse can address: `<order>/line-<n>`
        await start_child(fulfil_line, line, run_id=f"{order_id}/line-{n}")
        for n, line in enumerate(order["lines"])
    ]
    parcels = [await line.result() for line in lines]
    await report_progress(3, total=3, message="shipped")
    return {"status": "shipped", "charge": charge_id, "parcels": parcels}


# --- the web app: any process, serving workflows or not -----------------------------------------


def web(flow: Flow) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def place(request: Request) -> JSONResponse:
        order = await request.json()
        run = await flow.start(
            checkout, order, run_id=order["id"], timeout=ORDER_DEADLINE, queued=True
        )
        return JSONResponse({"order": run.run_id, "status": run.status}, status_code=202)

    async def show(request: Request) -> JSONResponse:
        run = await flow.result(request.path_params["order_id"])
        progress = list(run.snapshot.progress.values())
        latest = progress[-1].message if progress else None
        return JSONResponse({"status": run.status, "progress": latest, "result": run.output})

    async def payment_webhook(request: Request) -> JSONResponse:
        event = await request.json()
        await flow.send(
            event["order"], event["status"], topic="payment", idempotency_key=event["id"]
        )
        return JSONResponse({"received": event["id"]})

    async def packed(request: Request) -> JSONResponse:
        event = await request.json()  # the line's run: `<order id>/line-<n>`
        await flow.send(event["line"], event["box"], topic="packed", idempotency_key=event["id"])
        return JSONResponse({"received": event["id"]})

    return Starlette(  # an order (or a line) not placed yet is a 404, not a 500
        exception_handlers={RunNotFound: lambda _, exc: JSONResponse({"error": str(exc)}, 404)},
        routes=[
            Route("/orders", place, methods=["POST"]),
            Route("/orders/{order_id}", show),
            Route("/webhooks/payment", payment_webhook, methods=["POST"]),
            Route("/warehouse/packed", packed, methods=["POST"]),
        ],
    )


async def main(store_url: str, role: str, port: int = 8000) -> None:
    async with await open_store(store_url) as store:
        flow = Flow(store, [checkout, fulfil_line])
        if role == "worker":
            await flow.serve()
        else:
            import uvicorn

            await uvicorn.Server(uvicorn.Config(web(flow), port=port)).serve()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])))
