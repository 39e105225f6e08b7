"""`decide_many`: several commands for one run, decided as one.

Each command is decided on the snapshot the ones before it left, so a batch means exactly what
its commands would mean one after the other; its events then go in one atomic append. That is
how a host records a step's outcome together with the workflow's next decision in one commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import attrs

from runfold.kernel._pmap import stored
from runfold.kernel.commands import ClaimRun, Command, StartStep
from runfold.kernel.decide import decided_events
from runfold.kernel.errors import HistoryError, InvalidCommand, OwnershipLost, Rejection
from runfold.kernel.events import Event, RunClaimed, StepCreated, make_envelope
from runfold.kernel.fast import fast_init, frozen_factory
from runfold.kernel.index import HookHolder
from runfold.kernel.limits import DEFAULT_LIMITS, Limits
from runfold.kernel.snapshot import Ownership, Snapshot, apply, project_run
from runfold.kernel.snapshot.reducer import apply_decided

__all__ = ["BatchDecision", "decide_after", "decide_many", "join_decisions", "recheck_decision"]


class _Sealed:
    """The base of `BatchDecision`: one slot that is none of its fields, the kernel's seal.

    `decide_many`, `decide_after` and `join_decisions` set it on the decisions they make, so
    `recheck_decision` knows the kernel's own without folding them again; a decision built any
    other way (its constructor, `attrs.evolve`, a copy, a pickle) has no seal.
    """

    __slots__ = ("_seal",)


_SEAL = object()
_set_seal = _Sealed._seal.__set__  # type: ignore[attr-defined]  # the slot's member descriptor


def _made(
    events: tuple[Event, ...],
    snapshot: Snapshot | None,
    created_steps: tuple[str, ...],
    decided_on: Snapshot | None,
    now: datetime | None,
) -> BatchDecision:
    """A decision of the kernel's own: a `BatchDecision` of these fields, sealed."""
    decision = _make_decision(events, snapshot, created_steps, decided_on, now)
    _set_seal(decision, _SEAL)
    return decision


def _is_made(decision: BatchDecision) -> bool:
    return getattr(decision, "_seal", None) is _SEAL


@fast_init
@attrs.frozen(kw_only=True)
class BatchDecision(_Sealed):
    """What `decide_many` returns.

    `events` are every command's events in order (empty when every command was a no-op);
    `snapshot` is the run after them (the snapshot given when there are none); `created_steps`
    the ids of the steps a lazy `StartStep` of the batch created (or had created: the same
    command, `start_id` and all, found applied). `decided_on` and `now` are
    what it was decided on and when, so a caller holding the same snapshot can reuse it.
    """

    events: tuple[Event, ...]
    snapshot: Snapshot | None
    created_steps: tuple[str, ...] = ()
    decided_on: Snapshot | None = attrs.field(default=None, eq=False, repr=False)
    now: datetime | None = None


_make_decision = frozen_factory(BatchDecision)
"""`BatchDecision` from its fields in order: the kernel makes one or two a step."""


def _started_it(snapshot: Snapshot | None, command: Command) -> bool:
    """Whether `command` is a lazy `StartStep` found applied: its step's first attempt its own.

    Its caller created the step and runs the body, as when the command was first decided.
    """
    if not isinstance(command, StartStep) or command.lazy is None or command.start_id is None:
        return False
    record = stored(snapshot.steps, command.step_id) if snapshot is not None else None
    return record is not None and record.attempt == 1 and record.start_id == command.start_id


def decide_many(
    snapshot: Snapshot | None,
    commands: Sequence[Command],
    *,
    now: datetime,
    limits: Limits = DEFAULT_LIMITS,
    token_holder: HookHolder | None = None,
    run_id: str | None = None,
    acting_as: Ownership | None = None,
) -> BatchDecision:
    """Decide `commands` in order, each on the snapshot the ones before it left.

    Pure, like `decide`, and all or nothing: a refused command refuses the batch. The
    `Rejection` raised is the command's own, with `command_index` set to its place in
    `commands` and a note naming it.

    Args:
        snapshot: The run's snapshot; None when the run has no history.
        commands: At least one command.
        now: The time of the decision; it stamps the events the later commands are decided on.
        limits: As for `decide`.
        token_holder: As for `decide`: what the store says holds a `CreateHook` token.
        run_id: Names the run when `snapshot` is None.
        acting_as: As for `decide`: the worker each command is made for. A `ClaimRun` of the
            batch must give that worker exactly the claim `acting_as` names, so the commands
            after it are decided as its own.

    Raises:
        Rejection: A command was refused (`command_index` says which); `InvalidCommand` for
            an empty batch.
    """
    if not commands:
        raise InvalidCommand("a batch needs at least one command", run_id=run_id)
    events: list[Event] = []
    created: list[str] = []
    current = _decide_onto(
        snapshot, commands, events, created, now, limits, token_holder, run_id, acting_as
    )
    return _made(tuple(events), current, tuple(created), snapshot, now)


def _decide_onto(
    snapshot: Snapshot | None,
    commands: Sequence[Command],
    events: list[Event],
    created: list[str],
    now: datetime,
    limits: Limits,
    token_holder: HookHolder | None,
    run_id: str | None,
    acting_as: Ownership | None,
) -> Snapshot | None:
    """Decide `commands` in order from `snapshot`, their events added to `events` (and the
    steps they created to `created`); the snapshot after them."""
    current = snapshot
    for place, command in enumerate(commands):
        try:
            decided = decided_events(current, command, now, limits, token_holder, run_id, acting_as)
            if acting_as is not None and isinstance(command, ClaimRun):
                _check_claim(current, decided, acting_as)
        except Rejection as exc:
            exc.command_index = place
            if len(commands) > 1:
                exc.add_note(
                    f"refused command {place} of a batch of {len(commands)}: "
                    f"{type(command).__name__}"
                )
            raise
        if not decided:
            if _started_it(current, command):
                created.append(command.step_id)  # type: ignore[attr-defined]
            continue
        if isinstance(command, StartStep) and type(decided[0]) is StepCreated:
            created.append(command.step_id)
        if current is None:  # the run's first events (a run is never None after any)
            envelopes = [
                make_envelope(run_id or "", 1 + k, event, now, None)
                for k, event in enumerate(decided)
            ]
            current = project_run(envelopes, limits=limits)
        else:  # the kernel's own events, numbered from the snapshot's head: no envelopes
            current = apply_decided(current, decided, now, limits)
        events.extend(decided)
    return current


def decide_after(
    decided: BatchDecision,
    command: Command,
    *,
    limits: Limits = DEFAULT_LIMITS,
    run_id: str | None = None,
    acting_as: Ownership | None = None,
) -> BatchDecision:
    """`decided` with `command` decided after it, at its time, as one decision.

    What `join_decisions(decided, decide_many(decided.snapshot, (command,), now=decided.now,
    …))` gives, without the second decision object: for a host that decides commands one at a
    time (to show its workflow each result) and appends them together. `decided` itself is
    returned when `command` changes nothing. A `Rejection` is `command`'s, as `decide_many`
    of it alone raises it (`command_index` 0).

    Raises:
        ValueError: `decided` was not made by `decide_many` (or joined), or has no time.
        Rejection: The kernel refused `command` on `decided.snapshot`.
    """
    if getattr(decided, "_seal", None) is not _SEAL or decided.now is None:  # `_is_made`
        raise ValueError("decide_after extends decisions made by decide_many")
    events = list(decided.events)
    created = list(decided.created_steps)
    current = _decide_onto(
        decided.snapshot,
        (command,),
        events,
        created,
        decided.now,
        limits,
        None,
        run_id,
        acting_as,
    )
    if len(events) == len(decided.events):
        return decided
    return _made(tuple(events), current, tuple(created), decided.decided_on, decided.now)


def join_decisions(first: BatchDecision, then: BatchDecision) -> BatchDecision:
    """One decision of `first` and `then`, which was decided on `first`'s snapshot at its time.

    For a host that decides commands one at a time (to show its workflow each result) and
    appends them together: the joined decision is the kernel's own, as `decide_many` of all the
    commands would be, so `recheck_decision` takes it without folding it again.

    Raises:
        ValueError: `first` or `then` was not made by `decide_many` (or joined), or `then` was
            not decided on `first`'s snapshot at the same time.
    """
    if not (_is_made(first) and _is_made(then)):
        raise ValueError("join_decisions joins decisions made by decide_many")
    if then.decided_on is not first.snapshot or then.now != first.now:
        raise ValueError("the second decision was not made on the first one's snapshot")
    return _made(
        first.events + then.events,
        then.snapshot,
        first.created_steps + then.created_steps,
        first.decided_on,
        first.now,
    )


def recheck_decision(
    decided: BatchDecision,
    snapshot: Snapshot | None,
    *,
    run_id: str,
    limits: Limits = DEFAULT_LIMITS,
) -> BatchDecision:
    """`decided`, a decision handed in from elsewhere, checked against `snapshot`.

    A decision `decide_many` (or `join_decisions`) made on this very `snapshot` is taken as it
    is. Any other has its events folded onto `snapshot` by the kernel (the half of
    `decide_many` after `decide`): the result holds the kernel's own snapshot, never the one
    handed in, and events that break a law of history there (a step finished twice, a gap,
    something not an event) are refused, so a wrong decision never reaches a store and leaves
    the run unreadable.

    Raises:
        InvalidCommand: The events do not hold on `snapshot`, or `decided` has no `now`.
    """
    if decided.decided_on is snapshot and _is_made(decided):
        return decided
    events = decided.events
    if decided.now is None or (snapshot is None and not events):
        raise InvalidCommand(
            f"the decision handed in for run {run_id!r} was not made by decide_many on it",
            run_id=run_id,
        )
    if not events:
        return BatchDecision(events=(), snapshot=snapshot, decided_on=snapshot, now=decided.now)
    head = snapshot.last_sequence if snapshot is not None else 0
    try:
        if not all(isinstance(event, Event) for event in events):
            raise HistoryError(run_id, head + 1, "not an event")
        envelopes = [
            make_envelope(run_id, head + 1 + k, event, decided.now, None)
            for k, event in enumerate(events)
        ]
        after = (
            project_run(envelopes, limits=limits)
            if snapshot is None
            else apply(snapshot, envelopes, limits=limits)
        )
    except HistoryError as exc:
        raise InvalidCommand(
            f"the decision handed in does not hold on run {run_id!r} as stored: {exc}",
            run_id=run_id,
        ) from None
    return BatchDecision(
        events=events,
        snapshot=after,
        created_steps=decided.created_steps,
        decided_on=snapshot,
        now=decided.now,
    )


def _check_claim(current: Snapshot | None, events: tuple[Event, ...], acting_as: Ownership) -> None:
    """Refuse a batch whose claim does not give `acting_as` the run: another claim came first."""
    if events:
        claimed = events[0]
        assert isinstance(claimed, RunClaimed)
        got = (claimed.owner_id, claimed.epoch)
    elif current is not None and current.owner is not None:
        got = (current.owner.owner_id, current.owner.epoch)
    else:
        got = None
    if got != (acting_as.owner_id, acting_as.epoch):
        run_id = current.run_id if current is not None else None
        raise OwnershipLost(
            f"worker {acting_as.owner_id!r} claimed run {run_id!r} as epoch {acting_as.epoch}, "
            "but another claim came first",
            run_id=run_id,
        )
