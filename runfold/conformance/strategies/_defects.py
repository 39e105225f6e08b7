"""Invalid histories: a valid history with one defect, and the sequence `HistoryError` must name.

A consumer of histories (a reducer, a store, a runtime replaying a run) must either project a
history or report the first envelope that breaks a law. `invalid_histories()` puts one defect of
a named kind into a `valid_histories()` history, and `histories()` mixes both, for error-path
tests.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Literal, TypeAlias, get_args

import attrs
from hypothesis import strategies as st

from runfold.conformance.strategies._guided_histories import (
    envelopes_after,
    ids_where,
    valid_histories,
)
from runfold.conformance.strategies._pools import DEFAULT_RUN_ID, FOREIGN_RUN_ID, START
from runfold.kernel import (
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Envelope,
    Event,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    StartRun,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepStarted,
    WaitCompleted,
    WaitCreated,
    project_run,
)

__all__ = [
    "INVALID_HISTORY_KINDS",
    "InvalidHistory",
    "InvalidHistoryKind",
    "histories",
    "invalid_histories",
]

InvalidHistoryKind: TypeAlias = Literal[
    "empty",
    "gap",
    "repeat",
    "foreign_run",
    "not_from_one",
    "missing_run_created",
    "run_created_again",
    "after_terminal",
    "wrong_attempt",
    "unknown_entity",
    "outcome_after_outcome",
    "not_an_event",
]
"""The name of a defect `invalid_histories()` can put into a history."""

INVALID_HISTORY_KINDS: tuple[InvalidHistoryKind, ...] = get_args(InvalidHistoryKind)
"""Every defect `invalid_histories()` can put into a history."""


@attrs.frozen(kw_only=True)
class InvalidHistory:
    """A history with one defect, and what `project_run` must report for it.

    `sequence` is the position (1-based) of the first envelope that breaks a law, which is the
    sequence the history should have had there: for a gap or a repeat, the missing sequence.
    `run_id` is the run the history is of (None for an empty history).
    """

    kind: InvalidHistoryKind
    history: list[Envelope]
    sequence: int
    run_id: str | None


def _renumbered(envelopes: Sequence[Envelope], first: int) -> list[Envelope]:
    return [attrs.evolve(env, sequence=first + i) for i, env in enumerate(envelopes)]


_AFTER_TERMINAL: tuple[Event, ...] = (
    RunStarted(),
    LogRecorded(level="info", message="late"),
    WaitCreated(wait_id="late", resume_at=START),
    StepCreated(step_id="late", step_name="late", input=b""),
    RunCompleted(output=b""),
    RunFailed(error=b""),
    CancelRequested(),
    RunCancelled(),
    AttributesSet(changes=()),
    ProgressRecorded(progress_id="late", completed=0),
    ChildLinked(reference_id="late", kind="k", operation_id="o"),
    HookCreated(hook_id="late", token="late-token"),
)


def _mutate(
    draw: st.DrawFn, kind: InvalidHistoryKind, h: list[Envelope]
) -> tuple[list[Envelope], int] | None:
    """`h` with a defect of `kind` and the position where it shows, or None if not applicable."""
    n = len(h)
    run_id = h[0].run_id
    last = h[-1]
    at = last.recorded_at
    if kind == "empty":
        return [], 0
    if kind == "gap":
        i = draw(st.integers(1, n))
        skip = draw(st.integers(1, 3))
        tail = h[i:] or [
            Envelope(run_id=run_id, sequence=n + 1, event=RunStarted(), recorded_at=at)
        ]
        return h[:i] + _renumbered(tail, i + 1 + skip), i + 1
    if kind == "repeat":
        i = draw(st.integers(0, n - 1))
        return [*h[: i + 1], h[i], *h[i + 1 :]], i + 2
    if kind == "foreign_run":
        i = draw(st.integers(1, n))
        if i == n:
            intruder = Envelope(
                run_id=FOREIGN_RUN_ID, sequence=n + 1, event=RunStarted(), recorded_at=at
            )
            return [*h, intruder], n + 1
        return [*h[:i], attrs.evolve(h[i], run_id=FOREIGN_RUN_ID), *h[i + 1 :]], i + 1
    if kind == "not_from_one":
        return _renumbered(h, 1 + draw(st.integers(1, 3))), 1
    if kind == "missing_run_created":
        if n == 1:
            return None
        return _renumbered(h[1:], 1), 1
    if kind == "run_created_again":
        i = draw(st.integers(1, n))
        again = attrs.evolve(h[0], sequence=i + 1)
        return [*h[:i], again, *_renumbered(h[i:], i + 2)], i + 1
    if kind == "after_terminal":
        snap = project_run(h)
        extra: list[Event] = []
        if snap.is_live:
            extra.append(RunFailed(error=b"ended"))
        extra.append(draw(st.sampled_from(_AFTER_TERMINAL)))
        return h + envelopes_after(run_id, n, extra, at), n + len(extra)
    if kind == "wrong_attempt":
        for i, env in enumerate(h):
            if isinstance(env.event, StepStarted):
                attempt = env.event.attempt
                wrong = draw(st.sampled_from((0, attempt + 1, attempt + 2, attempt - 1)))
                bad = attrs.evolve(env, event=StepStarted(step_id=env.event.step_id, attempt=wrong))
                return [*h[:i], bad, *h[i + 1 :]], i + 1
        if not project_run(h).is_live:
            return None
        wrong = draw(st.sampled_from((0, 2, 3)))
        extra = [
            StepCreated(step_id="extra", step_name="extra", input=b""),
            StepStarted(step_id="extra", attempt=wrong),
        ]
        return h + envelopes_after(run_id, n, extra, at), n + 2
    if kind == "unknown_entity":
        event = draw(
            st.sampled_from(
                (
                    StepStarted(step_id="never", attempt=1),
                    StepCompleted(step_id="never", output=b""),
                    WaitCompleted(wait_id="never"),
                    HookReceived(hook_id="never", payload=b""),
                    HookDisposed(hook_id="never"),
                )
            )
        )
        return h + envelopes_after(run_id, n, [event], at), n + 1
    if kind == "outcome_after_outcome":
        done = ids_where(project_run(h).steps, lambda s: s.status not in ("pending", "running"))
        if not done:
            return None
        step_id = draw(st.sampled_from(done))
        event = draw(
            st.sampled_from(
                (
                    StepCompleted(step_id=step_id, output=b""),
                    StepFailed(step_id=step_id, error=b""),
                    StepStarted(step_id=step_id, attempt=project_run(h).steps[step_id].attempt + 1),
                )
            )
        )
        return h + envelopes_after(run_id, n, [event], at), n + 1
    if kind == "not_an_event":
        i = draw(st.integers(0, n - 1))
        stranger: Any = draw(st.sampled_from((StartRun(), "run_started", None)))
        return [*h[:i], attrs.evolve(h[i], event=stranger), *h[i + 1 :]], i + 1
    raise AssertionError(f"unknown kind {kind}")


@st.composite
def _invalid_histories(
    draw: st.DrawFn, run_id: str, kinds: tuple[InvalidHistoryKind, ...], max_commands: int
) -> InvalidHistory:
    history = draw(valid_histories(run_id, max_commands=max_commands))
    kind = draw(st.sampled_from(kinds))
    mutated = _mutate(draw, kind, history)
    if mutated is None:
        kind = "unknown_entity"
        mutated = _mutate(draw, kind, history)
        assert mutated is not None
    broken, sequence = mutated
    return InvalidHistory(
        kind=kind, history=broken, sequence=sequence, run_id=run_id if broken else None
    )


def invalid_histories(
    run_id: str = DEFAULT_RUN_ID,
    *,
    kinds: Collection[InvalidHistoryKind] = INVALID_HISTORY_KINDS,
    max_commands: int = 20,
) -> st.SearchStrategy[InvalidHistory]:
    """Valid histories with one defect of one of `kinds`, each with the sequence to blame.

    The defects (`INVALID_HISTORY_KINDS`): gaps, repeats, envelopes of another run, sequences not
    starting at 1, a missing or repeated `run_created`, events after the run ended, wrong step
    attempts, events for unknown entities or for finished steps, objects that are not events.
    Each comes with the sequence `HistoryError` must name. A defect that does not fit the drawn
    history (say, no finished step to finish again) is replaced by an event for an unknown
    entity.

    Raises:
        ValueError: `kinds` is empty.
    """
    chosen = tuple(kinds)
    if not chosen:
        raise ValueError("kinds must not be empty")
    return _invalid_histories(run_id, chosen, max_commands)


def histories(
    run_id: str = DEFAULT_RUN_ID, *, max_commands: int = 20
) -> st.SearchStrategy[list[Envelope]]:
    """Valid histories and invalid ones (see `invalid_histories()`), for error-path tests.

    A consumer of histories must either project them or report a `HistoryError`.
    """
    return st.one_of(
        valid_histories(run_id, max_commands=max_commands),
        invalid_histories(run_id, max_commands=max_commands).map(lambda bad: bad.history),
    )
