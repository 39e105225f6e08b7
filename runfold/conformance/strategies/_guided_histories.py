"""Valid histories, built the way a runtime builds them, and the snapshots runs pass through.

A history starts with a `CreateRun` (or a resilient `StartRun`), then each command is decided
with `decide` on the current snapshot at a clock that only moves forward, and its events are
appended. Commands are mostly guided by the snapshot (start the pending step, retry the running
one, deliver to an active hook, …) so histories reach what a runtime meets: retries,
cancellation, every ending, late outcomes, retained hooks; some come from `commands()` to keep
the unexpected in the mix. Snapshots are projections of these histories or of their prefixes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeAlias

import attrs
from hypothesis import strategies as st

from runfold.conformance.strategies._arbitrary_commands import commands, create_runs
from runfold.conformance.strategies._odds import choose, optional, weighted
from runfold.conformance.strategies._pools import (
    DEFAULT_RUN_ID,
    DELIVERY_IDS,
    FOREIGN_RUN_ID,
    HOOK_IDS,
    OWNER_IDS,
    PROGRESS_IDS,
    REASONS,
    REFERENCE_IDS,
    START,
    STEP_IDS,
    TOKENS,
    WAIT_IDS,
    WRITE_IDS,
)
from runfold.conformance.strategies._values import attribute_changes, retry_policies, writers
from runfold.kernel import (
    CancelRun,
    CancelStep,
    ClaimRun,
    Command,
    CompleteRun,
    CompleteStep,
    CompleteWait,
    CreateHook,
    CreateRun,
    CreateStep,
    CreateWait,
    DisposeHook,
    Envelope,
    Event,
    FailRun,
    FailStep,
    HookHolder,
    LazyStep,
    Limits,
    LinkChild,
    ReceiveHook,
    RecordLog,
    RecordProgress,
    Rejection,
    ReleaseRun,
    RequestCancel,
    RetryStep,
    SetAttributes,
    Snapshot,
    StartRun,
    StartStep,
    TimeOutRun,
    apply,
    decide,
    project_run,
)
from runfold.kernel.limits import DEFAULT_LIMITS

__all__ = ["envelopes_after", "ids_where", "snapshots", "valid_histories"]

_TIME_STEPS = st.sampled_from(
    (
        timedelta(0),
        timedelta(milliseconds=1),
        timedelta(seconds=1),
        timedelta(minutes=5),
        timedelta(hours=2),
        timedelta(days=1),
        timedelta(days=31),
    )
)
"""How far the clock moves between two commands: often not at all, sometimes past a retention."""

_Guided: TypeAlias = tuple[Command | None, HookHolder | None]

_LIVE_KINDS: tuple[tuple[int, str], ...] = (
    (20, "start_step"),
    (12, "complete_step"),
    (4, "fail_step"),
    (10, "retry_step"),
    (4, "cancel_step"),
    (8, "create_wait"),
    (5, "complete_wait"),
    (1, "start_run"),
    (3, "request_cancel"),
    (1, "complete_run"),
    (1, "fail_run"),
    (1, "cancel_run"),
    (1, "time_out"),
    (10, "create_hook"),
    (24, "receive_hook"),
    (4, "dispose_hook"),
    (8, "set_attributes"),
    (6, "progress"),
    (4, "child"),
    (4, "log"),
    (2, "claim"),
    (1, "release"),
    (6, "arbitrary"),
    (12, "create_step"),
)
"""What a live run is asked, by weight: a run usually lives ~20 commands before it ends. Hypothesis
draws the bounds of an integer range more often than the rest, so the first and last entries are
harmless and the run-ending kinds sit in the middle."""


def ids_where(mapping: Any, predicate: Callable[[Any], bool]) -> list[str]:
    """The keys of `mapping` (a snapshot's steps, waits, hooks) whose state meets `predicate`."""
    return [key for key, state in mapping.items() if predicate(state)]


def _pick(draw: st.DrawFn, preferred: list[str], fallback: Sequence[str]) -> str:
    return draw(st.sampled_from(preferred if preferred else fallback))


def _fresh(prefix: str, taken: Collection[str]) -> str:
    return f"{prefix}{len(taken)}"


_SMALL = st.sampled_from((b"", b"x", b"\x00\xff"))
_GUIDED_RETRY = optional(retry_policies(False))
_GUIDED_CHANGES = attribute_changes(False)
_GUIDED_WRITERS = writers(False)
_GUIDED_METADATA = optional(_SMALL)


@functools.lru_cache(maxsize=64)
def _cached_commands(run_id: str, around: datetime) -> st.SearchStrategy[Command]:
    return commands(run_id, around=around)


def _guided_command(
    draw: st.DrawFn, snap: Snapshot, now: datetime, arbitrary: st.SearchStrategy[Command]
) -> _Guided:
    """A command likely to be accepted on `snap` at `now` (or None: nothing can happen any more).

    While the run is live every kind of command is drawn, weighted so runs usually live a while;
    once it ended only late step outcomes and early disposals of retained hooks are possible.
    """
    running = ids_where(snap.steps, lambda s: s.status == "running")
    live_steps = ids_where(snap.steps, lambda s: s.status in ("pending", "running"))
    active = ids_where(snap.hooks, lambda h: h.status == "active")
    waiting = ids_where(snap.waits, lambda w: w.status == "waiting")
    if snap.is_live:
        # Kinds that need a target only when there is one: unknown ids come from `arbitrary`.
        needs = {
            "complete_step": live_steps,
            "fail_step": live_steps,
            "retry_step": running,
            "cancel_step": live_steps,
            "complete_wait": waiting,
            "receive_hook": active,
            "dispose_hook": active,
        }
        kinds = [(w, k) for w, k in _LIVE_KINDS if needs.get(k, True)]
        if snap.status == "pending":
            kinds.insert(0, (40, "start_run"))
        elif snap.status == "cancelling":
            kinds.insert(0, (4, "cancel_run"))
    else:
        retaining = [
            h
            for h in active
            if (until := snap.hooks[h].retain_token_until) is not None and until > now
        ]
        kinds = [(1, "arbitrary")]
        if retaining:
            kinds += [(1, "receive_hook"), (4, "dispose_hook")]
        if running:
            kinds += [(2, "fail_step"), (4, "complete_step")]
        if len(kinds) == 1:
            return None, None
    kind = choose(draw, kinds)
    small = _SMALL
    if kind == "start_run":
        return StartRun(), None
    if kind == "create_step":
        existing = list(snap.steps)
        step_id = _fresh("s", snap.steps)
        if existing and draw(st.integers(0, 5)) == 0:
            step_id = draw(st.sampled_from(existing))
        retry = draw(_GUIDED_RETRY)
        return CreateStep(step_id=step_id, step_name="task", input=draw(small), retry=retry), None
    if kind == "start_step":
        if live_steps and draw(st.integers(0, 3)) != 0:
            # Now and then a deploy changed the step's retry policy: it applies from now on.
            retry = draw(_GUIDED_RETRY) if draw(st.integers(0, 4)) == 0 else None
            # Now and then the start names itself (a fresh `start_id`: never one applied).
            start_id = f"start-{snap.last_sequence}" if draw(st.booleans()) else None
            step_id = draw(st.sampled_from(live_steps))
            return StartStep(step_id=step_id, retry=retry, start_id=start_id), None
        lazy = LazyStep(step_name="lazy", input=b"", retry=draw(_GUIDED_RETRY))
        start_id = f"start-{snap.last_sequence}" if draw(st.booleans()) else None
        return StartStep(step_id=_fresh("s", snap.steps), lazy=lazy, start_id=start_id), None
    if kind in ("complete_step", "fail_step", "cancel_step"):
        # Outcomes go mostly to running steps (pending ones get an instant outcome).
        targets = running if running and kind != "cancel_step" and draw(st.booleans()) else []
        step_id = _pick(draw, targets or live_steps, STEP_IDS)
        if kind == "complete_step":
            return CompleteStep(step_id=step_id, output=draw(small)), None
        if kind == "fail_step":
            return FailStep(step_id=step_id, error=draw(small), retryable=draw(st.booleans())), None
        return CancelStep(step_id=step_id, reason=draw(st.sampled_from(REASONS))), None
    if kind == "retry_step":
        delay = draw(st.sampled_from((None, -60, 0, 30, 3600, 5 * 86_400)))
        retry_after = None if delay is None else now + timedelta(seconds=delay)
        step_id = _pick(draw, running, STEP_IDS)
        return RetryStep(step_id=step_id, error=b"transient", retry_after=retry_after), None
    if kind == "create_wait":
        delay = draw(st.sampled_from((-60, 0, 60, 3600, 3 * 86_400)))
        wait_id = _fresh("w", snap.waits)
        return CreateWait(wait_id=wait_id, resume_at=now + timedelta(seconds=delay)), None
    if kind == "complete_wait":
        return CompleteWait(wait_id=_pick(draw, waiting, WAIT_IDS)), None
    if kind == "create_hook":
        retention = draw(st.sampled_from((None, 60, 86_400, 30 * 86_400, 31 * 86_400, 7 * 86_400)))
        hook = CreateHook(
            hook_id=_fresh("h", snap.hooks),
            token=draw(st.sampled_from((*TOKENS, f"tok-{snap.last_sequence}"))),
            metadata=draw(_GUIDED_METADATA),
            is_webhook=draw(st.booleans()),
            retain_token_until=None if retention is None else now + timedelta(seconds=retention),
        )
        holders: tuple[HookHolder | None, ...] = (
            None,
            None,
            None,
            HookHolder(run_id=FOREIGN_RUN_ID, hook_id="h0", retained_until=None),
            HookHolder(run_id=snap.run_id, hook_id="h0", retained_until=None),
        )
        return hook, draw(st.sampled_from(holders))
    if kind == "receive_hook":
        return ReceiveHook(
            hook_id=_pick(draw, active, HOOK_IDS),
            payload=draw(small),
            delivery_id=draw(st.sampled_from((None, *DELIVERY_IDS))),
        ), None
    if kind == "dispose_hook":
        return DisposeHook(hook_id=_pick(draw, active, HOOK_IDS)), None
    if kind == "set_attributes":
        write_id = draw(st.sampled_from((None, None, *WRITE_IDS, f"wr-{snap.last_sequence}")))
        return SetAttributes(
            changes=draw(_GUIDED_CHANGES),
            writer=draw(_GUIDED_WRITERS),
            write_id=write_id,
            allow_reserved=draw(st.booleans()),
        ), None
    if kind == "progress":
        progress_id = draw(st.sampled_from((_fresh("p", snap.progress), *PROGRESS_IDS)))
        completed = draw(st.integers(0, 3))
        return RecordProgress(progress_id=progress_id, completed=completed, total=3), None
    if kind == "child":
        reference_id = draw(st.sampled_from((_fresh("c", snap.children), *REFERENCE_IDS)))
        return LinkChild(reference_id=reference_id, kind="workflow", operation_id="op-1"), None
    if kind == "log":
        log_step = draw(st.sampled_from((None, *list(snap.steps)[:2])))
        # Some lines named, one name now and then again (a retry: a no-op), without a draw.
        log_id = (None, "log-a", f"log-{snap.last_sequence}")[snap.last_sequence % 3]
        return RecordLog(level="info", message="hello", step_id=log_step, log_id=log_id), None
    if kind == "claim":  # a free run is claimed; an owned one is taken over now and then
        owner = draw(st.sampled_from(OWNER_IDS))
        held = snap.owner.owner_id if snap.owner is not None else None
        displacing = held if held is not None and draw(st.booleans()) else None
        return ClaimRun(owner_id=owner, displacing=displacing), None
    if kind == "release":
        held = snap.owner.owner_id if snap.owner is not None else None
        return ReleaseRun(owner_id=held or draw(st.sampled_from(OWNER_IDS))), None
    if kind == "request_cancel":
        return RequestCancel(reason=draw(st.sampled_from(REASONS))), None
    if kind == "complete_run":
        return CompleteRun(output=draw(small)), None
    if kind == "fail_run":
        return FailRun(error=draw(small), error_code=draw(st.sampled_from((None, "boom")))), None
    if kind == "cancel_run":
        return CancelRun(reason=draw(st.sampled_from(REASONS))), None
    if kind == "time_out":
        return TimeOutRun(deadline=snap.deadline or now, reason="deadline"), None
    return draw(arbitrary), None


def envelopes_after(
    run_id: str, after: int, events: Sequence[Event], at: datetime
) -> list[Envelope]:
    """`events` as envelopes of `run_id` numbered on from sequence `after`, recorded at `at`."""
    return [
        Envelope(run_id=run_id, sequence=after + i, event=event, recorded_at=at)
        for i, event in enumerate(events, start=1)
    ]


@attrs.frozen
class _Definition:
    """What a caller fixed of the generated run's `CreateRun` (None: drawn)."""

    workflow_name: str | None = None
    input: bytes | None = None

    def apply(self, create: CreateRun) -> CreateRun:
        if self.workflow_name is not None:
            create = attrs.evolve(create, workflow_name=self.workflow_name)
        if self.input is not None:
            create = attrs.evolve(create, input=self.input)
        return create


def _definition(workflow_name: str | None, input: bytes | None, start: datetime) -> _Definition:
    """The fixed part of the run's definition, checked now: a bad name fails here, not inside
    every example (`InvalidCommand`)."""
    definition = _Definition(workflow_name=workflow_name, input=input)
    decide(None, definition.apply(CreateRun(workflow_name="wf", input=b"")), now=start, run_id="r")
    return definition


@st.composite
def _valid_histories(
    draw: st.DrawFn,
    run_id: str,
    max_commands: int,
    start: datetime,
    limits: Limits,
    definition: _Definition,
) -> list[Envelope]:
    now = start
    create = definition.apply(draw(create_runs(run_id, start, invalid=False)))
    try:
        opening = draw(st.sampled_from((create, StartRun(create=create))))
        first = decide(None, opening, now=now, limits=limits)
    except Rejection:  # tight `limits` may refuse the two events of a resilient start
        first = decide(None, create, now=now, limits=limits)
    history = envelopes_after(run_id, 0, first.events, now)
    snap = project_run(history, limits=limits)
    arbitrary = _cached_commands(run_id, start)
    count = weighted((1, st.integers(0, max_commands)), (2, st.just(max_commands)))
    for _ in range(draw(count)):
        now += draw(_TIME_STEPS)
        command, holder = _guided_command(draw, snap, now, arbitrary)
        if command is None:
            break
        try:
            decision = decide(snap, command, now=now, limits=limits, token_holder=holder)
        except Rejection:
            continue
        if decision.events:
            new = envelopes_after(run_id, snap.last_sequence, decision.events, now)
            # A HistoryError here would break the closure law; it propagates on purpose.
            snap = apply(snap, new, limits=limits)
            history.extend(new)
    return history


def valid_histories(
    run_id: str = DEFAULT_RUN_ID,
    *,
    max_commands: int = 40,
    start: datetime = START,
    limits: Limits = DEFAULT_LIMITS,
    workflow_name: str | None = None,
    input: bytes | None = None,
) -> st.SearchStrategy[list[Envelope]]:
    """Histories of one run that `project_run` accepts, built the way a runtime builds them.

    The run is of `workflow_name` with `input` when given (else both are drawn); for the
    histories a given `runfold.flow` workflow makes, see
    `runfold.testing.strategies.workflow_histories`.

    Starts with `CreateRun` or a resilient `StartRun(create=…)` at `start`, then up to
    `max_commands` commands, each decided with `decide` on the current snapshot at a clock that
    only moves forward; accepted events are appended as `Envelope`s with dense sequences and
    non-decreasing `recorded_at` (rejected commands are dropped). Commands are mostly guided by the
    snapshot (start the pending step, retry the running one, deliver to an active hook, …), so
    histories reach retries, cancellation with cleanup steps, every terminal status, late step
    outcomes after the run ended, retained hooks disposed after the end, repeated and idempotent
    deliveries, hook conflicts, attributes, progress, children and waits; some commands come from
    `commands()` to keep the unexpected in the mix.

    Raises:
        InvalidCommand: `workflow_name` or `input` is not one a run can have.
    """
    definition = _definition(workflow_name, input, start)
    return _valid_histories(run_id, max_commands, start, limits, definition)


@st.composite
def _snapshots(
    draw: st.DrawFn,
    run_id: str,
    max_commands: int,
    start: datetime,
    limits: Limits,
    definition: _Definition,
) -> Snapshot:
    history = draw(_valid_histories(run_id, max_commands, start, limits, definition))
    # Every prefix of a valid history is reachable: states a run passes through (cancelling,
    # suspended on a retry) are as interesting as where it ends.
    cut = draw(weighted((1, st.integers(1, len(history))), (1, st.just(len(history)))))
    return project_run(history[:cut], limits=limits)


def snapshots(
    run_id: str = DEFAULT_RUN_ID,
    *,
    max_commands: int = 40,
    start: datetime = START,
    limits: Limits = DEFAULT_LIMITS,
    workflow_name: str | None = None,
    input: bytes | None = None,
) -> st.SearchStrategy[Snapshot]:
    """Snapshots reachable from valid histories.

    Each is `project_run` of a `valid_histories()` history (of `workflow_name` with `input`, when
    given) or of one of its prefixes, so states a run only passes through are drawn too.

    Raises:
        InvalidCommand: `workflow_name` or `input` is not one a run can have.
    """
    definition = _definition(workflow_name, input, start)
    return _snapshots(run_id, max_commands, start, limits, definition)
