"""The workflows the `continue_as_new` and `set_event` tests run, module-level so that worker
subprocesses (`runfold worker --app tests.support.continuation_workflows`) import the same
definitions.
"""

from __future__ import annotations

from typing import Any

from runfold.flow import continue_as_new, recv, set_event, sleep, step, workflow, workflow_info

CHUNK = 100
"""Steps a `counter` run takes before it continues as new."""


async def add_one(n: int) -> int:
    return n + 1


@workflow(name="test-counter")
async def counter(state: dict[str, int]) -> dict[str, Any]:
    """Count from `n` to `target` one step at a time, `CHUNK` steps a run."""
    n, target = state["n"], state["target"]
    for _ in range(CHUNK):
        n = await step(add_one, n)
        if n >= target:
            info = workflow_info()
            return {"n": n, "generation": info.generation, "first": info.first_run_id}
    await continue_as_new({"n": n, "target": target})
    raise AssertionError("continue_as_new returned")


@workflow(name="test-publisher")
async def publisher(rounds: int) -> int:
    """Publish `stage` = 1..rounds, each after a message on `go`; then `done`."""
    for stage in range(1, rounds + 1):
        await recv("go")
        await set_event("stage", {"stage": stage})
    await set_event("done", True)
    return rounds


@workflow(name="test-slow-publisher")
async def slow_publisher(seconds: float) -> str:
    """Publish `ready` after a durable sleep of `seconds`, with no one else's help."""
    await sleep(seconds)
    await set_event("ready", {"after": seconds})
    return "published"
