"""Helpers shared by the `RULES.md` example tests (`tests/test_rules_*.py`).

They only use the public handler and store API, so the tests run against every store backend.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs
import pytest

from runfold import CommandHandler, Snapshot
from runfold.commands import (
    CancelRun,
    Command,
    CompleteRun,
    CreateRun,
    FailRun,
    RequestCancel,
    StartRun,
    TimeOutRun,
)
from runfold.errors import (
    AttemptsExhausted,
    EntityConflict,
    HistoryLimitExceeded,
    HookNotFound,
    InvalidAttributes,
    InvalidCommand,
    NonDeterministic,
    OwnershipLost,
    Rejection,
    RunExpired,
    RunNotFound,
    RunNotSupported,
    RunOwned,
    StepNotFound,
    TerminalState,
    TooEarly,
    WaitNotFound,
)
from runfold.handler import Outcome
from tests.conftest import T0

RUN = "r1"
"""The run most tests work on."""

LIVE = ("pending", "running", "cancelling")
TERMINAL = ("completed", "failed", "cancelled", "timed_out")
ALL_STATUSES = LIVE + TERMINAL

CANCEL_REASON = "stop"
"""The reason `run_in_status(..., "cancelling")` asks to cancel with."""

ENDINGS: dict[str, Command] = {
    "completed": CompleteRun(output=b"done"),
    "failed": FailRun(error=b"boom", error_code="E_BOOM"),
    "cancelled": CancelRun(reason="bye"),
    "timed_out": TimeOutRun(deadline=T0, reason="late"),
}
"""The command that ends a running run in each terminal status."""

# What RULES.md says each rejection class reports: (code, HTTP-like status).
EXPECTED_CODES: dict[type[Rejection], tuple[str, int]] = {
    RunNotFound: ("run_not_found", 404),
    StepNotFound: ("step_not_found", 404),
    WaitNotFound: ("wait_not_found", 404),
    HookNotFound: ("hook_not_found", 404),
    EntityConflict: ("entity_conflict", 409),
    NonDeterministic: ("non_deterministic", 409),
    TerminalState: ("terminal_state", 409),
    RunExpired: ("run_expired", 410),
    TooEarly: ("too_early", 425),
    InvalidCommand: ("invalid_command", 400),
    InvalidAttributes: ("invalid_attributes", 400),
    RunNotSupported: ("run_not_supported", 409),
    HistoryLimitExceeded: ("history_limit_exceeded", 413),
    AttemptsExhausted: ("attempts_exhausted", 409),
    RunOwned: ("run_owned", 409),
    OwnershipLost: ("ownership_lost", 409),
}

E = TypeVar("E", bound=Rejection)


def create(**overrides: Any) -> CreateRun:
    """A `CreateRun` for workflow "wf" with `overrides` applied."""
    return attrs.evolve(CreateRun(workflow_name="wf", input=b"in"), **overrides)


def kinds(outcome: Outcome) -> list[str]:
    """The wire names of the events `outcome` appended, in order."""
    return [envelope.event.event_type for envelope in outcome.appended]


async def run_with(
    handler: CommandHandler, status: str, *commands: Command, run_id: str = RUN
) -> Snapshot:
    """A run in `status` that executed `commands` while it was live.

    The commands run after the run reached its live status (after `cancel_requested` for a
    cancelling run, so the entities they create are not cancelled) and, for a terminal status,
    before the run ended (directly from `running`, so running steps stay running).
    """
    if status == "pending":
        await handler.execute(run_id, create())
    else:
        await handler.execute(run_id, StartRun(create=create()))
    if status == "cancelling":
        await handler.execute(run_id, RequestCancel(reason=CANCEL_REASON))
    for command in commands:
        await handler.execute(run_id, command)
    if status in ENDINGS:
        await handler.execute(run_id, ENDINGS[status])
    snapshot = await handler.snapshot(run_id)
    assert snapshot.status == status
    return snapshot


async def run_in_status(handler: CommandHandler, status: str, run_id: str = RUN) -> Snapshot:
    """A run in `status` with nothing else in it."""
    return await run_with(handler, status, run_id=run_id)


async def assert_rejected(
    handler: CommandHandler,
    command: Command,
    error: type[E],
    *fragments: str,
    run_id: str = RUN,
) -> E:
    """Execute `command` and check it is refused with exactly `error`, the code and status
    RULES.md gives that class, a message naming every one of `fragments`, and nothing written."""
    head = await handler.store.head(run_id)
    with pytest.raises(error) as info:
        await handler.execute(run_id, command)
    exc = info.value
    assert type(exc) is error, f"expected {error.__name__}, got {type(exc).__name__}: {exc}"
    assert (exc.code, exc.status) == EXPECTED_CODES[error]
    assert exc.run_id == run_id
    for fragment in fragments:
        assert fragment in exc.message, f"{fragment!r} not in {exc.message!r}"
    assert await handler.store.head(run_id) == head
    return exc
