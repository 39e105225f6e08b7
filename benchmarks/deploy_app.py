"""The application `runfold replay-check --app benchmarks.deploy_app` checks in the deploys
benchmark: a workflow of ten steps."""

from __future__ import annotations

from runfold.flow import step, workflow

STEPS = 10


async def _add(value: int) -> int:
    return value + 1


@workflow(name="bench-deploy-ten-steps")
async def ten_steps(start: int) -> int:
    value = start
    for _ in range(STEPS):
        value = await step(_add, value)
    return value
