"""`CommandHandler`: the load → decide → append cycle, its cache, retries, `deliver`, run ids.

Races are staged with `DelegatingStore` subclasses: thin wrappers that pass every call to the
real store under test and only interleave a rival's writes or a task switch; storage itself is
never faked.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from runfold import CommandHandler, EventStore, Snapshot, testing
from runfold.commands import (
    CancelRun,
    Command,
    CompleteRun,
    CompleteStep,
    CreateHook,
    CreateRun,
    CreateStep,
    DisposeHook,
    LazyStep,
    RecordLog,
    RetryStep,
    SetAttributes,
    StartRun,
    StartStep,
)
from runfold.errors import (
    EntityConflict,
    HistoryError,
    HookNotFound,
    RunExpired,
    RunNotFound,
    SequenceConflict,
    TooEarly,
)
from runfold.events import (
    Envelope,
    HookConflict,
    HookCreated,
    HookReceived,
    StepCompleted,
    StepCreated,
)
from runfold.handler import new_run_id
from runfold.kernel import HookHolder, Limits, project_run
from runfold.stores.protocol import ReplayedRun, Replayer
from tests.conftest import T0, Clock

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
CREATE = CreateRun(workflow_name="wf", input=b"in")
START = StartRun(create=CREATE)
TOKEN = "s3cret-token-0123456789"
LIMITS = Limits()


def step(step_id: str) -> CreateStep:
    return CreateStep(step_id=step_id, step_name="n", input=b"")


def log(message: str = "x") -> RecordLog:
    return RecordLog(level="info", message=message)


def lazy(step_id: str) -> StartStep:
    return StartStep(step_id=step_id, lazy=LazyStep(step_name="n", input=b""))


async def fresh(store: EventStore, run_id: str) -> Snapshot:
    """The run as the kernel folds it from the store, bypassing every cache."""
    return project_run(await store.read(run_id))


def sequences(envelopes: Sequence[Envelope]) -> list[int]:
    return [envelope.sequence for envelope in envelopes]


# --- store wrappers that stage races ------------------------------------------------------------


class DelegatingStore(testing.DelegatingStore):
    """`runfold.testing.DelegatingStore` that also counts the appends refused as conflicts."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.conflicts = 0

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        try:
            return await super()._append_if_sequence(*call)
        except SequenceConflict:
            self.conflicts += 1
            raise


class YieldingStore(DelegatingStore):
    """Switches tasks before every call, so concurrent executes really interleave."""

    async def pause(self) -> None:
        await asyncio.sleep(0)


class RacingStore(DelegatingStore):
    """Before each append (the first `races` of them; None: every one), lets `rival` write."""

    def __init__(
        self, inner: EventStore, rival: Callable[[], Awaitable[object]], races: int | None
    ) -> None:
        super().__init__(inner)
        self.rival = rival
        self.races_left = races
        self.raced = 0

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        if self.races_left is None or self.races_left > 0:
            if self.races_left is not None:
                self.races_left -= 1
            self.raced += 1
            await self.rival()
        return await super()._append_if_sequence(*call)


def test_delegating_store_is_an_event_store(store: EventStore) -> None:
    assert isinstance(DelegatingStore(store), EventStore)


# --- cache catch-up -----------------------------------------------------------------------------


async def test_a_second_handler_sees_the_first_ones_writes(
    store: EventStore, handler: CommandHandler, clock: Clock
) -> None:
    other = CommandHandler(store, clock=clock)
    await handler.execute("r", START)
    assert await other.snapshot("r") == await fresh(store, "r")

    await other.execute("r", step("s1"))
    started = await handler.execute("r", StartStep(step_id="s1"))  # needs other's step_created
    await other.execute("r", CompleteStep(step_id="s1", output=b"o"))

    assert sequences(started.appended) == [4]
    for each in (handler, other):
        snapshot = await each.snapshot("r")
        assert snapshot == await fresh(store, "r")
        assert snapshot.last_sequence == 5 and snapshot.steps["s1"].status == "completed"


class _ReplayCounting(DelegatingStore):
    """Counts the whole-run reads, and offers `replay` when the store under it does."""

    def __init__(self, inner: EventStore) -> None:
        super().__init__(inner)
        self.calls: list[str] = []

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, descending: bool = False
    ) -> list[Envelope]:
        self.calls.append(f"read after {after}")
        return await super().read(run_id, after=after, limit=limit, descending=descending)


class _Replaying(_ReplayCounting):
    async def replay(self, run_id: str, *, limits: Limits = LIMITS) -> ReplayedRun | None:
        self.calls.append(f"replay {limits.max_attributes}")
        assert isinstance(self.inner, Replayer)
        return await self.inner.replay(run_id, limits=limits)


async def test_a_cold_load_replays_where_the_store_offers_it(
    store: EventStore, clock: Clock
) -> None:
    await CommandHandler(store, clock=clock).execute("r", START)
    await CommandHandler(store, clock=clock).execute("r", SetAttributes(changes={"k": "v"}))
    expected = await fresh(store, "r")
    offers = isinstance(store, Replayer)
    counting = _Replaying(store) if offers else _ReplayCounting(store)
    assert await CommandHandler(counting, clock=clock).snapshot("r") == expected
    assert counting.calls == (["replay 64"] if offers else ["read after 0"])
    if offers:  # the handler's limits are the fold's
        tight = CommandHandler(counting, clock=clock, limits=Limits(max_attributes=0))
        with pytest.raises(HistoryError, match="over the limit"):
            await tight.snapshot("r")
        assert counting.calls[-1] == "replay 0"


# --- retries ------------------------------------------------------------------------------------


@pytest.mark.parametrize("races", [1, 3, 15])
async def test_sequence_conflict_is_retried(store: EventStore, clock: Clock, races: int) -> None:
    rival = CommandHandler(store, clock=clock)
    await rival.execute("r", START)
    racing = RacingStore(store, lambda: rival.execute("r", log("rival")), races=races)
    handler = CommandHandler(racing, clock=clock)

    outcome = await handler.execute("r", step("s1"))

    assert racing.conflicts == races
    assert sequences(outcome.appended) == [2 + races + 1]
    history = await store.read("r")
    assert sequences(history) == list(range(1, 2 + races + 2))
    assert [type(e.event) for e in history].count(StepCreated) == 1
    assert outcome.snapshot == await fresh(store, "r")


async def test_a_retry_decides_again_on_the_fresh_snapshot(store: EventStore, clock: Clock) -> None:
    rival = CommandHandler(store, clock=clock)
    await rival.execute("r", START)
    racing = RacingStore(store, lambda: rival.execute("r", step("s1")), races=1)
    handler = CommandHandler(racing, clock=clock)

    with pytest.raises(EntityConflict):
        await handler.execute("r", step("s1"))

    assert racing.conflicts == 1
    assert [type(e.event) for e in await store.read("r")].count(StepCreated) == 1


@pytest.mark.parametrize("max_attempts", [1, 2, 5])
async def test_max_attempts_exhausted_raises_the_last_conflict(
    store: EventStore, clock: Clock, max_attempts: int
) -> None:
    rival = CommandHandler(store, clock=clock)
    await rival.execute("r", START)
    racing = RacingStore(store, lambda: rival.execute("r", log("rival")), races=None)
    handler = CommandHandler(racing, clock=clock, max_attempts=max_attempts)

    with pytest.raises(SequenceConflict) as caught:
        await handler.execute("r", step("s1"))

    head = await store.head("r")
    assert racing.raced == racing.conflicts == max_attempts
    assert head == 2 + max_attempts
    assert (caught.value.run_id, caught.value.expected, caught.value.actual) == (
        "r",
        head - 1,
        head,
    )
    assert StepCreated not in {type(e.event) for e in await store.read("r")}


@pytest.mark.parametrize("interleave", [True, False], ids=["yielding", "plain"])
@pytest.mark.parametrize("shared", [True, False], ids=["one-handler", "handler-each"])
async def test_concurrent_executes_on_one_run_all_succeed(
    store: EventStore, clock: Clock, interleave: bool, shared: bool
) -> None:
    racers = 16  # each loss means another racer won, so 16 attempts always suffice
    wrapped = YieldingStore(store) if interleave else DelegatingStore(store)
    one = CommandHandler(wrapped, clock=clock)
    await one.execute("r", START)
    handlers = [one if shared else CommandHandler(wrapped, clock=clock) for _ in range(racers)]
    for each in handlers:
        await each.snapshot("r")  # every handler starts from the same cached head

    outcomes = await asyncio.gather(
        *(each.execute("r", step(f"s{i}")) for i, each in enumerate(handlers))
    )

    appended = sorted(s for outcome in outcomes for s in sequences(outcome.appended))
    assert appended == list(range(3, 3 + racers))
    history = await store.read("r")
    assert sequences(history) == list(range(1, 3 + racers))
    created = [e.event.step_id for e in history if isinstance(e.event, StepCreated)]
    assert sorted(created) == sorted(f"s{i}" for i in range(racers))
    if interleave:
        assert wrapped.conflicts > 0  # the race was real
    final = await fresh(store, "r")
    for each in handlers:
        assert await each.snapshot("r") == final


# --- hook tokens --------------------------------------------------------------------------------


@pytest.mark.parametrize("max_attempts", [1, 16])
async def test_token_conflict_across_runs_becomes_hook_conflict(
    store: EventStore, clock: Clock, max_attempts: int
) -> None:
    # Deciding again after a TokenConflict is not a lost race: it needs no spare attempt.
    handler = CommandHandler(store, clock=clock, max_attempts=max_attempts)
    await handler.execute("a", START)
    await handler.execute("a", CreateHook(hook_id="ha", token=TOKEN))
    await handler.execute("b", START)

    outcome = await handler.execute("b", CreateHook(hook_id="hb", token=TOKEN))

    assert [e.event for e in outcome.appended] == [
        HookConflict(hook_id="hb", token=TOKEN, holder_run_id="a")
    ]
    assert "hb" not in outcome.snapshot.hooks and not outcome.snapshot.active_hooks()
    assert outcome.snapshot == await fresh(store, "b")
    assert await store.find_hook(TOKEN, now=T0) == HookHolder(
        run_id="a", hook_id="ha", retained_until=None
    )


@pytest.mark.parametrize(
    ("later", "expected"),
    [
        pytest.param(30 * MINUTE, HookConflict, id="still-retained"),
        pytest.param(2 * HOUR, HookCreated, id="retention-over"),
    ],
)
async def test_a_retained_token_conflicts_until_its_retention_ends(
    store: EventStore, handler: CommandHandler, clock: Clock, later: timedelta, expected: type
) -> None:
    await handler.execute("a", START)
    await handler.execute("a", CreateHook(hook_id="ha", token=TOKEN, retain_token_until=T0 + HOUR))
    await handler.execute("a", CompleteRun(output=b""))
    await handler.execute("b", START)
    clock.advance(later)

    outcome = await handler.execute("b", CreateHook(hook_id="hb", token=TOKEN))

    assert [type(e.event) for e in outcome.appended] == [expected]
    holder = await store.find_hook(TOKEN, now=clock.now)
    assert holder is not None and holder.run_id == ("a" if expected is HookConflict else "b")


async def test_a_late_step_outcome_after_the_token_moved_on(
    store: EventStore, handler: CommandHandler, clock: Clock
) -> None:
    await handler.execute("a", START)
    await handler.execute("a", lazy("s1"))
    await handler.execute("a", CreateHook(hook_id="ha", token=TOKEN, retain_token_until=T0 + HOUR))
    await handler.execute("a", CompleteRun(output=b""))
    clock.advance(2 * HOUR)
    await handler.execute("b", START)
    await handler.execute("b", CreateHook(hook_id="hb", token=TOKEN))

    late = await handler.execute("a", CompleteStep(step_id="s1", output=b"late"))

    assert [e.event for e in late.appended] == [StepCompleted(step_id="s1", output=b"late")]
    assert await store.find_hook(TOKEN, now=clock.now) == HookHolder(
        run_id="b", hook_id="hb", retained_until=None
    )


# --- missed events ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("known", "command", "missed", "appended"),
    [
        (2, step("s"), [3, 4], [5]),
        (3, step("s"), [4], [5]),
        (0, step("s"), [1, 2, 3, 4], [5]),
        (4, step("s"), [], [5]),
        (None, step("s"), [], [5]),
        (2, StartRun(), [3, 4], []),  # a no-op still reports what the caller missed
    ],
)
async def test_missed_holds_exactly_what_others_appended(
    store: EventStore,
    handler: CommandHandler,
    clock: Clock,
    known: int | None,
    command: Command,
    missed: list[int],
    appended: list[int],
) -> None:
    await handler.execute("r", START)
    other = CommandHandler(store, clock=clock)
    await other.execute("r", log("one"))
    await other.execute("r", log("two"))
    stored = await store.read("r")

    outcome = await handler.execute("r", command, known_sequence=known)

    assert list(outcome.missed) == [stored[s - 1] for s in missed]
    assert sequences(outcome.appended) == appended


async def test_missed_includes_what_a_racing_writer_appended(
    store: EventStore, clock: Clock
) -> None:
    rival = CommandHandler(store, clock=clock)
    await rival.execute("r", START)
    racing = RacingStore(store, lambda: rival.execute("r", log("rival")), races=2)
    handler = CommandHandler(racing, clock=clock)

    outcome = await handler.execute("r", step("s"), known_sequence=2)

    assert list(outcome.missed) == (await store.read("r"))[2:4]
    assert sequences(outcome.appended) == [5]


# --- deliver ------------------------------------------------------------------------------------


async def test_deliver_records_a_delivery_on_the_holding_run(
    store: EventStore, handler: CommandHandler
) -> None:
    await handler.execute("other", START)
    await handler.execute("r", START)
    await handler.execute("r", CreateHook(hook_id="h", token=TOKEN))

    outcome = await handler.deliver(TOKEN, b"\x00payload", delivery_id="d1")
    again = await handler.deliver(TOKEN, b"\x00payload", delivery_id="d1")

    assert [(e.run_id, e.event) for e in outcome.appended] == [
        ("r", HookReceived(hook_id="h", payload=b"\x00payload", delivery_id="d1"))
    ]
    assert again.appended == ()  # the same delivery id again is a no-op
    [delivery] = (await handler.snapshot("r")).hooks["h"].deliveries
    assert (delivery.delivery_id, delivery.payload) == ("d1", b"\x00payload")
    assert await store.head("other") == 2


GONE: list[Any] = [
    pytest.param([], 0, id="never-created"),
    pytest.param(
        [CreateHook(hook_id="h", token=TOKEN), DisposeHook(hook_id="h")], 0, id="disposed"
    ),
    pytest.param(
        [CreateHook(hook_id="h", token=TOKEN), CompleteRun(output=b"")], 0, id="run-ended"
    ),
    pytest.param([CreateHook(hook_id="h", token=TOKEN), CancelRun()], 0, id="run-cancelled"),
    pytest.param(
        [
            CreateHook(hook_id="h", token=TOKEN, retain_token_until=T0 + HOUR),
            CompleteRun(output=b""),
        ],
        2,
        id="retention-over",
    ),
]


@pytest.mark.parametrize(("setup", "hours_later"), GONE)
async def test_deliver_without_a_live_hook_is_hook_not_found(
    store: EventStore,
    handler: CommandHandler,
    clock: Clock,
    setup: list[Command],
    hours_later: int,
) -> None:
    await handler.execute("r", START)
    for command in setup:
        await handler.execute("r", command)
    clock.advance(hours_later * HOUR)
    before = await store.read("r")

    with pytest.raises(HookNotFound) as caught:
        await handler.deliver(TOKEN, b"p")

    assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value)
    assert await store.read("r") == before


async def test_deliver_to_a_retained_hook_of_an_ended_run_is_run_expired(
    handler: CommandHandler, clock: Clock
) -> None:
    await handler.execute("r", START)
    await handler.execute("r", CreateHook(hook_id="h", token=TOKEN, retain_token_until=T0 + HOUR))
    await handler.execute("r", CompleteRun(output=b""))
    clock.advance(30 * MINUTE)
    with pytest.raises(RunExpired):
        await handler.deliver(TOKEN, b"p")


# --- reading through the handler ----------------------------------------------------------------


async def test_snapshot_of_an_unknown_run_is_run_not_found(
    store: EventStore, handler: CommandHandler
) -> None:
    await handler.execute("known", START)
    with pytest.raises(RunNotFound) as caught:
        await handler.snapshot("unknown")
    assert caught.value.run_id == "unknown"
    assert "unknown" in str(caught.value)
    assert await handler.history("unknown") == []
    assert await store.head("unknown") == 0


async def test_history_is_the_stored_history(store: EventStore, handler: CommandHandler) -> None:
    await handler.execute("r", START)
    await handler.execute("r", lazy("s"))
    history = await handler.history("r")
    assert history == await store.read("r")
    assert sequences(history) == [1, 2, 3, 4]


async def test_a_no_op_returns_the_current_snapshot(
    store: EventStore, handler: CommandHandler
) -> None:
    await handler.execute("r", START)
    outcome = await handler.execute("r", START)
    assert (outcome.appended, outcome.missed) == ((), ())
    assert outcome.snapshot == await fresh(store, "r")
    assert await store.head("r") == 2


async def test_created_step_tells_who_won_a_lazy_start(handler: CommandHandler) -> None:
    await handler.execute("r", START)
    first = await handler.execute("r", lazy("s"))
    redelivered = await handler.execute("r", StartStep(step_id="s"))
    assert (first.created_step, redelivered.created_step) == (True, False)
    assert redelivered.snapshot.steps["s"].attempt == 2
    with pytest.raises(EntityConflict):
        await handler.execute("r", lazy("s"))


async def test_the_clock_is_injected(
    store: EventStore, handler: CommandHandler, clock: Clock
) -> None:
    started = await handler.execute("r", START)
    clock.advance(timedelta(seconds=5))
    stepped = await handler.execute("r", lazy("s"))
    clock.advance(timedelta(seconds=5))
    await handler.execute("r", RetryStep(step_id="s", error=b"e", retry_after=T0 + MINUTE))

    assert {e.recorded_at for e in started.appended} == {T0}
    assert {e.recorded_at for e in stepped.appended} == {T0 + timedelta(seconds=5)}
    snapshot = await handler.snapshot("r")
    assert (snapshot.created_at, snapshot.started_at, snapshot.updated_at) == (
        T0,
        T0,
        T0 + timedelta(seconds=10),
    )
    assert snapshot.steps["s"].started_at == T0 + timedelta(seconds=5)
    [summary] = await store.get_runs(["r"])
    assert summary is not None and summary.updated_at == T0 + timedelta(seconds=10)
    with pytest.raises(TooEarly):  # `now` is the clock's, not the wall's
        await handler.execute("r", StartStep(step_id="s"))
    clock.advance(MINUTE)
    assert (await handler.execute("r", StartStep(step_id="s"))).appended[0].recorded_at == clock.now


# --- the cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cache_size", [0, 1, 2, 1024])
async def test_any_cache_size_gives_the_same_answers(
    store: EventStore, clock: Clock, cache_size: int
) -> None:
    handler = CommandHandler(store, clock=clock, cache_size=cache_size)
    outsider = CommandHandler(store, clock=clock)
    runs = [f"r{i}" for i in range(5)]
    for run_id in runs:
        await handler.execute(run_id, START)
    for round_ in range(4):
        for i, run_id in enumerate(runs):
            clock.advance()
            if (round_ + i) % 3 == 0:
                await outsider.execute(run_id, log(f"outsider {round_}"))
            outcome = await handler.execute(run_id, lazy(f"s{round_}"))
            assert outcome.created_step
            assert outcome.snapshot == await fresh(store, run_id)
    for run_id in runs:
        snapshot = await handler.snapshot(run_id)
        assert snapshot == await fresh(store, run_id)
        assert len(snapshot.steps) == 4


@pytest.mark.parametrize("backoff", [0.0, 0.001])
async def test_conflicts_in_a_row_pause_the_retries_for_a_random_time_growing_each_time(
    store: EventStore, clock: Clock, monkeypatch: pytest.MonkeyPatch, backoff: float
) -> None:
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr("runfold.handler._handler.asyncio", SimpleNamespace(sleep=pause))
    monkeypatch.setattr("runfold.handler._handler.random", SimpleNamespace(random=lambda: 1.0))
    rival = CommandHandler(store, clock=clock)
    await rival.execute("r", START)
    racing = RacingStore(store, lambda: rival.execute("r", log("rival")), races=None)
    handler = CommandHandler(racing, clock=clock, max_attempts=8, conflict_backoff=backoff)

    with pytest.raises(SequenceConflict):
        await handler.execute("r", step("s1"))

    assert racing.conflicts == 8
    # None after the first conflict (two writers racing retry at once), none after the last;
    # the n-th conflict allows up to backoff × 2**n, at most 50 ms.
    expected = [min(backoff * 2**n, 0.05) for n in range(2, 8)] if backoff else []
    assert pauses == pytest.approx(expected)


@pytest.mark.parametrize(
    "bad",
    [
        {"cache_size": -1},
        {"max_attempts": 0},
        {"conflict_backoff": -0.001},
        {"conflict_backoff": float("nan")},
    ],
)
def test_constructor_refuses_nonsense(store: EventStore, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CommandHandler(store, **bad)


@pytest.mark.parametrize("ended_by", ["same", "other"])
@pytest.mark.parametrize(
    "first", [CREATE, StartRun(create=CreateRun(workflow_name="wf", input=b"in"))]
)
async def test_a_cached_run_deleted_by_retention_does_not_wedge_the_handler(
    store: EventStore, handler: CommandHandler, clock: Clock, ended_by: str, first: Command
) -> None:
    other = CommandHandler(store, clock=clock)
    await handler.execute("r", START)
    await (handler if ended_by == "same" else other).execute("r", CompleteRun(output=b""))
    clock.advance(timedelta(days=1))
    assert await store.delete_runs(terminal_before=clock.now, limit=10) == 1

    with pytest.raises(RunNotFound):
        await handler.snapshot("r")
    assert await handler.history("r") == []
    outcome = await handler.execute("r", first)

    assert sequences(outcome.appended) == list(range(1, len(outcome.appended) + 1))
    assert outcome.snapshot.is_live and outcome.snapshot.created_at == clock.now
    assert outcome.snapshot == await fresh(store, "r") == await handler.snapshot("r")


async def test_a_cached_run_deleted_and_recreated_longer_is_reloaded(
    store: EventStore, handler: CommandHandler, clock: Clock
) -> None:
    await handler.execute("r", START)
    await handler.execute("r", CompleteRun(output=b""))
    clock.advance(timedelta(days=1))
    assert await store.delete_runs(terminal_before=clock.now, limit=10) == 1
    other = CommandHandler(store, clock=clock)
    clock.advance()
    for command in (START, log("a"), log("b"), log("c")):
        await other.execute("r", command)

    outcome = await handler.execute("r", lazy("s"))

    assert sequences(outcome.appended) == [6, 7]
    assert outcome.snapshot == await fresh(store, "r")
    assert outcome.snapshot.status == "running"


# --- run ids ------------------------------------------------------------------------------------

RUN_ID = re.compile(r"run_[0-9ABCDEFGHJKMNPQRSTVWXYZ]{26}")
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def test_new_run_ids_sort_in_creation_order_and_never_repeat() -> None:
    ids = [new_run_id() for _ in range(10_000)]
    assert sorted(ids) == ids
    assert len(set(ids)) == len(ids)
    assert all(RUN_ID.fullmatch(run_id) for run_id in ids)


def test_new_run_id_carries_the_creation_time() -> None:
    before = time.time_ns() // 1_000_000
    first = new_run_id()
    time.sleep(0.003)
    second = new_run_id()
    after = time.time_ns() // 1_000_000

    def millis(run_id: str) -> int:
        value = 0
        for char in run_id.removeprefix("run_")[:10]:
            value = value * 32 + CROCKFORD.index(char)
        return value

    assert before <= millis(first) < millis(second) <= after
    assert first < second


def test_new_run_id_prefix() -> None:
    assert re.fullmatch(r"job-[0-9A-Z]{26}", new_run_id("job-"))
