"""Examples of the wait and hook rules of `RULES.md`, through `CommandHandler` and the store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runfold import CommandHandler
from runfold.commands import (
    CancelRun,
    CompleteWait,
    CreateHook,
    CreateWait,
    DisposeHook,
    ReceiveHook,
    RequestCancel,
)
from runfold.errors import (
    EntityConflict,
    HookNotFound,
    InvalidCommand,
    NonDeterministic,
    Rejection,
    RunExpired,
    TerminalState,
    TokenConflict,
    WaitNotFound,
)
from runfold.events import (
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    WaitCompleted,
    WaitCreated,
)
from runfold.kernel import Delivery, HookHolder, WaitState, WakeupDue, run_index
from tests.conftest import T0, Clock
from tests.support.rules_helpers import (
    ENDINGS,
    LIVE,
    RUN,
    TERMINAL,
    assert_rejected,
    kinds,
    run_in_status,
    run_with,
)

OTHER = "r2"
WAIT = "w1"
RESUME_AT = T0 + timedelta(hours=2)
HOOK = "h1"
TOKEN = "tok-9f8e7d-secret"
HOUR = timedelta(hours=1)
LATER = timedelta(minutes=5)

DEFINE_WAIT = CreateWait(wait_id=WAIT, resume_at=RESUME_AT)
DEFINE_HOOK = CreateHook(hook_id=HOOK, token=TOKEN)
RETAINED_HOOK = CreateHook(hook_id=HOOK, token=TOKEN, retain_token_until=T0 + HOUR)


# --- CreateWait ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", LIVE)
async def test_create_wait_on_a_live_run(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_in_status(handler, status)
    clock.advance(LATER)

    outcome = await handler.execute(RUN, DEFINE_WAIT)

    assert [e.event for e in outcome.appended] == [WaitCreated(wait_id=WAIT, resume_at=RESUME_AT)]
    expected = WaitState(
        wait_id=WAIT,
        status="waiting",
        resume_at=RESUME_AT,
        created_at=T0 + LATER,
        completed_at=None,
    )
    assert outcome.snapshot.waits[WAIT] == expected
    assert outcome.snapshot.open_waits() == (expected,)
    assert WakeupDue(kind="wait", subject_id=WAIT, due_at=RESUME_AT) in outcome.snapshot.wakeups()


@pytest.mark.parametrize("status", TERMINAL)
async def test_create_wait_on_an_ended_run_is_terminal_state(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    await assert_rejected(
        handler,
        DEFINE_WAIT,
        TerminalState,
        "cannot create new entities on run",
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("completed", [False, True])
async def test_create_wait_again_is_an_entity_conflict(
    handler: CommandHandler, completed: bool
) -> None:
    setup = (DEFINE_WAIT, CompleteWait(wait_id=WAIT)) if completed else (DEFINE_WAIT,)
    await run_with(handler, "running", *setup)

    await assert_rejected(handler, DEFINE_WAIT, EntityConflict, repr(WAIT), "already exists")


async def test_create_wait_again_with_another_resume_at_is_non_deterministic(
    handler: CommandHandler,
) -> None:
    await run_with(handler, "running", DEFINE_WAIT)
    await assert_rejected(
        handler,
        CreateWait(wait_id=WAIT, resume_at=RESUME_AT + LATER),
        NonDeterministic,
        repr(WAIT),
        "another resume_at",
    )


# --- CompleteWait -------------------------------------------------------------------------------


async def test_completing_an_unknown_wait_is_wait_not_found(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(handler, CompleteWait(wait_id=WAIT), WaitNotFound, repr(WAIT))


async def test_completing_a_completed_wait_again_is_a_no_op(handler: CommandHandler) -> None:
    await run_with(handler, "running", DEFINE_WAIT, CompleteWait(wait_id=WAIT))
    before = await handler.history(RUN)

    outcome = await handler.execute(RUN, CompleteWait(wait_id=WAIT))

    assert outcome.appended == ()
    assert await handler.history(RUN) == before


async def test_completing_a_cancelled_wait_is_terminal_state(handler: CommandHandler) -> None:
    await run_with(handler, "running", DEFINE_WAIT)
    await handler.execute(RUN, RequestCancel())  # cancels the waiting wait
    await assert_rejected(
        handler, CompleteWait(wait_id=WAIT), TerminalState, "in terminal state 'cancelled'"
    )


@pytest.mark.parametrize("status", TERMINAL)
async def test_completing_a_wait_of_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str
) -> None:
    snap = await run_with(handler, status, DEFINE_WAIT)
    assert snap.waits[WAIT].status == "waiting"
    assert snap.wakeups() == ()  # an ended run has no wakeups

    await assert_rejected(
        handler,
        CompleteWait(wait_id=WAIT),
        RunExpired,
        f"cannot complete wait {WAIT!r}",
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("status", LIVE)
async def test_completing_a_waiting_wait_need_not_wait_until_it_is_due(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(handler, status, DEFINE_WAIT)
    clock.advance(LATER)  # still well before RESUME_AT

    outcome = await handler.execute(RUN, CompleteWait(wait_id=WAIT))

    assert [e.event for e in outcome.appended] == [WaitCompleted(wait_id=WAIT)]
    wait = outcome.snapshot.waits[WAIT]
    assert (wait.status, wait.completed_at) == ("completed", T0 + LATER)
    assert outcome.snapshot.open_waits() == ()
    assert [w for w in outcome.snapshot.wakeups() if w.kind == "wait"] == []


# --- CreateHook ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", LIVE)
async def test_create_hook_on_a_live_run(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_in_status(handler, status)
    clock.advance(LATER)
    command = CreateHook(
        hook_id=HOOK,
        token=TOKEN,
        metadata=b"meta",
        is_webhook=True,
        retain_token_until=clock.now + HOUR,
    )

    outcome = await handler.execute(RUN, command)

    assert [e.event for e in outcome.appended] == [
        HookCreated(
            hook_id=HOOK,
            token=TOKEN,
            metadata=b"meta",
            is_webhook=True,
            retain_token_until=T0 + LATER + HOUR,
        )
    ]
    hook = outcome.snapshot.hooks[HOOK]
    assert (hook.hook_id, hook.token, hook.status, hook.metadata, hook.is_webhook) == (
        HOOK,
        TOKEN,
        "active",
        b"meta",
        True,
    )
    assert (hook.retain_token_until, hook.created_at, hook.deliveries) == (
        T0 + LATER + HOUR,
        T0 + LATER,
        (),
    )
    assert outcome.snapshot.active_hooks() == (hook,)
    holder = await handler.store.find_hook(TOKEN, now=clock.now)
    assert holder == HookHolder(run_id=RUN, hook_id=HOOK, retained_until=None)


@pytest.mark.parametrize(
    "retention",
    [timedelta(days=30, microseconds=1), timedelta(days=365)],
    ids=["30 days and a microsecond", "a year"],
)
async def test_create_hook_retaining_its_token_too_long_is_invalid(
    handler: CommandHandler, clock: Clock, retention: timedelta
) -> None:
    await run_in_status(handler, "running")
    clock.advance(LATER)
    command = CreateHook(hook_id=HOOK, token=TOKEN, retain_token_until=clock.now + retention)

    await assert_rejected(
        handler, command, InvalidCommand, "hook token retention cannot exceed 30 days"
    )
    assert HOOK not in (await handler.snapshot(RUN)).hooks
    assert await handler.store.find_hook(TOKEN, now=clock.now) is None


async def test_create_hook_may_retain_its_token_for_exactly_30_days(
    handler: CommandHandler, clock: Clock
) -> None:
    await run_in_status(handler, "running")
    clock.advance(LATER)  # the bound counts from now, not from the run's start

    outcome = await handler.execute(
        RUN,
        CreateHook(hook_id=HOOK, token=TOKEN, retain_token_until=clock.now + timedelta(days=30)),
    )

    assert kinds(outcome) == ["hook_created"]


@pytest.mark.parametrize(
    ("token", "fragment"),
    [("", "non-empty"), ("t" * 1025, "over the 1024 character limit")],
    ids=["empty", "too long"],
)
async def test_create_hook_with_a_bad_token_is_invalid(
    handler: CommandHandler, token: str, fragment: str
) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(
        handler, CreateHook(hook_id=HOOK, token=token), InvalidCommand, "hook token", fragment
    )


@pytest.mark.parametrize("status", TERMINAL)
async def test_create_hook_on_an_ended_run_is_terminal_state(
    handler: CommandHandler, status: str
) -> None:
    await run_in_status(handler, status)
    await assert_rejected(
        handler,
        DEFINE_HOOK,
        TerminalState,
        "cannot create new entities on run",
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("token", [TOKEN, "another-token"])
@pytest.mark.parametrize("disposed", [False, True])
async def test_create_hook_with_an_existing_hook_id_is_an_entity_conflict(
    handler: CommandHandler, token: str, disposed: bool
) -> None:
    setup = (DEFINE_HOOK, DisposeHook(hook_id=HOOK)) if disposed else (DEFINE_HOOK,)
    await run_with(handler, "running", *setup)

    await assert_rejected(
        handler,
        CreateHook(hook_id=HOOK, token=token),
        EntityConflict,
        f"hook {HOOK!r}",
        "already exists",
    )


@pytest.mark.parametrize("holder_status", LIVE)
async def test_create_hook_with_a_token_another_run_holds_records_hook_conflict(
    handler: CommandHandler, clock: Clock, holder_status: str
) -> None:
    await run_with(handler, holder_status, DEFINE_HOOK, run_id=OTHER)
    if holder_status == "cancelling":  # cancel_requested cancelled that hook: hold it again
        await handler.execute(OTHER, CreateHook(hook_id="h-again", token=TOKEN))
    await run_in_status(handler, "running")

    outcome = await handler.execute(RUN, CreateHook(hook_id="mine", token=TOKEN))

    assert [e.event for e in outcome.appended] == [
        HookConflict(hook_id="mine", token=TOKEN, holder_run_id=OTHER)
    ]
    assert "mine" not in outcome.snapshot.hooks
    assert outcome.snapshot.active_hooks() == ()
    holder = await handler.store.find_hook(TOKEN, now=clock.now)
    assert holder is not None and holder.run_id == OTHER


async def test_create_hook_with_a_token_another_hook_of_the_run_holds_records_hook_conflict(
    handler: CommandHandler,
) -> None:
    await run_with(handler, "running", DEFINE_HOOK)

    outcome = await handler.execute(RUN, CreateHook(hook_id="h2", token=TOKEN))

    assert [e.event for e in outcome.appended] == [
        HookConflict(hook_id="h2", token=TOKEN, holder_run_id=RUN)
    ]
    assert list(outcome.snapshot.hooks) == [HOOK]


async def test_a_hook_id_that_met_a_conflict_may_be_created_later(
    handler: CommandHandler,
) -> None:
    await run_with(handler, "running", DEFINE_HOOK, run_id=OTHER)
    await run_with(handler, "running", CreateHook(hook_id="mine", token=TOKEN))
    await handler.execute(OTHER, DisposeHook(hook_id=HOOK))

    outcome = await handler.execute(RUN, CreateHook(hook_id="mine", token=TOKEN))

    assert kinds(outcome) == ["hook_created"]
    assert outcome.snapshot.hooks["mine"].status == "active"


@pytest.mark.parametrize("same_run", [True, False], ids=["same run", "another run"])
async def test_a_token_may_be_reused_after_its_hook_was_disposed(
    handler: CommandHandler, clock: Clock, same_run: bool
) -> None:
    await run_with(handler, "running", DEFINE_HOOK, DisposeHook(hook_id=HOOK))
    reuser = RUN if same_run else OTHER
    if not same_run:
        await run_in_status(handler, "running", run_id=OTHER)

    outcome = await handler.execute(reuser, CreateHook(hook_id="h2", token=TOKEN))

    assert [e.event for e in outcome.appended] == [HookCreated(hook_id="h2", token=TOKEN)]
    assert await handler.store.find_hook(TOKEN, now=clock.now) == HookHolder(
        run_id=reuser, hook_id="h2", retained_until=None
    )


@pytest.mark.parametrize("status", TERMINAL)
async def test_a_token_is_released_when_its_run_ends(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(handler, status, DEFINE_HOOK)
    assert await handler.store.find_hook(TOKEN, now=clock.now) is None
    await run_in_status(handler, "running", run_id=OTHER)

    outcome = await handler.execute(OTHER, DEFINE_HOOK)

    assert kinds(outcome) == ["hook_created"]


@pytest.mark.parametrize("status", TERMINAL)
async def test_a_retained_token_is_held_until_its_deadline(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(handler, status, RETAINED_HOOK)
    await run_in_status(handler, "running", run_id=OTHER)
    assert await handler.store.find_hook(TOKEN, now=clock.now) == HookHolder(
        run_id=RUN, hook_id=HOOK, retained_until=T0 + HOUR
    )

    conflict = await handler.execute(OTHER, CreateHook(hook_id="early", token=TOKEN))
    clock.advance(HOUR)  # the retention deadline: the token is free again
    created = await handler.execute(OTHER, CreateHook(hook_id="late", token=TOKEN))

    assert [e.event for e in conflict.appended] == [
        HookConflict(hook_id="early", token=TOKEN, holder_run_id=RUN)
    ]
    assert [e.event for e in created.appended] == [HookCreated(hook_id="late", token=TOKEN)]
    assert await handler.store.find_hook(TOKEN, now=clock.now) == HookHolder(
        run_id=OTHER, hook_id="late", retained_until=None
    )


async def test_request_cancel_releases_a_retained_token_and_cancel_run_keeps_it(
    handler: CommandHandler, clock: Clock
) -> None:
    # The decision of the rules reference: `cancel_requested` cancels every active hook (a
    # cancelled hook, like a disposed one, holds nothing), while `run_cancelled` is an ending
    # like any other, after which a retaining hook keeps its token until its deadline.
    await run_with(handler, "running", RETAINED_HOOK)
    kept = CreateHook(hook_id=HOOK, token="tok-kept", retain_token_until=T0 + HOUR)
    await run_with(handler, "running", kept, run_id=OTHER)
    await handler.execute(RUN, RequestCancel(reason="stop"))
    await handler.execute(OTHER, CancelRun(reason="stop"))
    clock.advance(LATER)

    assert await handler.store.find_hook(TOKEN, now=clock.now) is None
    assert await handler.store.find_hook("tok-kept", now=clock.now) == HookHolder(
        run_id=OTHER, hook_id=HOOK, retained_until=T0 + HOUR
    )
    await assert_rejected(
        handler, ReceiveHook(hook_id=HOOK, payload=b"p"), HookNotFound, repr(HOOK), "not found"
    )
    await assert_rejected(
        handler, ReceiveHook(hook_id=HOOK, payload=b"p"), RunExpired, run_id=OTHER
    )


# --- ReceiveHook --------------------------------------------------------------------------------


async def test_receiving_on_an_unknown_hook_is_hook_not_found(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(
        handler, ReceiveHook(hook_id=HOOK, payload=b"p"), HookNotFound, repr(HOOK), "not found"
    )


@pytest.mark.parametrize("ended_by", ["disposed", "cancelled"])
async def test_receiving_on_a_hook_that_left_active_is_hook_not_found(
    handler: CommandHandler, ended_by: str
) -> None:
    await run_with(handler, "running", DEFINE_HOOK)
    await handler.execute(
        RUN, DisposeHook(hook_id=HOOK) if ended_by == "disposed" else RequestCancel()
    )
    assert (await handler.snapshot(RUN)).hooks[HOOK].status == ended_by

    await assert_rejected(
        handler, ReceiveHook(hook_id=HOOK, payload=b"p"), HookNotFound, repr(HOOK)
    )


@pytest.mark.parametrize("status", TERMINAL)
async def test_receiving_on_a_retaining_hook_of_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str
) -> None:
    await run_with(handler, status, RETAINED_HOOK)
    await assert_rejected(
        handler,
        ReceiveHook(hook_id=HOOK, payload=b"p"),
        RunExpired,
        repr(HOOK),
        f"in terminal state {status!r}",
    )


@pytest.mark.parametrize("retained", [False, True], ids=["not retained", "retention over"])
@pytest.mark.parametrize("status", TERMINAL)
async def test_receiving_on_a_released_hook_of_an_ended_run_is_hook_not_found(
    handler: CommandHandler, clock: Clock, status: str, retained: bool
) -> None:
    await run_with(handler, status, RETAINED_HOOK if retained else DEFINE_HOOK)
    clock.advance(HOUR)

    await assert_rejected(
        handler, ReceiveHook(hook_id=HOOK, payload=b"p"), HookNotFound, repr(HOOK)
    )


@pytest.mark.parametrize("status", LIVE)
async def test_receiving_appends_a_delivery(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(handler, status, DEFINE_HOOK)
    clock.advance(LATER)

    first = await handler.execute(RUN, ReceiveHook(hook_id=HOOK, payload=b"a", delivery_id="d1"))
    clock.advance(LATER)
    second = await handler.execute(RUN, ReceiveHook(hook_id=HOOK, payload=b"b"))
    third = await handler.execute(RUN, ReceiveHook(hook_id=HOOK, payload=b"b"))

    assert [e.event for e in first.appended + second.appended + third.appended] == [
        HookReceived(hook_id=HOOK, payload=b"a", delivery_id="d1"),
        HookReceived(hook_id=HOOK, payload=b"b"),
        HookReceived(hook_id=HOOK, payload=b"b"),  # no delivery id: nothing to deduplicate on
    ]
    hook = third.snapshot.hooks[HOOK]
    assert hook.status == "active"
    assert hook.deliveries == (
        Delivery(
            sequence=first.appended[0].sequence,
            delivery_id="d1",
            payload=b"a",
            received_at=T0 + LATER,
        ),
        Delivery(
            sequence=second.appended[0].sequence,
            delivery_id=None,
            payload=b"b",
            received_at=T0 + 2 * LATER,
        ),
        Delivery(
            sequence=third.appended[0].sequence,
            delivery_id=None,
            payload=b"b",
            received_at=T0 + 2 * LATER,
        ),
    )


async def test_receiving_a_delivery_id_again_with_the_same_payload_is_a_no_op(
    handler: CommandHandler,
) -> None:
    await run_with(handler, "running", DEFINE_HOOK)
    first = await handler.execute(RUN, ReceiveHook(hook_id=HOOK, payload=b"a", delivery_id="d1"))

    again = await handler.execute(RUN, ReceiveHook(hook_id=HOOK, payload=b"a", delivery_id="d1"))

    assert again.appended == ()
    assert again.snapshot.hooks[HOOK].deliveries == first.snapshot.hooks[HOOK].deliveries
    assert len(again.snapshot.hooks[HOOK].deliveries) == 1


async def test_receiving_a_delivery_id_again_with_another_payload_is_an_entity_conflict(
    handler: CommandHandler,
) -> None:
    await run_with(
        handler, "running", DEFINE_HOOK, ReceiveHook(hook_id=HOOK, payload=b"a", delivery_id="d1")
    )
    await assert_rejected(
        handler,
        ReceiveHook(hook_id=HOOK, payload=b"b", delivery_id="d1"),
        EntityConflict,
        "'d1'",
        "already received with another payload",
    )


@pytest.mark.parametrize(
    ("hook", "error"), [(DEFINE_HOOK, HookNotFound), (RETAINED_HOOK, RunExpired)]
)
async def test_receiving_is_decided_on_the_freshest_history(
    handler: CommandHandler, clock: Clock, hook: CreateHook, error: type[Rejection]
) -> None:
    await run_with(handler, "running", hook)
    stale = CommandHandler(handler.store, clock=clock)
    assert (await stale.snapshot(RUN)).status == "running"  # cached while the hook was live
    await handler.execute(RUN, ENDINGS["completed"])  # another writer ends the run

    await assert_rejected(stale, ReceiveHook(hook_id=HOOK, payload=b"p"), error, repr(HOOK))


async def test_receiving_after_a_concurrent_disposal_is_hook_not_found(
    handler: CommandHandler, clock: Clock
) -> None:
    await run_with(handler, "running", DEFINE_HOOK)
    stale = CommandHandler(handler.store, clock=clock)
    await stale.snapshot(RUN)
    await handler.execute(RUN, DisposeHook(hook_id=HOOK))

    await assert_rejected(stale, ReceiveHook(hook_id=HOOK, payload=b"p"), HookNotFound)
    assert (await stale.snapshot(RUN)).hooks[HOOK].deliveries == ()


# --- DisposeHook --------------------------------------------------------------------------------


async def test_disposing_an_unknown_hook_is_hook_not_found(handler: CommandHandler) -> None:
    await run_in_status(handler, "running")
    await assert_rejected(handler, DisposeHook(hook_id=HOOK), HookNotFound, repr(HOOK))


async def test_disposing_a_disposed_hook_again_is_a_no_op(handler: CommandHandler) -> None:
    await run_with(handler, "running", DEFINE_HOOK, DisposeHook(hook_id=HOOK))
    before = await handler.history(RUN)

    outcome = await handler.execute(RUN, DisposeHook(hook_id=HOOK))

    assert outcome.appended == ()
    assert await handler.history(RUN) == before


@pytest.mark.parametrize("status", LIVE)
async def test_disposing_an_active_hook_releases_its_token(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(handler, status, DEFINE_HOOK)

    outcome = await handler.execute(RUN, DisposeHook(hook_id=HOOK))

    assert [e.event for e in outcome.appended] == [HookDisposed(hook_id=HOOK)]
    assert outcome.snapshot.hooks[HOOK].status == "disposed"
    assert outcome.snapshot.active_hooks() == ()
    assert await handler.store.find_hook(TOKEN, now=clock.now) is None


@pytest.mark.parametrize("retained", [False, True], ids=["not retained", "retention over"])
@pytest.mark.parametrize("status", TERMINAL)
async def test_disposing_a_released_hook_of_an_ended_run_is_hook_not_found(
    handler: CommandHandler, clock: Clock, status: str, retained: bool
) -> None:
    await run_with(handler, status, RETAINED_HOOK if retained else DEFINE_HOOK)
    clock.advance(HOUR)

    await assert_rejected(handler, DisposeHook(hook_id=HOOK), HookNotFound, repr(HOOK))


@pytest.mark.parametrize("status", TERMINAL)
async def test_disposing_a_retaining_hook_of_an_ended_run_releases_its_token_early(
    handler: CommandHandler, clock: Clock, status: str
) -> None:
    await run_with(handler, status, RETAINED_HOOK)
    await run_in_status(handler, "running", run_id=OTHER)

    outcome = await handler.execute(RUN, DisposeHook(hook_id=HOOK))

    assert [e.event for e in outcome.appended] == [HookDisposed(hook_id=HOOK)]
    assert outcome.snapshot.status == status
    assert outcome.snapshot.hooks[HOOK].status == "disposed"
    assert await handler.store.find_hook(TOKEN, now=clock.now) is None
    taken = await handler.execute(OTHER, DEFINE_HOOK)
    assert kinds(taken) == ["hook_created"]


async def test_disposing_a_cancelled_hook_is_terminal_state(handler: CommandHandler) -> None:
    # RULES.md does not name this case; a cancelled hook left its live states, so the kernel
    # refuses it as it refuses commands on other ended entities.
    await run_with(handler, "running", DEFINE_HOOK)
    await handler.execute(RUN, RequestCancel())

    await assert_rejected(
        handler, DisposeHook(hook_id=HOOK), TerminalState, "in terminal state 'cancelled'"
    )


# --- CommandHandler.deliver ---------------------------------------------------------------------


async def test_deliver_receives_on_the_hook_holding_the_token(handler: CommandHandler) -> None:
    await run_in_status(handler, "running", run_id=OTHER)
    await run_with(handler, "running", DEFINE_HOOK)

    outcome = await handler.deliver(TOKEN, b"payload", delivery_id="d1")
    again = await handler.deliver(TOKEN, b"payload", delivery_id="d1")

    assert outcome.snapshot.run_id == RUN
    assert [e.event for e in outcome.appended] == [
        HookReceived(hook_id=HOOK, payload=b"payload", delivery_id="d1")
    ]
    assert again.appended == ()
    assert len(again.snapshot.hooks[HOOK].deliveries) == 1


async def _deliver_refused(handler: CommandHandler, error: type[Exception]) -> str:
    """Deliver to TOKEN, expect `error`, check nothing was written, return the message."""
    head = await handler.store.head(RUN)
    with pytest.raises(error) as info:
        await handler.deliver(TOKEN, b"payload")
    assert await handler.store.head(RUN) == head
    return str(info.value)


@pytest.mark.parametrize(
    "situation", ["no such token", "disposed", "run cancelling", "run ended", "retention over"]
)
async def test_deliver_to_a_token_no_live_hook_holds_is_hook_not_found(
    handler: CommandHandler, clock: Clock, situation: str
) -> None:
    if situation == "disposed":
        await run_with(handler, "running", DEFINE_HOOK, DisposeHook(hook_id=HOOK))
    elif situation == "run cancelling":
        await run_with(handler, "running", DEFINE_HOOK)
        await handler.execute(RUN, RequestCancel())
    elif situation == "run ended":
        await run_with(handler, "completed", DEFINE_HOOK)
    elif situation == "retention over":
        await run_with(handler, "completed", RETAINED_HOOK)
        clock.advance(HOUR)
    else:
        await run_in_status(handler, "running")

    message = await _deliver_refused(handler, HookNotFound)

    assert "no live hook holds the given token" in message
    assert TOKEN not in message


@pytest.mark.parametrize("status", TERMINAL)
async def test_deliver_to_a_retained_token_of_an_ended_run_is_run_expired(
    handler: CommandHandler, status: str
) -> None:
    await run_with(handler, status, RETAINED_HOOK)

    message = await _deliver_refused(handler, RunExpired)

    assert f"in terminal state {status!r}" in message


# --- hook tokens are secrets --------------------------------------------------------------------


async def test_a_hook_token_appears_in_no_repr_or_message(
    handler: CommandHandler, clock: Clock
) -> None:
    created = await run_with(handler, "running", RETAINED_HOOK)
    await run_in_status(handler, "running", run_id=OTHER)
    conflict = await handler.execute(OTHER, CreateHook(hook_id="h2", token=TOKEN))
    history = await handler.history(RUN) + await handler.history(OTHER)
    hook = created.hooks[HOOK]
    index = run_index(created)
    assert index.hooks[0].token == TOKEN  # the index does carry it, for the store

    texts = [
        repr(RETAINED_HOOK),
        repr(HookCreated(hook_id=HOOK, token=TOKEN)),
        repr(HookConflict(hook_id=HOOK, token=TOKEN, holder_run_id=RUN)),
        repr(history),
        repr(conflict),
        repr(created),
        str(created),
        repr(hook),
        repr(dict(created.hooks)),
        repr(index),
        repr(index.hooks),
    ]
    error = TokenConflict(TOKEN, RUN, HOOK)
    texts += [str(error), repr(error), error.message]

    await handler.execute(RUN, ENDINGS["completed"])
    await handler.execute(OTHER, CreateHook(hook_id="mine", token="not-the-secret"))
    refusals = [
        (RUN, DEFINE_HOOK),  # TerminalState
        (OTHER, CreateHook(hook_id="mine", token=TOKEN)),  # EntityConflict
        (OTHER, CreateHook(hook_id="h3", token=TOKEN, retain_token_until=T0 + 40 * 24 * HOUR)),
        (OTHER, CreateHook(hook_id="h4", token=TOKEN * 100)),  # token too long
        (RUN, ReceiveHook(hook_id=HOOK, payload=b"p")),  # RunExpired: the token is retained
    ]
    for run_id, command in refusals:
        with pytest.raises(Rejection) as refused:
            await handler.execute(run_id, command)
        texts += [str(refused.value), repr(refused.value), repr(command)]
    clock.advance(HOUR)
    with pytest.raises(HookNotFound) as info:
        await handler.deliver(TOKEN, b"late")
    texts += [str(info.value), repr(info.value)]

    assert [e.event.event_type for e in conflict.appended] == ["hook_conflict"]
    for text in texts:
        assert TOKEN not in text
