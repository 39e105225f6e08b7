"""The reducer: `project_run` folds a run's history into its snapshot, `apply` catches one up.

The reducer folds with mutable private records and publishes frozen views: a step, wait or hook is
kept as a small slotted record and turned into its frozen `StepState`/`WaitState`/`HookState` when
read through the snapshot's mappings. `apply` copies a record only when an event touches it, and
the entity mappings are persistent (`_pmap.PView`), so catching a cached snapshot up costs time in
proportion to the new events, not to the run.

This is the fold itself: a builder (`_builder`) started from the history's first event or
resumed from the snapshot, each following envelope checked for its sequence and run and handed
to its event type's handler (`_handlers`), and the builder frozen into the snapshot at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from runfold.kernel.bulk import BULK, in_bulk
from runfold.kernel.errors import HistoryError
from runfold.kernel.events import Envelope, Event
from runfold.kernel.limits import DEFAULT_LIMITS, Limits
from runfold.kernel.snapshot._builder import Builder, resume_builder, start_builder
from runfold.kernel.snapshot._handlers import HANDLERS
from runfold.kernel.snapshot.states import Snapshot

__all__ = ["apply", "apply_decided", "project_run"]


def _fold(b: Builder, envelopes: Iterable[Envelope]) -> Snapshot:
    run_id = b.run_id
    seq = b.seq
    handlers = HANDLERS
    at = b.updated_at
    for env in envelopes:
        seq += 1
        b.seq = seq
        if env.sequence != seq:
            raise b.fail(f"expected sequence {seq}, found {env.sequence} (gap or repeat)")
        if env.run_id != run_id:
            raise b.fail(f"envelope of run {env.run_id!r} in the history of {run_id!r}")
        event = env.event
        handler = handlers.get(type(event))
        if handler is None:
            raise b.fail(f"not an event: {type(event).__name__}")
        at = env.recorded_at
        handler(b, event, at)
    b.updated_at = at  # no handler reads it: the last event's time is the run's
    return b.freeze()


def project_run(history: Sequence[Envelope], *, limits: Limits = DEFAULT_LIMITS) -> Snapshot:
    """Fold a run's whole history into its snapshot.

    Raises `HistoryError(run_id, sequence, reason)` for a history that breaks a law of the
    event catalogue (gap, repeat, foreign run id, event before `run_created`, impossible
    transition), and `RunNotSupported` for a run stamped by a newer kernel spec.
    """
    if not history:
        raise HistoryError(None, 0, "empty history")
    first = history[0]
    b = start_builder(first, limits)
    rest = history[1:] if len(history) > 1 else ()
    return in_bulk(len(rest), _fold, b, rest)


def apply(
    snapshot: Snapshot, envelopes: Iterable[Envelope], *, limits: Limits = DEFAULT_LIMITS
) -> Snapshot:
    """Catch `snapshot` up with the events that follow it, in time proportional to those events.

    `apply(project_run(h[:k]), h[k:]) == project_run(h)`. The input snapshot is never changed.
    """
    b = resume_builder(snapshot, limits)
    count = len(envelopes) if isinstance(envelopes, list | tuple) else 0
    return in_bulk(count, _fold, b, envelopes)


def _fold_decided(b: Builder, events: Sequence[Event], at: datetime) -> Snapshot:
    seq = b.seq
    handlers = HANDLERS
    for event in events:
        seq += 1
        b.seq = seq
        handler = handlers.get(type(event))
        if handler is None:
            raise b.fail(f"not an event: {type(event).__name__}")
        handler(b, event, at)
    b.updated_at = at
    return b.freeze()


def apply_decided(
    snapshot: Snapshot, events: Sequence[Event], at: datetime, limits: Limits
) -> Snapshot:
    """`apply` of events just decided on `snapshot`, recorded at `at`, without their envelopes.

    The same fold, every law of history checked, as `apply(snapshot, envelopes)` of the
    envelopes `make_envelope` gives them from the snapshot's next sequence on: the envelopes'
    own checks (sequence, run id) hold by construction, so none is built.
    """
    b = resume_builder(snapshot, limits)
    if len(events) < BULK:
        return _fold_decided(b, events, at)
    return in_bulk(len(events), _fold_decided, b, events, at)
