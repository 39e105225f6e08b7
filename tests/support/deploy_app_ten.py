"""An application of ten steps for `runfold fork` and `runfold resume` in a subprocess.

Each step body appends `RUN_ID N` to the ledger file `$RUNFOLD_DEPLOY_LEDGER`, and step
`$RUNFOLD_DEPLOY_BROKEN` (if set) fails: the bug a deploy fixes.
"""

from __future__ import annotations

import os

from runfold import EventStore
from runfold.flow import Flow, step, workflow, workflow_info
from runfold.kernel import RetryPolicy

LEDGER_ENV = "RUNFOLD_DEPLOY_LEDGER"
BROKEN_ENV = "RUNFOLD_DEPLOY_BROKEN"


def effect(n: int) -> int:
    with open(os.environ[LEDGER_ENV], "a", encoding="utf-8") as ledger:
        ledger.write(f"{workflow_info().run_id} {n}\n")
    if os.environ.get(BROKEN_ENV) == str(n):
        raise RuntimeError(f"step {n} is broken")
    return n


@workflow(name="deploy-ten")
async def ten(_: object) -> int:
    total = 0
    for n in range(1, 11):
        total += await step(effect, n, name=f"s{n}", retry=RetryPolicy(max_attempts=1))
    return total


def flow(store: EventStore) -> Flow:
    """The runtime `runfold resume --runtime tests.support.deploy_app_ten:flow` drives runs with."""
    return Flow(store, [ten])
