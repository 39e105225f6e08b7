"""The command rules' scenarios, replayed through a `CommandHandler` over the store under test.

Every rule lives in `decide`, but a rule only holds if the store keeps the history it was decided
on: a store that reorders, drops or duplicates events, or loses a token claim, fails the scenario
of the rule it breaks. Each scenario ends by checking every run's index rows against the kernel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta

from runfold.conformance._core import Context, check
from runfold.conformance.builders import (
    HOUR,
    MINUTE,
    T0,
    holder,
    kernel_summary,
    raises,
    wakeup,
)
from runfold.handler import CommandHandler, Outcome
from runfold.kernel import (
    CancelRun,
    Command,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateRun,
    CreateStep,
    CreateWait,
    DisposeHook,
    EntityConflict,
    HookNotFound,
    LazyStep,
    RecordLog,
    Rejection,
    RequestCancel,
    RetryPolicy,
    RetryStep,
    RunExpired,
    RunNotFound,
    SetAttributes,
    StartRun,
    StartStep,
    TerminalState,
    TooEarly,
)
from runfold.stores.protocol import EventStore

RUN = "r1"
"""The run each scenario is about."""
OTHER = "r2"
"""A second run: the other claimant of a token."""


class _Clock:
    """The scenario's clock: it only moves when told."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class _Scenario:
    """A handler over the store under test, with assertions phrased like the rules."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.clock = _Clock()
        self.handler = CommandHandler(store, clock=self.clock)

    def advance(self, delta: timedelta) -> None:
        self.clock.now += delta

    async def accepts(self, command: Command, *kinds: str, run_id: str = RUN) -> Outcome:
        """`command` is accepted and appends exactly events of `kinds` (none: a no-op), which the
        store then holds at the head of the run."""
        outcome = await self.handler.execute(run_id, command)
        got = [e.event.event_type for e in outcome.appended]
        assert got == list(kinds), f"{type(command).__name__} on {run_id} appended {got}"
        if kinds:
            stored = await self.store.read(run_id, descending=True, limit=len(kinds))
            assert list(reversed(stored)) == list(outcome.appended), (
                f"{type(command).__name__}: the store does not hold what was appended"
            )
        return outcome

    async def refuses(self, command: Command, error: type[Rejection], run_id: str = RUN) -> None:
        """`command` is refused with exactly `error` and nothing is written."""
        head = await self.store.head(run_id)
        exc = await raises(Rejection, self.handler.execute(run_id, command), type(command).__name__)
        assert type(exc) is error, (
            f"{type(command).__name__}: expected {error.__name__}, got {exc!r}"
        )
        assert await self.store.head(run_id) == head, "a refused command wrote events"

    async def history(self, run_id: str = RUN) -> list[str]:
        """The wire names of the run's stored events."""
        return [e.event.event_type for e in await self.store.read(run_id)]

    async def assert_indexes(self, run_ids: Sequence[str]) -> None:
        """Every run's summary agrees with the kernel's derivation from its stored history."""
        for run_id in run_ids:
            summary = await kernel_summary(self.store, run_id)
            assert summary is not None, f"run {run_id} has no history"
            assert await self.store.get_runs([run_id]) == [summary], f"summary of {run_id}"


def _create(**attributes: str) -> CreateRun:
    return CreateRun(workflow_name="wf", input=b"in", attributes=attributes)


@check("rules")
async def rule_run_lifecycle(ctx: Context, store: EventStore) -> None:
    """Run rules: `CreateRun` once (again: `EntityConflict`); `StartRun` on pending starts it and
    on running is a no-op; `CompleteRun` ends it; afterwards `StartRun` is `RunExpired` and
    another `CompleteRun` is `TerminalState` (the same one again a no-op); the history is
    exactly the accepted events."""
    s = _Scenario(store)
    await s.accepts(_create(), "run_created")
    await s.refuses(_create(), EntityConflict)
    s.advance(MINUTE)
    await s.accepts(StartRun(), "run_started")
    await s.accepts(StartRun())
    await s.accepts(RecordLog(level="info", message="hi"), "log_recorded")
    await s.accepts(CompleteRun(output=b"out"), "run_completed")
    await s.refuses(StartRun(), RunExpired)
    await s.refuses(CompleteRun(output=b"again"), TerminalState)
    await s.accepts(CompleteRun(output=b"out"))  # the same end, sent again: a no-op
    await s.refuses(RecordLog(level="info", message="late"), TerminalState)
    assert await s.history() == ["run_created", "run_started", "log_recorded", "run_completed"]
    snapshot = await s.handler.snapshot(RUN)
    assert (snapshot.status, snapshot.output, snapshot.completed_at) == (
        "completed",
        b"out",
        T0 + MINUTE,
    )
    await s.assert_indexes([RUN])


@check("rules")
async def rule_resilient_start(ctx: Context, store: EventStore) -> None:
    """`StartRun(create=…)` on a run with no history creates and starts it in one append, after
    which `CreateRun` is `EntityConflict`; `StartRun()` without `create` on an unknown run is
    `RunNotFound`."""
    s = _Scenario(store)
    await s.refuses(StartRun(), RunNotFound)
    await s.accepts(StartRun(create=_create()), "run_created", "run_started")
    await s.refuses(_create(), EntityConflict)
    assert (await s.handler.snapshot(RUN)).status == "running"
    await s.assert_indexes([RUN])


@check("rules")
async def rule_cancellation(ctx: Context, store: EventStore) -> None:
    """Cancellation rules: `RequestCancel` makes a running run cancelling and cancels its open
    steps, waits and hooks (tokens released, wakeups gone); the same reason again is a no-op,
    another reason `EntityConflict`; `CompleteRun` is refused; cleanup steps may still be
    created; `CancelRun` ends it and is then idempotent."""
    s = _Scenario(store)
    await s.accepts(StartRun(create=_create()), "run_created", "run_started")
    await s.accepts(CreateStep(step_id="work", step_name="n", input=b""), "step_created")
    await s.accepts(CreateWait(wait_id="w", resume_at=T0 + HOUR), "wait_created")
    await s.accepts(CreateHook(hook_id="h", token="tok"), "hook_created")
    assert await store.find_hook("tok", now=T0) == holder(RUN, "h")
    s.advance(MINUTE)
    cancelling = await s.accepts(RequestCancel(reason="stop"), "cancel_requested")
    assert cancelling.snapshot.status == "cancelling"
    assert cancelling.snapshot.steps["work"].status == "cancelled"
    assert await store.find_hook("tok", now=s.clock.now) is None
    assert await store.next_wakeup() is None
    await s.accepts(RequestCancel(reason="stop"))
    await s.refuses(RequestCancel(reason="other"), EntityConflict)
    await s.refuses(CompleteRun(output=b""), TerminalState)
    await s.accepts(CreateStep(step_id="cleanup", step_name="n", input=b""), "step_created")
    await s.accepts(CancelRun(reason="stop"), "run_cancelled")
    await s.accepts(CancelRun(reason="stop"))
    assert (await s.handler.snapshot(RUN)).status == "cancelled"
    await s.assert_indexes([RUN])


@check("rules")
async def rule_attributes(ctx: Context, store: EventStore) -> None:
    """Attribute rules: `SetAttributes` merges into the run's attributes (initial ones included,
    None removes a key) and the summary shows the result; a seen `write_id` is a no-op (the
    first write stands, even on an ended run); a new write on an ended run is `TerminalState`."""
    s = _Scenario(store)
    await s.accepts(
        StartRun(create=_create(region="eu", tier="free")), "run_created", "run_started"
    )
    await s.accepts(
        SetAttributes(changes={"tier": "pro", "region": None}, write_id="w1"), "attributes_set"
    )
    await s.accepts(SetAttributes(changes={"other": "x"}, write_id="w1"))
    [summary] = await store.get_runs([RUN])
    assert summary is not None and dict(summary.attributes) == {"tier": "pro"}
    await s.accepts(CompleteRun(output=b""), "run_completed")
    await s.accepts(SetAttributes(changes={"other": "x"}, write_id="w1"))
    await s.refuses(SetAttributes(changes={"late": "x"}), TerminalState)
    await s.assert_indexes([RUN])


_RETRY = RetryPolicy(max_attempts=5)


@check("rules")
async def rule_step_retry_and_redelivery(ctx: Context, store: EventStore) -> None:
    """Step rules: a lazy `StartStep` creates and starts an unknown step (the caller won); a
    `RetryStep` with `retry_after` makes a retry wakeup and an earlier `StartStep` is `TooEarly`;
    once due the next attempt starts, a crash redelivery starts yet another, `CompleteStep`
    completes it, and a second outcome is `TerminalState` (the same one again a no-op)."""
    s = _Scenario(store)
    await s.accepts(StartRun(create=_create()), "run_created", "run_started")
    lazy = LazyStep(step_name="charge", input=b"card", retry=_RETRY)
    first = await s.accepts(StartStep(step_id="s", lazy=lazy), "step_created", "step_started")
    assert first.created_step
    due = T0 + 10 * MINUTE
    await s.accepts(RetryStep(step_id="s", error=b"timeout", retry_after=due), "step_retrying")
    assert await store.next_wakeup() == wakeup(RUN, "retry", "s", due)
    await s.refuses(StartStep(step_id="s"), TooEarly)
    s.advance(10 * MINUTE)
    assert await store.due_wakeups(s.clock.now) == [wakeup(RUN, "retry", "s", due)]
    second = await s.accepts(StartStep(step_id="s"), "step_started")
    assert second.snapshot.steps["s"].attempt == 2
    assert await store.next_wakeup() is None
    redelivered = await s.accepts(StartStep(step_id="s"), "step_started")
    assert redelivered.snapshot.steps["s"].attempt == 3
    await s.accepts(CompleteStep(step_id="s", output=b"ok"), "step_completed")
    await s.refuses(CompleteStep(step_id="s", output=b"again"), TerminalState)
    await s.accepts(CompleteStep(step_id="s", output=b"ok"))  # the same outcome again: a no-op
    await s.assert_indexes([RUN])


@check("rules")
async def rule_lazy_start_race(ctx: Context, store: EventStore) -> None:
    """Concurrent lazy starts of one step by separate handlers: exactly one creates it (and runs
    the body); every other gets `EntityConflict`; the store holds one `step_created`."""
    s = _Scenario(store)
    await s.accepts(StartRun(create=_create()), "run_created", "run_started")
    handlers = [CommandHandler(store, clock=s.clock) for _ in range(6)]
    lazy = StartStep(step_id="s", lazy=LazyStep(step_name="n", input=b""))
    outcomes = await asyncio.gather(
        *(h.execute(RUN, lazy) for h in handlers), return_exceptions=True
    )
    winners = [o for o in outcomes if isinstance(o, Outcome)]
    assert len(winners) == 1 and winners[0].created_step, f"{len(winners)} handlers won"
    assert all(type(o) is EntityConflict for o in outcomes if not isinstance(o, Outcome))
    assert await s.history() == ["run_created", "run_started", "step_created", "step_started"]
    await s.assert_indexes([RUN])


@check("rules")
async def rule_late_step_outcome(ctx: Context, store: EventStore) -> None:
    """A running step may still complete after its run ended (the outcome is appended to the
    ended run), while a step that never started cannot (`RunExpired`)."""
    s = _Scenario(store)
    await s.accepts(StartRun(create=_create()), "run_created", "run_started")
    await s.accepts(
        StartStep(step_id="busy", lazy=LazyStep(step_name="n", input=b"")),
        "step_created",
        "step_started",
    )
    await s.accepts(CreateStep(step_id="idle", step_name="n", input=b""), "step_created")
    await s.accepts(CompleteRun(output=b""), "run_completed")
    s.advance(MINUTE)
    await s.accepts(CompleteStep(step_id="busy", output=b"late"), "step_completed")
    await s.refuses(CompleteStep(step_id="idle", output=b""), RunExpired)
    snapshot = await s.handler.snapshot(RUN)
    assert (snapshot.status, snapshot.steps["busy"].output) == ("completed", b"late")
    await s.assert_indexes([RUN])


@check("rules")
async def rule_wait_wakeups(ctx: Context, store: EventStore) -> None:
    """Wait rules: `CreateWait` makes a wait wakeup at `resume_at` (next to the run's deadline
    wakeup); `CompleteWait` completes it (due or not) and the wakeup goes; completing it again is
    a no-op; when the run ends the deadline wakeup goes too."""
    s = _Scenario(store)
    deadline = T0 + 2 * HOUR
    create = CreateRun(workflow_name="wf", input=b"", deadline=deadline)
    await s.accepts(StartRun(create=create), "run_created", "run_started")
    await s.accepts(CreateWait(wait_id="w", resume_at=T0 + HOUR), "wait_created")
    await s.refuses(CreateWait(wait_id="w", resume_at=T0 + HOUR), EntityConflict)
    assert await store.due_wakeups(deadline) == [
        wakeup(RUN, "wait", "w", T0 + HOUR),
        wakeup(RUN, "deadline", RUN, deadline),
    ]
    assert await store.due_wakeups(T0 + HOUR - timedelta(microseconds=1)) == []
    await s.accepts(CompleteWait(wait_id="w"), "wait_completed")
    await s.accepts(CompleteWait(wait_id="w"))  # completed already: a no-op
    assert await store.next_wakeup() == wakeup(RUN, "deadline", RUN, deadline)
    await s.accepts(CompleteRun(output=b""), "run_completed")
    assert await store.next_wakeup() is None
    await s.assert_indexes([RUN])


@check("rules")
async def rule_hook_delivery(ctx: Context, store: EventStore) -> None:
    """Hook rules: `deliver(token)` finds the live hook through the store and records a
    delivery; the same delivery id and payload again is a no-op, another payload
    `EntityConflict`; after `DisposeHook` the token finds nothing (`HookNotFound`) and disposing
    again is a no-op."""
    s = _Scenario(store)
    await s.accepts(StartRun(create=_create()), "run_created", "run_started")
    await s.accepts(CreateHook(hook_id="h", token="tok"), "hook_created")
    delivered = await s.handler.deliver("tok", b"payload", delivery_id="d1")
    assert [e.event.event_type for e in delivered.appended] == ["hook_received"]
    again = await s.handler.deliver("tok", b"payload", delivery_id="d1")
    assert again.appended == ()
    await raises(
        EntityConflict,
        s.handler.deliver("tok", b"other", delivery_id="d1"),
        "a delivery id again with another payload",
    )
    await s.accepts(DisposeHook(hook_id="h"), "hook_disposed")
    await raises(
        HookNotFound, s.handler.deliver("tok", b"late"), "a delivery to a disposed hook's token"
    )
    await s.accepts(DisposeHook(hook_id="h"))  # disposed already: a no-op
    assert await s.history() == [
        "run_created",
        "run_started",
        "hook_created",
        "hook_received",
        "hook_disposed",
    ]
    await s.assert_indexes([RUN])


@check("rules")
async def rule_hook_token_conflict(ctx: Context, store: EventStore) -> None:
    """A hook token is held by one live hook across runs: another run's `CreateHook` with it
    records `hook_conflict` (the store's `TokenConflict` makes the handler decide again); once
    the holder's run ends, the token is free and the same command creates the hook."""
    s = _Scenario(store)
    for run_id in (RUN, OTHER):
        await s.accepts(StartRun(create=_create()), "run_created", "run_started", run_id=run_id)
    await s.accepts(CreateHook(hook_id="h", token="tok"), "hook_created")
    conflict = await s.accepts(CreateHook(hook_id="h", token="tok"), "hook_conflict", run_id=OTHER)
    assert conflict.snapshot.active_hooks() == ()
    assert await store.find_hook("tok", now=s.clock.now) == holder(RUN, "h")
    await s.accepts(CompleteRun(output=b""), "run_completed")
    await s.accepts(CreateHook(hook_id="h2", token="tok"), "hook_created", run_id=OTHER)
    assert await store.find_hook("tok", now=s.clock.now) == holder(OTHER, "h2")
    await s.assert_indexes([RUN, OTHER])


@check("rules")
async def rule_retained_hook_token(ctx: Context, store: EventStore) -> None:
    """A hook with `retain_token_until` keeps its token after its run ended: a delivery is
    `RunExpired`, another run's claim records `hook_conflict`; at the deadline the token is free
    and the other run creates its hook."""
    s = _Scenario(store)
    for run_id in (RUN, OTHER):
        await s.accepts(StartRun(create=_create()), "run_created", "run_started", run_id=run_id)
    until = T0 + HOUR
    await s.accepts(CreateHook(hook_id="h", token="tok", retain_token_until=until), "hook_created")
    await s.accepts(CompleteRun(output=b""), "run_completed")
    assert await store.find_hook("tok", now=s.clock.now) == holder(RUN, "h", until)
    await raises(
        RunExpired,
        s.handler.deliver("tok", b"late"),
        "a delivery to a retained hook of an ended run",
    )
    await s.accepts(CreateHook(hook_id="early", token="tok"), "hook_conflict", run_id=OTHER)
    s.advance(HOUR)
    await s.accepts(CreateHook(hook_id="late", token="tok"), "hook_created", run_id=OTHER)
    assert await store.find_hook("tok", now=s.clock.now) == holder(OTHER, "late")
    await s.assert_indexes([RUN, OTHER])


@check("rules")
async def rule_concurrent_commands(ctx: Context, store: EventStore) -> None:
    """Many handlers executing commands on one run at once all succeed (the handler retries on
    `SequenceConflict`): the history holds every event exactly once, densely numbered, and each
    caller's `missed` events are exactly what others appended before it."""
    s = _Scenario(store)
    start = await s.accepts(StartRun(create=_create()), "run_created", "run_started")
    known = start.snapshot.last_sequence
    handlers = [CommandHandler(store, clock=s.clock) for _ in range(8)]
    outcomes = await asyncio.gather(
        *(
            h.execute(RUN, RecordLog(level="info", message=f"writer {n}"), known_sequence=known)
            for n, h in enumerate(handlers)
        )
    )
    history = await store.read(RUN)
    assert [e.sequence for e in history] == list(range(1, 11))
    messages = sorted(getattr(e.event, "message", "") for e in history[2:])
    assert messages == sorted(f"writer {n}" for n in range(8))
    for outcome in outcomes:
        [mine] = outcome.appended
        assert list(outcome.missed) == history[known : mine.sequence - 1]
    await s.assert_indexes([RUN])
