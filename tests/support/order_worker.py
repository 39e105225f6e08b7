"""A child process for `tests/flow/test_order_service.py`: drives one order, or dies at a step.

Run as `python -m tests.support.order_worker '<json arguments>'` from the repository root. It opens
the store, recovers every live run and carries order `order` on: starts it (idempotent), sends the
payment webhook (`payment`, "succeeded" unless told; anything else refunds) and each line's
"packed" message (each once, by idempotency key), until it ends, then prints its output. With
`kill_at` naming a step, that step's body does its side effect (the ledger line) and the process
SIGKILLs itself before the outcome is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from runfold.flow import Flow
from runfold.kernel import RunNotFound, TerminalState
from runfold.stores import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples" / "orders"))
import order_service as service

ARGS: dict[str, Any] = json.loads(sys.argv[1]) if __name__ == "__main__" else {}


def dying(fn: Any) -> Any:
    @functools.wraps(fn)  # the same qualified name: the same step
    def body(*args: Any) -> Any:
        result = fn(*args)
        os.kill(os.getpid(), signal.SIGKILL)  # after the side effect, before its outcome
        return result

    return body


async def main() -> None:
    os.environ["ORDERS_LEDGER"] = ARGS["ledger"]
    if ARGS.get("kill_at"):
        name = ARGS["kill_at"]
        setattr(service, name, dying(getattr(service, name)))
    order, payment = ARGS["order"], ARGS.get("payment", "succeeded")
    async with await open_store(ARGS["store"]) as store:
        flow = Flow(store, [service.checkout, service.fulfil_line])
        await flow.recover()
        run = await flow.start(service.checkout, order, run_id=order["id"])
        for _ in range(50):
            if run.status not in ("pending", "running"):
                break
            with contextlib.suppress(TerminalState):
                await flow.send(order["id"], payment, topic="payment", idempotency_key="pay")
            for link in (await flow.result(order["id"])).snapshot.children.values():
                line = link.child_run_id or ""
                with contextlib.suppress(TerminalState, RunNotFound):
                    await flow.send(line, f"box-{line}", topic="packed", idempotency_key=line)
            run = await flow.result(order["id"])
        print(json.dumps([run.status, run.output]), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
