"""`wait_for_event`: a token used again in one run, and a timeout, on every store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runfold import EventStore
from runfold.engine import Complete
from runfold.flow import Flow, TokenInUse, step, wait_for_event, workflow
from runfold.kernel import HookNotFound
from tests.conftest import Clock


@workflow(name="test-two-answers")
async def two_answers(_: None) -> list[str]:
    first = await wait_for_event("first", token="answer-token")
    second = await wait_for_event("second", token="answer-token")
    return [first, second]


async def test_a_token_serves_a_second_wait_once_the_first_is_done(store: EventStore) -> None:
    flow = Flow(store, [two_answers])
    await flow.start(two_answers, None, run_id="t")
    assert (await flow.deliver("answer-token", "yes")).status == "running"
    done = await Flow(store, [two_answers]).deliver("answer-token", "again")  # a replay
    assert (done.status, done.output) == ("completed", ["yes", "again"])
    kinds = [e.event.event_type for e in await store.read("t")]
    assert "hook_conflict" not in kinds and kinds.count("hook_disposed") == 1


@workflow(name="test-holder")
async def holder(_: None) -> str:
    try:
        await wait_for_event("e", token="held-token")
    except TokenInUse as exc:
        return str(exc)
    return "delivered"


async def test_a_token_another_run_holds_names_that_run(store: EventStore) -> None:
    flow = Flow(store, [holder])
    await flow.start(holder, None, run_id="h1")
    refused = await flow.start(holder, None, run_id="h2")
    assert refused.output == "the token of wait_for_event('e') is held by a hook of run 'h1'"
    assert "held-token" not in refused.output


@workflow(name="test-webhook")
async def webhook(order_id: str) -> str:
    paid = await wait_for_event("paid", token=f"paid-{order_id}", timeout=timedelta(hours=24))
    if paid is None:
        refunded: str = await step(refund, order_id)
        return refunded
    return f"paid {paid}"


def refund(order_id: str) -> str:
    return f"refunded {order_id}"


async def test_a_delivery_before_the_timeout_wins(store: EventStore, clock: Clock) -> None:
    flow = Flow(store, [webhook], clock=clock)
    await flow.start(webhook, "w1", run_id="w1")
    clock.advance(timedelta(hours=23))
    assert (await flow.deliver("paid-w1", 30)).output == "paid 30"
    clock.advance(timedelta(hours=2))  # the timer falls due later and changes nothing
    await flow.run_until_idle()
    assert (await flow.result("w1")).output == "paid 30"


async def test_the_timeout_resumes_with_none_and_closes_the_hook(
    store: EventStore, clock: Clock
) -> None:
    await Flow(store, [webhook], clock=clock).start(webhook, "w2", run_id="w2")
    clock.advance(timedelta(hours=24))
    flow = Flow(store, [webhook], clock=clock)  # a fresh process finds the due timer
    await flow.run_until_idle()
    done = await flow.result("w2")
    assert (done.status, done.output) == ("completed", "refunded w2")
    assert done.snapshot.hooks["1"].status == "disposed"
    with pytest.raises(HookNotFound):
        await flow.deliver("paid-w2", 30)  # too late
    # Replayed from the history, the workflow takes the same branch.
    flow.interpreter.forget("w2")
    assert flow.interpreter.decide(done.snapshot) == Complete(output=b'"refunded w2"')


def test_a_negative_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout"):
        wait_for_event("e", token="t", timeout=-1)
