"""A command applied once and sent again by another handler: its outcome, recorded once.

Handler A's append is written and its reply lost until A gives up (`CommitUnknown`); handler
B, which shares nothing with A but the store (another process, say), is then given the same
command. The kernel recognises it as applied by what the history holds (its content, or the
identity it carries: `RecordLog.log_id`, which every `RecordLog` has unless told otherwise,
`SetAttributes.write_id`, `StartStep.start_id`), so B gets the outcome A would have had, and
nothing is recorded twice. Every store of the suite, through encode -> append -> read ->
replay: the stored history folds into the snapshot B returns.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest

from runfold import CommandHandler
from runfold.commands import (
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateStep,
    CreateWait,
    DisposeHook,
    FailRun,
    FailStep,
    LazyStep,
    RecordLog,
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
    TerminalState,
)
from runfold.kernel import CancelStep, Command, CreateRun, project_run
from runfold.store_retry import StoreRetry
from runfold.stores.protocol import EventStore
from tests.conftest import T0

RUN = "r"
STARTED: list[Command] = [StartRun(create=CreateRun(workflow_name="wf", input=b""))]
STEP = [*STARTED, CreateStep(step_id="s", step_name="n", input=b"")]
RUNNING = [*STEP, StartStep(step_id="s")]
LAZY = LazyStep(step_name="n", input=b"")

CASES: dict[str, tuple[list[Command], Command, bool]] = {
    # name: (the run before, the command, whether its outcome says it created a step)
    "CompleteRun": (STARTED, CompleteRun(output=b"o"), False),
    "FailRun": (STARTED, FailRun(error=b"e", error_code="E1"), False),
    "TimeOutRun": (STARTED, TimeOutRun(deadline=T0), False),
    "SetAttributes": (STARTED, SetAttributes(changes={"k": "v", "gone": None}), False),
    "SetAttributes(write_id)": (STARTED, SetAttributes(changes={"k": "v"}, write_id="w1"), False),
    "RecordLog": (STARTED, RecordLog(level="info", message="m"), False),
    "StartStep(start_id)": (STEP, StartStep(step_id="s", start_id="a-1"), False),
    "StartStep(lazy, start_id)": (STARTED, StartStep(step_id="s", lazy=LAZY, start_id="a-1"), True),
    "CompleteStep": (RUNNING, CompleteStep(step_id="s", output=b"o"), False),
    "FailStep": (RUNNING, FailStep(step_id="s", error=b"e"), False),
    "RetryStep": (RUNNING, RetryStep(step_id="s", error=b"e", retry_after=T0), False),
    "CancelStep": (RUNNING, CancelStep(step_id="s"), False),
    "CompleteWait": (
        [*STARTED, CreateWait(wait_id="w", resume_at=T0)],
        CompleteWait(wait_id="w"),
        False,
    ),
    "DisposeHook": (
        [*STARTED, CreateHook(hook_id="h", token="t", retain_token_until=T0 + timedelta(days=1))],
        DisposeHook(hook_id="h"),
        False,
    ),
}


class LosingReplies:
    """`store`, but the next append is written and its reply lost, and the store then stays
    unreachable: the handler that sent it gives up with `CommitUnknown`."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.lose_next = True
        self.down = False

    async def append_if_sequence(self, run_id: str, expected: int, events: Any, **kw: Any) -> Any:
        if self.down:
            raise StoreUnavailable("the connection was lost (test)")
        written = await self.store.append_if_sequence(run_id, expected, events, **kw)
        if self.lose_next:
            self.lose_next, self.down = False, True
            raise CommitUnknown(run_id, expected, "the reply was lost (test)")
        return written

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if not callable(found):
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailable("the connection was lost (test)")
            return await found(*args, **kwargs)

        return call


def impatient(store: Any) -> CommandHandler:
    return CommandHandler(
        cast(EventStore, store),
        clock=lambda: T0,
        store_retry=StoreRetry(budget=0.05, first_pause=0.005, max_pause=0.01),
    )


async def applied_by_a(store: EventStore, setup: list[Command], command: Command) -> int:
    """Set the run up, then have handler A send `command` and give up in doubt; the history's
    length before the command."""
    setting_up = CommandHandler(store, clock=lambda: T0)
    for before in setup:
        await setting_up.execute(RUN, before)
    before_length = len(await store.read(RUN))
    with pytest.raises(CommitUnknown):
        await impatient(LosingReplies(store)).execute(RUN, command)
    assert len(await store.read(RUN)) > before_length  # written, though A never heard so
    return before_length


@pytest.mark.parametrize("name", sorted(CASES))
async def test_another_handler_gets_the_outcome_the_command_had(
    store: EventStore, name: str
) -> None:
    setup, command, created = CASES[name]
    before_length = await applied_by_a(store, setup, command)
    written = await store.read(RUN)

    outcome = await CommandHandler(store, clock=lambda: T0 + timedelta(seconds=5)).execute(
        RUN, command
    )

    assert outcome.appended == ()  # recorded once: by A
    assert outcome.created_step is created  # a lazy start's caller still runs the body
    stored = await store.read(RUN)
    assert stored == written and len(stored) > before_length
    assert project_run(stored) == outcome.snapshot  # the outcome is what the history folds to


async def test_another_callers_lazy_start_is_still_a_conflict(store: EventStore) -> None:
    await applied_by_a(store, STARTED, StartStep(step_id="s", lazy=LAZY, start_id="a-1"))

    with pytest.raises(EntityConflict, match="another caller created it first"):
        await CommandHandler(store, clock=lambda: T0).execute(
            RUN, StartStep(step_id="s", lazy=LAZY, start_id="b-1")
        )


async def test_another_outcome_for_an_ended_step_is_still_refused(store: EventStore) -> None:
    await applied_by_a(store, RUNNING, CompleteStep(step_id="s", output=b"o"))

    with pytest.raises(TerminalState, match="in terminal state 'completed'"):
        await CommandHandler(store, clock=lambda: T0).execute(
            RUN, CompleteStep(step_id="s", output=b"other")
        )


async def test_two_log_commands_of_the_same_text_are_two_lines(store: EventStore) -> None:
    line = RecordLog(level="info", message="tick")
    await applied_by_a(store, STARTED, line)
    handler = CommandHandler(store, clock=lambda: T0)

    again = await handler.execute(RUN, line)
    other = await handler.execute(RUN, RecordLog(level="info", message="tick"))

    assert (len(again.appended), len(other.appended)) == (0, 1)
    assert other.snapshot.log_count == 2
    assert line.log_id is not None and line.log_id in other.snapshot.log_ids
