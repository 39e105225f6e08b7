"""Commands that used to be accepted and then broke a run: refused by `decide` with a typed
error naming the field, through the handler on every store, and nothing is written."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runfold import CommandHandler, EventStore
from runfold.commands import CreateRun, LazyStep, RecordProgress, StartRun, StartStep
from runfold.errors import AttemptsExhausted, InvalidAttributes, InvalidCommand, StoreClosed
from runfold.events import RetryPolicy
from runfold.kernel import MAX_BACKOFF_COEFFICIENT, MAX_RETRY_INTERVAL, project_run
from tests.handler.test_handler import START


async def test_a_new_run_with_a_none_attribute_is_refused(
    store: EventStore, handler: CommandHandler
) -> None:
    create = CreateRun(workflow_name="wf", input=b"", attributes={"tenant": None})  # type: ignore[dict-item]
    for command in (create, StartRun(create=create)):
        with pytest.raises(InvalidAttributes, match="'tenant' of a new run must be a string"):
            await handler.execute("r", command)
    assert await store.read("r") == []


@pytest.mark.parametrize(
    "completed", [2**63, -(2**63) - 1, 10**5000], ids=["2**63", "-2**63-1", "10**5000"]
)
async def test_integers_past_64_bits_are_refused(
    store: EventStore, handler: CommandHandler, completed: int
) -> None:
    await handler.execute("r", START)
    before = await store.read("r")
    with pytest.raises(InvalidCommand, match="completed is outside the 64-bit integer range"):
        await handler.execute("r", RecordProgress(progress_id="p", completed=completed, total=None))
    assert await store.read("r") == before


async def test_the_largest_integer_round_trips_through_the_store(
    store: EventStore, handler: CommandHandler
) -> None:
    await handler.execute("r", START)
    largest = 2**63 - 1
    outcome = await handler.execute(
        "r", RecordProgress(progress_id="p", completed=largest, total=largest)
    )
    replayed = project_run(await store.read("r"))
    assert replayed == outcome.snapshot
    assert replayed.progress["p"].completed == largest
    assert repr(replayed)  # printable: no 4,300-digit integer to convert


BAD_POLICIES = {
    "max-interval": (RetryPolicy(max_interval=timedelta.max), "retry.max_interval"),
    "initial-interval": (
        RetryPolicy(initial_interval=MAX_RETRY_INTERVAL + timedelta(days=1)),
        "retry.initial_interval",
    ),
    "huge-coefficient": (RetryPolicy(backoff_coefficient=10**400), "retry.backoff_coefficient"),
    "nan-coefficient": (
        RetryPolicy(backoff_coefficient=float("nan")),
        "retry.backoff_coefficient",
    ),
    "big-coefficient": (
        RetryPolicy(backoff_coefficient=MAX_BACKOFF_COEFFICIENT + 1),
        "retry.backoff_coefficient",
    ),
    "attempts": (RetryPolicy(max_attempts=10**12), "retry.max_attempts"),
}


@pytest.mark.parametrize("case", sorted(BAD_POLICIES))
async def test_retry_policies_out_of_bounds_are_refused(
    store: EventStore, handler: CommandHandler, case: str
) -> None:
    policy, field = BAD_POLICIES[case]
    await handler.execute("r", START)
    before = await store.read("r")
    lazy = LazyStep(step_name="n", input=b"", retry=policy)
    with pytest.raises(InvalidCommand, match=field):
        await handler.execute("r", StartStep(step_id="s", lazy=lazy))
    assert await store.read("r") == before


async def test_a_step_is_not_started_past_its_last_attempt(
    store: EventStore, handler: CommandHandler
) -> None:
    await handler.execute("r", START)
    lazy = LazyStep(step_name="n", input=b"", retry=RetryPolicy(max_attempts=2))
    await handler.execute("r", StartStep(step_id="s", lazy=lazy))
    await handler.execute("r", StartStep(step_id="s"))  # attempt 1 was interrupted
    before = await store.read("r")
    with pytest.raises(AttemptsExhausted, match="2 of 2"):
        await handler.execute("r", StartStep(step_id="s"))
    assert await store.read("r") == before
    assert AttemptsExhausted.code == "attempts_exhausted"


async def test_a_closed_store_refuses_even_an_empty_get_runs(store: EventStore) -> None:
    await store.close()
    with pytest.raises(StoreClosed):
        await store.get_runs([])
