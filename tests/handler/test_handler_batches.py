"""`CommandHandler.execute_many` and the warm cache: batches decided as one and appended in one
append, and commands that cost one store call, fenced against runs deleted and created again."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from runfold import CommandHandler, EventStore
from runfold.commands import CompleteRun, CompleteStep, CreateRun, RecordLog, StartRun
from runfold.errors import EntityConflict, InvalidCommand, StepNotFound
from runfold.events import StepCompleted
from runfold.kernel import decide_many, join_decisions, project_run, recheck_decision, run_index
from tests.conftest import T0, Clock
from tests.handler.test_handler import (
    CREATE,
    START,
    DelegatingStore,
    RacingStore,
    fresh,
    lazy,
    log,
    sequences,
)


class CountingStore(DelegatingStore):
    """Counts every call that reaches the store under test."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.calls = 0

    async def pause(self) -> None:
        self.calls += 1


async def test_a_batch_is_decided_in_order_and_appended_at_once(
    store: EventStore, clock: Clock
) -> None:
    counting = CountingStore(store)
    handler = CommandHandler(counting, clock=clock)
    commands = [START, lazy("s"), CompleteStep(step_id="s", output=b"1"), log("after")]

    outcome = await handler.execute_many("r", commands)

    assert counting.calls == 1  # a run the batch creates is not read first: one append
    assert [e.event.event_type for e in outcome.appended] == [
        "run_created",
        "run_started",
        "step_created",
        "step_started",
        "step_completed",
        "log_recorded",
    ]
    assert sequences(outcome.appended) == [1, 2, 3, 4, 5, 6]
    assert outcome.created_step
    assert outcome.snapshot == await fresh(store, "r")
    assert outcome.snapshot.steps["s"].output == b"1"
    assert len({e.recorded_at for e in outcome.appended}) == 1


async def test_creating_a_run_that_exists_reads_it_and_decides_again(
    store: EventStore, clock: Clock
) -> None:
    await CommandHandler(store, clock=clock).execute_many("r", [START, log("first")])
    before = await store.read("r")
    counting = CountingStore(store)
    handler = CommandHandler(counting, clock=clock)

    # Taken to be new, it is not: the append at sequence 0 is refused, the run read, and the
    # commands decided on it (the run is running: starting it again is a no-op).
    outcome = await handler.execute_many("r", [START, log("second")])

    assert [e.event.event_type for e in outcome.appended] == ["log_recorded"]
    assert counting.calls == 3  # the refused append, the read, the append
    assert await store.read("r") == [*before, *outcome.appended]
    with pytest.raises(EntityConflict):  # creating it outright is refused, writing nothing
        await handler.execute_many("r", [CREATE])
    with pytest.raises(EntityConflict):
        await CommandHandler(store, clock=clock).execute_many("r", [CREATE, log("never")])
    assert await store.read("r") == [*before, *outcome.appended]


async def test_a_refused_command_mid_batch_writes_nothing_and_is_named(
    store: EventStore, handler: CommandHandler
) -> None:
    await handler.execute("r", START)
    before = await store.read("r")

    with pytest.raises(StepNotFound) as refused:
        await handler.execute_many(
            "r", [log("a"), CompleteStep(step_id="nope", output=b""), log("b")]
        )

    assert refused.value.command_index == 1
    assert "refused command 1 of a batch of 3: CompleteStep" in refused.value.__notes__
    assert await store.read("r") == before
    assert (await store.get_runs(["r"]))[0] == run_index(project_run(before)).summary


async def test_a_single_refused_command_has_index_zero(handler: CommandHandler) -> None:
    await handler.execute("r", START)
    with pytest.raises(EntityConflict) as refused:
        await handler.execute("r", CreateRun(workflow_name="wf", input=b"in"))
    assert refused.value.command_index == 0


async def test_an_empty_batch_is_refused(handler: CommandHandler) -> None:
    with pytest.raises(InvalidCommand, match="at least one command"):
        await handler.execute_many("r", [])


async def test_a_batch_that_meets_a_conflict_is_retried_whole(
    store: EventStore, clock: Clock
) -> None:
    await CommandHandler(store, clock=clock).execute("r", START)
    rival = CommandHandler(store, clock=clock)
    racing = RacingStore(store, lambda: rival.execute("r", log("rival")), races=2)
    handler = CommandHandler(racing, clock=clock)

    outcome = await handler.execute_many("r", [lazy("s"), CompleteStep(step_id="s", output=b"")])

    assert racing.raced == 2 and racing.conflicts >= 1
    assert [e.event.event_type for e in outcome.appended] == [
        "step_created",
        "step_started",
        "step_completed",
    ]
    assert outcome.snapshot == await fresh(store, "r")
    assert outcome.snapshot.log_count == 2


async def test_a_command_on_a_warm_cache_costs_one_store_call(
    store: EventStore, clock: Clock
) -> None:
    counting = CountingStore(store)
    handler = CommandHandler(counting, clock=clock)
    await handler.execute("r", START)
    for n in range(5):
        counting.calls = 0
        clock.advance()
        outcome = await handler.execute("r", log(str(n)))
        assert counting.calls == 1, f"command {n} made {counting.calls} store calls"
        assert outcome.snapshot == await fresh(store, "r")


async def test_a_stale_cache_catches_up_once_the_store_refuses(
    store: EventStore, clock: Clock
) -> None:
    counting = CountingStore(store)
    handler = CommandHandler(counting, clock=clock)
    await handler.execute("r", START)
    await CommandHandler(store, clock=clock).execute("r", lazy("s"))  # behind the cache's back
    counting.calls = 0

    # Refused on the cached snapshot (no step "s" there), accepted on the stored run.
    outcome = await handler.execute("r", CompleteStep(step_id="s", output=b"ok"))

    assert counting.calls == 2  # the catch-up read, then the append
    assert outcome.snapshot == await fresh(store, "r")
    assert outcome.snapshot.steps["s"].status == "completed"


async def test_a_run_deleted_and_created_again_at_the_same_instant_gets_no_stale_decision(
    store: EventStore, clock: Clock
) -> None:
    """The clock stands still: the new run reaches the old cached head with the same sequence and
    the same `recorded_at`. Only the feed position tells the two runs apart."""
    stale = CommandHandler(store, clock=clock)
    others = CommandHandler(store, clock=clock)
    await stale.execute("r", StartRun(create=CreateRun(workflow_name="old", input=b"old")))
    await others.execute("r", CompleteRun(output=b""))
    assert await store.delete_runs(terminal_before=clock.now + timedelta(microseconds=1), limit=5)
    await others.execute("r", StartRun(create=CreateRun(workflow_name="new", input=b"new")))
    assert (await store.read("r"))[-1].recorded_at == clock.now  # same head, same instant

    outcome = await stale.execute("r", RecordLog(level="info", message="x"))

    history = await store.read("r")
    assert outcome.snapshot == project_run(history)
    assert outcome.snapshot.input == b"new" and outcome.snapshot.workflow_name == "new"
    assert (await store.get_runs(["r"]))[0] == run_index(project_run(history)).summary


async def test_a_cache_of_zero_reads_every_time(store: EventStore, clock: Clock) -> None:
    counting = CountingStore(store)
    handler = CommandHandler(counting, clock=clock, cache_size=0)
    await handler.execute("r", START)
    counting.calls = 0
    await handler.execute("r", log())
    assert counting.calls == 2


async def test_a_wrong_decision_handed_in_is_refused_and_nothing_is_written(
    store: EventStore, clock: Clock
) -> None:
    """`decided` on the very snapshot the handler holds, but not what the kernel decides: a
    step completed that never existed. It used to be appended as it was, and the run no longer
    replayed."""
    handler = CommandHandler(store, clock=clock)
    before = (await handler.execute("r", START)).snapshot
    commands = [log("mine")]
    right = decide_many(before, commands, now=clock.now, run_id="r")
    bogus = attrs.evolve(right, events=(StepCompleted(step_id="nobody", output=b"x"),))
    with pytest.raises(InvalidCommand, match="does not hold on run 'r'"):
        await handler.execute_many("r", commands, now=clock.now, decided=bogus)
    assert await store.head("r") == before.last_sequence
    project_run(await store.read("r"))  # the run replays
    outcome = await handler.execute_many("r", commands, now=clock.now, decided=right)
    assert outcome.snapshot == await fresh(store, "r") and outcome.snapshot.log_count == 1


def test_the_kernels_own_decisions_are_taken_as_they_are_and_joined() -> None:
    now = T0
    start = decide_many(None, [CREATE, START], now=now, run_id="r")
    first = decide_many(start.snapshot, [log("a")], now=now)
    then = decide_many(first.snapshot, [log("b")], now=now)
    assert recheck_decision(first, start.snapshot, run_id="r") is first  # not folded again
    joined = join_decisions(first, then)
    assert joined.events == first.events + then.events and joined.snapshot is then.snapshot
    assert recheck_decision(joined, start.snapshot, run_id="r") is joined
    copy = attrs.evolve(first)  # equal, but made by hand: folded, and found to hold
    rechecked = recheck_decision(copy, start.snapshot, run_id="r")
    assert rechecked is not copy and rechecked.snapshot == first.snapshot
    with pytest.raises(ValueError, match="made by decide_many"):
        join_decisions(copy, then)
    with pytest.raises(ValueError, match="first one's snapshot"):
        join_decisions(then, first)


async def test_a_decision_made_on_another_snapshot_is_decided_again(
    store: EventStore, clock: Clock
) -> None:
    """`decided` is reused only when it was decided on the very snapshot the handler holds at
    the same time; otherwise (here: a stale one, from before another writer's event) the
    handler decides the commands itself."""
    handler = CommandHandler(store, clock=clock)
    before = (await handler.execute("r", START)).snapshot
    commands = [log("mine")]
    stale = decide_many(before, commands, now=clock.now, run_id="r")
    await CommandHandler(store, clock=clock).execute("r", log("theirs"))
    await handler.snapshot("r")  # the handler now holds the newer run

    outcome = await handler.execute_many("r", commands, now=clock.now, decided=stale)

    assert sequences(outcome.appended) == [4]
    assert outcome.snapshot == await fresh(store, "r")
    assert outcome.snapshot.log_count == 2
