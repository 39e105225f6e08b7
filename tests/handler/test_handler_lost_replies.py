"""Every command, its append's reply lost: recorded once, answered with the outcome it had.

The store is a real SQLite file behind `LosingReplies`, which writes an append and then loses
its reply (`CommitUnknown`), and can stay unreachable for a while after: what a cut connection
does to a database client. Three ways a command is executed again after that:

- within the same call (the store answers again before the retry budget ends);
- by a later call on the same handler, after the first gave up with `CommitUnknown`;
- by another handler (another process, say), which knows nothing of the first: the kernel
  decides the command again on the run as it is, recognises it as applied by what it recorded
  (its content, or its identity: `log_id`, `write_id`, `start_id`, `delivery_id`), and `CASES`
  says what each command yields; only a creation by id is refused as existing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from runfold import CommandHandler
from runfold.commands import (
    ClaimRun,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateRun,
    CreateStep,
    CreateWait,
    DisposeHook,
    FailRun,
    FailStep,
    LazyStep,
    LinkChild,
    ReceiveHook,
    RecordLog,
    RecordProgress,
    ReleaseRun,
    RequestCancel,
    RetryStep,
    SetAttributes,
    StartRun,
    StartStep,
    TimeOutRun,
)
from runfold.errors import (
    CommitUnknown,
    EntityConflict,
    StoreUnavailable,
)
from runfold.kernel import CancelRun, CancelStep, Command, Event
from runfold.store_retry import StoreRetry
from runfold.stores import MemoryStore, SQLiteStore
from runfold.stores.protocol import EventStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUN = "r"
CREATE = CreateRun(workflow_name="wf", input=b"")
STARTED: list[Command] = [StartRun(create=CREATE)]
STEP = [*STARTED, CreateStep(step_id="s", step_name="n", input=b"")]
RUNNING = [*STEP, StartStep(step_id="s")]
WAIT = [*STARTED, CreateWait(wait_id="w", resume_at=T0)]
HOOK_AT = T0 + timedelta(days=3)
HOOK = [*STARTED, CreateHook(hook_id="h", token="t", retain_token_until=HOOK_AT)]

NOOP = "no-op"
TWICE = "recorded twice"
CASES: dict[str, tuple[list[Command], Command, Any]] = {
    # name: (the run before, the command, what another handler's retry yields)
    "CreateRun": ([], CREATE, EntityConflict),
    "StartRun(create)": ([], StartRun(create=CREATE), NOOP),
    "StartRun": ([CREATE], StartRun(), NOOP),
    "CompleteRun": (STARTED, CompleteRun(output=b"o"), NOOP),
    "FailRun": (STARTED, FailRun(error=b"e"), NOOP),
    "RequestCancel": (STARTED, RequestCancel(), NOOP),
    "CancelRun": (STARTED, CancelRun(), NOOP),
    "TimeOutRun": (STARTED, TimeOutRun(deadline=T0), NOOP),
    "SetAttributes": (STARTED, SetAttributes(changes={"k": "v"}), NOOP),
    "SetAttributes(write_id)": (STARTED, SetAttributes(changes={"k": "v"}, write_id="w1"), NOOP),
    "RecordProgress": (STARTED, RecordProgress(progress_id="p", completed=1), NOOP),
    "LinkChild": (STARTED, LinkChild(reference_id="c", kind="k", operation_id="o"), NOOP),
    "RecordLog": (STARTED, RecordLog(level="info", message="m"), NOOP),
    "RecordLog(log_id=None)": (STARTED, RecordLog(level="info", message="m", log_id=None), TWICE),
    "RecordLog(log_id)": (STARTED, RecordLog(level="info", message="m", log_id="l"), NOOP),
    "ClaimRun": (STARTED, ClaimRun(owner_id="w"), NOOP),
    "ReleaseRun": ([*STARTED, ClaimRun(owner_id="w")], ReleaseRun(owner_id="w"), NOOP),
    "CreateStep": (STARTED, CreateStep(step_id="s", step_name="n", input=b""), EntityConflict),
    "StartStep": (STEP, StartStep(step_id="s"), TWICE),
    "StartStep(start_id)": (STEP, StartStep(step_id="s", start_id="a1"), NOOP),
    "StartStep(lazy)": (
        STARTED,
        StartStep(step_id="s", lazy=LazyStep(step_name="n", input=b"")),
        EntityConflict,
    ),
    "StartStep(lazy, start_id)": (
        STARTED,
        StartStep(step_id="s", lazy=LazyStep(step_name="n", input=b""), start_id="a1"),
        NOOP,
    ),
    "CompleteStep": (RUNNING, CompleteStep(step_id="s", output=b"o"), NOOP),
    "FailStep": (RUNNING, FailStep(step_id="s", error=b"e"), NOOP),
    "RetryStep": (RUNNING, RetryStep(step_id="s", error=b"e"), NOOP),
    "CancelStep": (RUNNING, CancelStep(step_id="s"), NOOP),
    "CreateWait": (STARTED, CreateWait(wait_id="w", resume_at=T0), EntityConflict),
    "CompleteWait": (WAIT, CompleteWait(wait_id="w"), NOOP),
    "CreateHook": (
        STARTED,
        CreateHook(hook_id="h", token="t", retain_token_until=HOOK_AT),
        EntityConflict,
    ),
    "ReceiveHook": (HOOK, ReceiveHook(hook_id="h", payload=b"p"), TWICE),
    "ReceiveHook(delivery_id)": (
        HOOK,
        ReceiveHook(hook_id="h", payload=b"p", delivery_id="d"),
        NOOP,
    ),
    "DisposeHook": (HOOK, DisposeHook(hook_id="h"), NOOP),
}
"""Every command class at least once (`test_the_table_has_every_command` checks)."""


class LosingReplies:
    """A real store whose next append is written and its reply then lost (`lose_next`), after
    which every call fails with `StoreUnavailable` for `outage` more calls (or until `heal`)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.lose_next = False
        self.outage = 0
        self.then_down = 0
        self.lost = 0

    def lose_reply(self, then_down: int) -> None:
        """Write the next append, lose its reply, then fail the next `then_down` calls."""
        self.lose_next, self.then_down = True, then_down

    def heal(self) -> None:
        self.outage = 0

    def _fault(self) -> None:
        if self.outage:
            self.outage -= 1
            raise StoreUnavailable("the connection was lost (test)")

    async def append_if_sequence(self, run_id: str, expected: int, events: Any, **kw: Any) -> Any:
        self._fault()
        written = await self.store.append_if_sequence(run_id, expected, events, **kw)
        if self.lose_next:
            self.lose_next, self.outage = False, self.then_down
            self.lost += 1
            raise CommitUnknown(run_id, expected, "the reply was lost (test)")
        return written

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if not callable(found):
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._fault()
            return await found(*args, **kwargs)

        return call


def fast(budget: float) -> StoreRetry:
    return StoreRetry(budget=budget, first_pause=0.005, max_pause=0.02)


async def expected(setup: Sequence[Command], command: Command) -> tuple[list[Event], bool]:
    """What `command` appends, and whether it created a step, with no fault at all."""
    handler = CommandHandler(MemoryStore(), clock=lambda: T0)
    for before in setup:
        await handler.execute(RUN, before)
    outcome = await handler.execute(RUN, command)
    return [e.event for e in outcome.appended], outcome.created_step


async def on_sqlite(
    tmp_path: Path, name: str, check: Callable[[LosingReplies, CommandHandler], Awaitable[None]]
) -> None:
    path = tmp_path / f"{name.replace('(', '-').replace(')', '')}.db"
    async with await SQLiteStore.open(path) as store:
        losing = LosingReplies(store)
        handler = CommandHandler(cast(EventStore, losing), clock=lambda: T0, store_retry=fast(5.0))
        setup, _, _ = CASES[name]
        for before in setup:
            await handler.execute(RUN, before)
        await check(losing, handler)


def test_the_table_has_every_command() -> None:
    from runfold.kernel.decide import _RULES

    assert {type(command) for _, command, _ in CASES.values()} == set(_RULES)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_lost_reply_within_the_call_returns_the_outcome_it_had(
    tmp_path: Path, name: str
) -> None:
    setup, command, _ = CASES[name]
    events, created = await expected(setup, command)

    async def check(losing: LosingReplies, handler: CommandHandler) -> None:
        before = len(await losing.store.read(RUN))
        losing.lose_reply(then_down=3)
        outcome = await handler.execute(RUN, command)
        assert losing.lost == 1
        assert [e.event for e in outcome.appended] == events
        assert outcome.created_step is created
        stored = [e.event for e in await losing.store.read(RUN)]
        assert stored[before:] == events  # once

    await on_sqlite(tmp_path, name, check)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_call_that_gave_up_in_doubt_is_answered_by_the_next_call(
    tmp_path: Path, name: str
) -> None:
    setup, command, again = CASES[name]
    events, created = await expected(setup, command)

    async def check(losing: LosingReplies, handler: CommandHandler) -> None:
        before = len(await losing.store.read(RUN))
        impatient = CommandHandler(
            cast(EventStore, losing), clock=lambda: T0, store_retry=fast(0.05)
        )
        if setup:
            await impatient.lookup(RUN)  # its cache as warm as the other's
        losing.lose_reply(then_down=10**6)
        with pytest.raises(CommitUnknown):
            await impatient.execute(RUN, command)
        assert losing.lost == 1
        losing.heal()
        # The same handler, the same command: the append it kept is recognised.
        outcome = await impatient.execute(RUN, command)
        assert [e.event for e in outcome.appended] == events
        assert outcome.created_step is created
        stored = [e.event for e in await losing.store.read(RUN)]
        assert stored[before:] == events  # once
        # Another handler, knowing nothing of it, decides it anew on the run as it is.
        if isinstance(again, type):
            with pytest.raises(again):
                await CommandHandler(losing.store, clock=lambda: T0).execute(RUN, command)
        else:
            other = await CommandHandler(losing.store, clock=lambda: T0).execute(RUN, command)
            assert len(other.appended) == (len(events) if again == TWICE else 0)
            if again == NOOP:  # the outcome it had: a lazy start's caller runs the body
                assert other.created_step is created

    await on_sqlite(tmp_path, name, check)
