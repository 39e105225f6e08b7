"""A child process for `tests/flow/test_flow_idempotency.py`: charges once, then dies or finishes.

Run as `python -m tests.support.flow_key_worker '<json arguments>'` from the repository root. It
opens the store (SQLite file or PostgreSQL schema) and recovers every live run; in the first
generation it starts run `pay`, whose `charge` step writes its idempotency key and attempt to
the ledger file (flushed to disk: the side effect), prints `charged` and hangs until the parent
SIGKILLs it, between the side effect and the step's outcome. A later generation's `charge`
writes its line and returns; the process prints the run's output and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from runfold.flow import Flow, current_step, step, workflow
from tests.support.child_workers import open_backend

ARGS: dict[str, Any] = json.loads(sys.argv[1]) if __name__ == "__main__" else {}


def charge(amount: int) -> str:
    running = current_step()
    with open(ARGS["ledger"], "a") as ledger:
        ledger.write(f"{running.idempotency_key} {running.attempt} {amount}\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    if ARGS["generation"] == 0:
        print("charged", flush=True)
        time.sleep(600)  # the parent kills the process here
    return f"charged {amount}"


@workflow(name="test-key-payment")
async def payment(amount: int) -> str:
    done: str = await step(charge, amount)
    return done


async def main() -> None:
    async with await open_backend(ARGS) as store:
        flow = Flow(store, [payment])
        await flow.recover()
        run = await flow.start(payment, 42, run_id="pay")
        print(json.dumps([run.status, run.output]), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
