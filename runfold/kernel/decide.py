"""`decide`: the pure command decider, the rules every command is held to.

`decide(snapshot, command, *, now, limits, token_holder)` returns a `Decision` or raises a
`Rejection`; it never raises anything else, never reads a clock and never writes anything.

Here is the dispatch: the checks of the run's spec version and of the command's fields
(`_rules.fields`), the rule of the command's class (`_rules.runs`, `steps`, `waits` and
`hooks`, one family of commands each), and the bound on the run's length.
"""

from __future__ import annotations

from datetime import datetime

from runfold.kernel._rules.context import Rule, RuleContext
from runfold.kernel._rules.fields import VALIDATORS, validate
from runfold.kernel._rules.hooks import HOOK_RULES
from runfold.kernel._rules.owners import OWNER_RULES, check_owner
from runfold.kernel._rules.runs import RUN_RULES
from runfold.kernel._rules.steps import STEP_RULES
from runfold.kernel._rules.waits import WAIT_RULES
from runfold.kernel.commands import Command, Decision
from runfold.kernel.errors import HistoryLimitExceeded, InvalidCommand, Rejection, RunNotSupported
from runfold.kernel.events import Event
from runfold.kernel.index import HookHolder
from runfold.kernel.limits import DEFAULT_LIMITS, SPEC_VERSION, Limits
from runfold.kernel.snapshot import Ownership, Snapshot

__all__ = ["decide", "decided_events"]


_RULES: dict[type[Command], Rule] = {
    **RUN_RULES,
    **STEP_RULES,
    **WAIT_RULES,
    **HOOK_RULES,
    **OWNER_RULES,
}
"""The rule of each command class, by family: run, step, wait, hook and ownership commands."""
_CHECKED_RULES = {
    kind: (VALIDATORS[kind], rule) for kind, rule in _RULES.items() if kind in VALIDATORS
}
"""Each command class's field checks and rule, found in one lookup per decision."""
_new_context = object.__new__


def decide(
    snapshot: Snapshot | None,
    command: Command,
    *,
    now: datetime,
    limits: Limits = DEFAULT_LIMITS,
    token_holder: HookHolder | None = None,
    run_id: str | None = None,
    acting_as: Ownership | None = None,
) -> Decision:
    """Decide what `command` means for the run in `snapshot`: events to append, or a rejection.

    Pure: no clock, no I/O, no randomness. Law (decide ∘ apply is closed): for a snapshot of a
    valid history, either `decide` raises a `Rejection` or `project_run(history + events)` is
    valid. It raises a `Rejection` subclass naming what was wrong, and nothing else.

    Args:
        snapshot: The run's snapshot; None when the run has no history.
        command: What the caller asks; each command class lists the rejections it may meet.
        now: The time of the decision (timezone-aware), e.g. for retry and retention deadlines.
        limits: The bounds the command and the resulting history are checked against.
        token_holder: What the store says holds a `CreateHook` command's token, if anything.
        run_id: Names the run in messages when `snapshot` is None.
        acting_as: The worker the command is made for, when a worker of a fleet makes it: the
            run must be its own (`snapshot.owner`, epoch included), or the command is refused
            with `OwnershipLost`. None (a host outside a fleet, an outside input such as a
            delivery or a cancellation) checks no owner.

    Returns:
        The events to append; an empty `Decision(idempotent=True)` when the command had
            already taken effect.

    Raises:
        InvalidCommand: A malformed command (a field's type, size or id), or a naive `now`.
        RunNotSupported: The run was stamped by a newer kernel spec than this one.
        OwnershipLost: `acting_as` does not own the run.
        HistoryLimitExceeded: The events would take the run past `Limits.max_events_per_run`.
        Rejection: Any other refusal of the rules (`RunNotFound`, `TerminalState`, …).
    """
    events = decided_events(snapshot, command, now, limits, token_holder, run_id, acting_as)
    return Decision(events=events) if events else Decision(events=(), idempotent=True)


def decided_events(
    snapshot: Snapshot | None,
    command: Command,
    now: datetime,
    limits: Limits,
    token_holder: HookHolder | None,
    run_id: str | None,
    acting_as: Ownership | None,
) -> tuple[Event, ...]:
    """The events `decide` would return, its arguments positional: what a batch asks per command.

    The same checks and rules as `decide`, which wraps it, without a `Decision` to build;
    empty for a no-op.
    """
    if snapshot is not None:
        run_id = snapshot.run_id
        if snapshot.spec_version > SPEC_VERSION:
            raise RunNotSupported(
                f"run {run_id!r} requires spec version {snapshot.spec_version}, runfold supports "
                f"{SPEC_VERSION}",
                run_id=run_id,
            )
    # `RuleContext(snapshot, run_id, now, limits, token_holder)`, filled without the call.
    ctx = _new_context(RuleContext)
    ctx.snapshot = snapshot
    ctx.run_id = run_id
    ctx.now = now
    ctx.limits = limits
    ctx.token_holder = token_holder
    try:
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise InvalidCommand("now must be a timezone-aware datetime", run_id=run_id)
        if snapshot is None and run_id is not None:
            ctx.ident(run_id, "run_id")  # an existing run's id was checked when created
        checked = _CHECKED_RULES.get(type(command))
        if checked is None:  # not a command: `validate` says so
            validate(ctx, command)
            checked = (validate, _RULES[type(command)])
        check, rule = checked
        check(ctx, command)
        if acting_as is not None:
            check_owner(snapshot, command, acting_as)
        events = rule(ctx, command)
    except Rejection:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        # A field of the wrong shape that slipped past validation is still the caller's error.
        raise InvalidCommand(
            f"malformed {type(command).__name__}: {type(exc).__name__}", run_id=run_id
        ) from None
    if not events:
        return events
    head = snapshot.last_sequence if snapshot is not None else 0
    allowed = limits.max_events_per_run + (1 if command.ends_run else 0)
    if head + len(events) > allowed:
        raise HistoryLimitExceeded(
            f"run {run_id!r} holds {head} events; {len(events)} more would pass the limit of "
            f"{limits.max_events_per_run}",
            run_id=run_id,
        )
    return events
