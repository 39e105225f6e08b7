"""Three deploys of one order workflow, as plain functions: the deploy tests' code versions.

`order_v1` charges, sleeps an hour, ships; `order_v2` inserts a fraud check before the sleep,
behind `patched("fraud-check")`; `order_v2_unpatched` inserts it without. Each `deploy_app_*`
module registers one of them as `@workflow(name=ORDER)`, as an application's module would, for
the CLI (`--app`) in a subprocess; in-process the tests wrap them in `Workflow`s (`@workflow`
keeps one function per name in a process). Bodies append to a ledger: `LEDGER` in-process.
"""

from __future__ import annotations

from datetime import timedelta

from runfold.flow import Workflow, patched, sleep, step

ORDER = "deploy-order"
LEDGER: list[str] = []


def charge(order: str) -> str:
    LEDGER.append(f"charge {order}")
    return f"charged {order}"


def check_fraud(order: str) -> str:
    LEDGER.append(f"fraud {order}")
    return f"checked {order}"


def ship(order: str) -> str:
    LEDGER.append(f"ship {order}")
    return f"shipped {order}"


async def order_v1(order: str) -> list[str]:
    charged = await step(charge, order)
    await sleep(timedelta(hours=1))
    return [charged, await step(ship, order)]


async def order_v2(order: str) -> list[str]:
    charged = await step(charge, order)
    done = [charged]
    if await patched("fraud-check"):
        done.append(await step(check_fraud, order))
    await sleep(timedelta(hours=1))
    return [*done, await step(ship, order)]


async def order_v2_unpatched(order: str) -> list[str]:
    charged = await step(charge, order)
    checked = await step(check_fraud, order)
    await sleep(timedelta(hours=1))
    return [charged, checked, await step(ship, order)]


V1 = Workflow(name=ORDER, fn=order_v1)
V2 = Workflow(name=ORDER, fn=order_v2)
V2_UNPATCHED = Workflow(name=ORDER, fn=order_v2_unpatched)
