"""Bad arguments to `claim_due`, `hold_dedup` and `Queue` are refused with `InvalidArgument`,
before anything is held, on every store."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from runfold.conformance.builders import write
from runfold.kernel import InvalidArgument, RunCreated
from runfold.stores import DueWork, EventStore
from runfold.stores.due_work import Queue
from tests.conftest import T0

HOLD = T0 + timedelta(seconds=30)
GOOD: dict[str, Any] = {"hold_until": HOLD, "limit": 10}


@pytest.mark.parametrize(
    ("worker", "now", "changes", "argument"),
    [
        ("", T0, {}, "worker_id"),
        ("w\x00", T0, {}, "worker_id"),
        (7, T0, {}, "worker_id"),
        ("w", datetime(2026, 1, 1), {}, "now"),  # naive
        ("w", T0, {"hold_until": "soon"}, "hold_until"),
        ("w", T0, {"limit": True}, "limit"),
        ("w", T0, {"limit": 2**64}, "limit"),
        ("w", T0, {"workflow_names": "wf"}, "workflow_names"),
        ("w", T0, {"queues": "emails"}, "queues"),
        ("w", T0, {"queues": ["emails"]}, "queues"),
        ("w", T0, {"queues": [Queue(name="q"), Queue(name="q", concurrency=2)]}, "queues"),
    ],
)
async def test_claim_due_refuses_bad_arguments_and_holds_nothing(
    store: EventStore, worker: Any, now: Any, changes: dict[str, Any], argument: str
) -> None:
    assert isinstance(store, DueWork)
    await write(store, "r", RunCreated(workflow_name="wf", input=b""))
    with pytest.raises(InvalidArgument) as refused:
        await store.claim_due(worker, now, **{**GOOD, **changes})
    assert refused.value.argument == argument
    found = await store.claim_due("w", T0, hold_until=HOLD, limit=10)
    assert [(d.run_id, d.reason) for d in found] == [("r", "queued")], "a refused call held it"


@pytest.mark.parametrize(
    ("arguments", "argument"),
    [
        (("", "d", "r"), "queue_name"),
        (("q", "", "r"), "dedup_id"),
        (("q", "d", None), "run_id"),
        (("q", "d\ud800", "r"), "dedup_id"),
    ],
)
async def test_hold_dedup_refuses_bad_arguments(
    store: EventStore, arguments: tuple[Any, ...], argument: str
) -> None:
    assert isinstance(store, DueWork)
    with pytest.raises(InvalidArgument) as refused:
        await store.hold_dedup(*arguments, now=T0)
    assert refused.value.argument == argument
    assert await store.hold_dedup("q", "d", "r", now=T0)


@pytest.mark.parametrize(
    ("fields", "argument"),
    [
        ({"name": ""}, "name"),
        ({"name": 3}, "name"),
        ({"name": "q", "concurrency": 0}, "concurrency"),
        ({"name": "q", "worker_concurrency": -1}, "worker_concurrency"),
        ({"name": "q", "rate_limit": 1.5}, "rate_limit"),
        ({"name": "q", "rate_limit": True}, "rate_limit"),
        ({"name": "q", "rate_period": timedelta(0)}, "rate_period"),
    ],
)
def test_a_queue_refuses_bad_limits(fields: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        Queue(**fields)
    assert refused.value.argument == argument
