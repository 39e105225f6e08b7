"""`patched` and `deprecated_patch`: a deploy that inserts a step under runs in flight."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runfold import EventStore
from runfold.flow import (
    Flow,
    FlowNonDeterminism,
    Workflow,
    deprecated_patch,
    patched,
    step,
    workflow_info,
)
from runfold.flow.patches import patches_of
from tests.conftest import Clock
from tests.support.deploy_versions import LEDGER, V1, V2, V2_UNPATCHED, check_fraud

order_v1, order_v2, order_v2_unpatched = V1, V2, V2_UNPATCHED


async def test_in_flight_runs_keep_the_old_branch_new_runs_take_the_new(
    store: EventStore, clock: Clock
) -> None:
    LEDGER.clear()
    old = Flow(store, [order_v1], clock=clock)
    parked = [await old.start(order_v1, f"o{i}", run_id=f"v1-{i}") for i in range(3)]
    assert all(run.status == "running" for run in parked)  # on the timer

    v2 = order_v2
    new = Flow(store, [v2], clock=clock)
    fresh = await new.start(v2, "n1", run_id="v2-1")
    assert fresh.status == "running"
    assert patches_of(fresh.snapshot) == ("fraud-check",)

    clock.advance(timedelta(hours=2))
    await Flow(store, [v2], clock=clock).run_until_idle()
    for i in range(3):
        done = await new.result(f"v1-{i}")
        assert (done.status, done.output) == ("completed", [f"charged o{i}", f"shipped o{i}"])
        assert patches_of(done.snapshot) == ()
    done = await new.result("v2-1")
    assert done.output == ["charged n1", "checked n1", "shipped n1"]
    assert dict(done.snapshot.attributes) == {"$patch:fraud-check": "1"}
    assert [line for line in LEDGER if line.startswith("fraud")] == ["fraud n1"]
    # Every replay answers the same: a fresh interpreter reads both from their histories.
    for run_id in ("v1-0", "v2-1"):
        snapshot = (await new.result(run_id)).snapshot
        assert type(Flow(store, [v2]).interpreter.decide(snapshot)).__name__ == "Complete"


async def test_the_same_deploy_without_patched_names_the_call(
    store: EventStore, clock: Clock
) -> None:
    await Flow(store, [order_v1], clock=clock).start(order_v1, "o", run_id="strand")
    clock.advance(timedelta(hours=2))
    with pytest.raises(FlowNonDeterminism) as caught:
        await Flow(store, [order_v2_unpatched], clock=clock).engine.drive("strand")
    error = caught.value
    assert (error.call, error.recorded, error.asked) == (2, "a sleep", "step 'check_fraud'")


async def test_deprecated_patch_records_and_keeps_the_new_branch(
    store: EventStore, clock: Clock
) -> None:
    async def deprecated(order: str) -> str:
        await deprecated_patch("fraud-check")
        return f"{workflow_info().run_id}:{await step(check_fraud, order)}"

    async def still_patched(order: str) -> str:
        if await patched("fraud-check"):
            return f"{workflow_info().run_id}:{await step(check_fraud, order)}"
        return "old"

    cleaned = Workflow(name="test-deprecated-patch", fn=deprecated)
    flow = Flow(store, [cleaned], clock=clock)
    done = await flow.start(cleaned, "d", run_id="dep")
    assert (done.status, done.output) == ("completed", "dep:checked d")
    assert patches_of(done.snapshot) == ("fraud-check",)
    # A worker still on the patched code replays the run on the new branch.
    older = Workflow(name="test-deprecated-patch", fn=still_patched)
    decision = Flow(store, [older], clock=clock).interpreter.decide(done.snapshot)
    assert type(decision).__name__ == "Complete"


@pytest.mark.parametrize("bad", ["", "x" * 201, "tab\there"])
def test_a_bad_patch_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="patch id"):
        patched(bad)
    with pytest.raises(ValueError, match="patch id"):
        deprecated_patch(bad)
