"""Workflows the runfold.flow tests share: the order workflow and a long chain of steps.

Module-level so a subprocess (the SIGKILL test) imports the very same definitions. Their names
start with `test-`: the docs' examples, run in the same process, define an `order` of their own,
and one process holds one function per workflow name (`DuplicateWorkflow`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runfold.flow import current_step, sleep, step, wait_for_event, workflow
from runfold.kernel import RetryPolicy

PAYMENT_RETRY = RetryPolicy(max_attempts=5, initial_interval=timedelta(seconds=1))
STEP_RETRY = RetryPolicy(max_attempts=5)
"""More attempts than the faults a test's schedule holds: a step whose last attempt a crash
interrupts fails (the engine never runs a step past its policy), so every step must outlast
the crashes a test throws at it to end as a clean run does."""


def reserve(items: list[str]) -> str:
    return f"reservation-{len(items)}"


def charge(order_id: str, amount: int) -> dict[str, Any]:
    """Declines the first attempt of every order: the retry policy carries it."""
    attempt = current_step().attempt
    if attempt == 1:
        raise RuntimeError("card declined, try again")
    # The key would go to the payment API: the same on every attempt, so it charges once.
    running = current_step()
    assert running.idempotency_key == f"{running.run_id}/{running.step_id}"
    return {"charged": amount}


async def ship(order_id: str) -> str:
    return f"parcel-{order_id}"


@workflow(name="test-order")
async def order(o: dict[str, Any]) -> dict[str, Any]:
    reservation = await step(reserve, o["items"], retry=STEP_RETRY)
    payment = await step(charge, o["id"], o["amount"], retry=PAYMENT_RETRY)
    await sleep(timedelta(hours=1))  # a cooling-off period, durable
    approval = await wait_for_event("approval", token=f"approve-{o['id']}")
    if approval != "yes":
        return {"order": o["id"], "status": "rejected"}
    parcel = await step(ship, o["id"], retry=STEP_RETRY)
    return {"order": o["id"], "reservation": reservation, "payment": payment, "parcel": parcel}


def add(a: int, b: int) -> int:
    return a + b


@workflow(name="test-chain")
async def chain(n: int) -> int:
    total = 0
    for i in range(n):
        total = await step(add, total, i, retry=STEP_RETRY)
    return total
