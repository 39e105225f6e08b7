"""Arbitrary events of every type: field values that obey the field types, not the rules.

What a codec or a store must carry unchanged, whatever the kernel would have decided: text with
NUL and astral characters, from empty to hundreds of kilobytes; bytes up to 2 MiB; datetimes
from 1970 to year 9999; unbounded ints; optional fields None or set.
"""

from __future__ import annotations

from collections.abc import Collection

from hypothesis import strategies as st

from runfold.conformance.strategies._odds import optional
from runfold.conformance.strategies._values import ANY_BYTES, ANY_TEXT, UTC_TIMES
from runfold.kernel import (
    EVENT_TYPES,
    AttributeChange,
    AttributesSet,
    CancelRequested,
    ChildLinked,
    Event,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
    RetryPolicy,
    RunCancelled,
    RunClaimed,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunReleased,
    RunStarted,
    RunTimedOut,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepWriter,
    WaitCompleted,
    WaitCreated,
    WorkflowWriter,
)

__all__ = ["events"]


def _event_strategies() -> dict[type[Event], st.SearchStrategy[Event]]:
    text, data, time, ints = ANY_TEXT, ANY_BYTES, UTC_TIMES, st.integers()
    opt_text, opt_data, opt_time = optional(text), optional(data), optional(time)
    retry = st.builds(
        RetryPolicy,
        max_attempts=ints,
        initial_interval=st.timedeltas(),
        backoff_coefficient=st.floats(allow_nan=False),
        max_interval=optional(st.timedeltas()),
        non_retryable_error_codes=st.lists(text, max_size=3).map(tuple),
    )
    writer = st.one_of(st.just(WorkflowWriter()), st.builds(StepWriter, step_id=text, attempt=ints))
    changes = st.lists(st.builds(AttributeChange, key=text, value=opt_text), max_size=4)
    builds: dict[type[Event], st.SearchStrategy[Event]] = {
        RunCreated: st.builds(
            RunCreated,
            workflow_name=text,
            input=data,
            workflow_version=opt_text,
            deployment_id=opt_text,
            context=opt_data,
            attributes=st.dictionaries(text, text, max_size=4),
            parent_run_id=opt_text,
            deadline=opt_time,
            spec_version=ints,
            queue_name=opt_text,
            priority=ints,
            dedup_id=opt_text,
        ),
        RunStarted: st.builds(RunStarted),
        RunCompleted: st.builds(RunCompleted, output=data),
        RunFailed: st.builds(RunFailed, error=data, error_code=opt_text),
        CancelRequested: st.builds(CancelRequested, reason=opt_text),
        RunCancelled: st.builds(RunCancelled, reason=opt_text),
        RunTimedOut: st.builds(RunTimedOut, deadline=time, reason=opt_text),
        AttributesSet: st.builds(
            AttributesSet,
            changes=changes.map(tuple),
            writer=writer,
            write_id=opt_text,
            allow_reserved=st.booleans(),
        ),
        ProgressRecorded: st.builds(
            ProgressRecorded,
            progress_id=text,
            completed=ints,
            total=optional(ints),
            message=opt_text,
            details=opt_data,
        ),
        ChildLinked: st.builds(
            ChildLinked,
            reference_id=text,
            kind=text,
            operation_id=text,
            child_run_id=opt_text,
            metadata=opt_data,
        ),
        LogRecorded: st.builds(
            LogRecorded,
            level=st.sampled_from(("info", "warning", "error")),
            message=text,
            step_id=opt_text,
            data=opt_data,
            log_id=opt_text,
        ),
        StepCreated: st.builds(
            StepCreated, step_id=text, step_name=text, input=data, retry=optional(retry)
        ),
        StepStarted: st.builds(
            StepStarted,
            step_id=text,
            attempt=ints,
            after_interruption=st.booleans(),
            retry=optional(retry),
        ),
        StepCompleted: st.builds(StepCompleted, step_id=text, output=data),
        StepFailed: st.builds(StepFailed, step_id=text, error=data, retryable=st.booleans()),
        StepRetrying: st.builds(StepRetrying, step_id=text, error=data, retry_after=opt_time),
        StepCancelled: st.builds(StepCancelled, step_id=text, reason=opt_text),
        WaitCreated: st.builds(WaitCreated, wait_id=text, resume_at=time),
        WaitCompleted: st.builds(WaitCompleted, wait_id=text),
        HookCreated: st.builds(
            HookCreated,
            hook_id=text,
            token=text,
            metadata=opt_data,
            is_webhook=st.booleans(),
            retain_token_until=opt_time,
        ),
        HookReceived: st.builds(HookReceived, hook_id=text, payload=data, delivery_id=opt_text),
        HookDisposed: st.builds(HookDisposed, hook_id=text),
        HookConflict: st.builds(HookConflict, hook_id=text, token=text, holder_run_id=text),
        RunClaimed: st.builds(RunClaimed, owner_id=text, epoch=ints, displaced=opt_text),
        RunReleased: st.builds(RunReleased, owner_id=text, epoch=ints),
    }
    return builds


_EVENT_STRATEGIES = _event_strategies()


def events(types: Collection[str] | None = None) -> st.SearchStrategy[Event]:
    """Event instances of every type (or of the wire names in `types`) with arbitrary field values.

    Values need not obey the kernel's rules, only the field types: text with NUL and astral
    characters (never lone surrogates), from empty to hundreds of kilobytes; bytes with NUL, empty,
    up to 2 MiB; aware UTC datetimes from 1970 to year 9999 with microseconds; unbounded ints;
    optional fields None or set. Meant for codec and store round trips.
    """
    names = sorted(EVENT_TYPES) if types is None else sorted(types)
    chosen = []
    for name in names:
        cls = EVENT_TYPES.get(name)
        if cls is None or cls not in _EVENT_STRATEGIES:
            raise ValueError(f"no strategy for event type {name!r}")
        chosen.append(_EVENT_STRATEGIES[cls])
    if not chosen:
        raise ValueError("types must not be empty")
    return st.one_of(chosen)
