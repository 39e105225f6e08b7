"""Arbitrary commands of every class: what `decide` must accept, refuse, or reject as malformed.

`commands()` draws each command class with ids from the small pools, so commands hit the
entities `valid_histories()` creates as well as unknown ones; values the rules refuse are mixed
in unless `invalid=False`, and `malformed=True` adds commands with one field of the wrong type
(for "decide raises only `Rejection`"). `create_runs` is shared with the guided histories, whose
runs begin with one of its commands.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

import attrs
from hypothesis import strategies as st

from runfold.conformance.strategies._odds import optional, weighted
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
from runfold.conformance.strategies._values import (
    attribute_changes,
    attribute_maps,
    ids,
    labels,
    lazy_steps,
    payloads,
    retry_policies,
    texts,
    times,
    writers,
)
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
    FailRun,
    FailStep,
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
    WorkflowWriter,
)

__all__ = ["commands", "create_runs"]


@functools.lru_cache(maxsize=64)
def create_runs(run_id: str, around: datetime, invalid: bool) -> st.SearchStrategy[CreateRun]:
    """`CreateRun` commands near `around`, cached: every guided history begins with one."""
    return st.builds(
        CreateRun,
        workflow_name=labels(invalid),
        input=payloads(invalid),
        workflow_version=optional(st.sampled_from(("v1", "v2"))),
        deployment_id=optional(st.sampled_from(("dep-1",))),
        context=optional(payloads(invalid)),
        attributes=attribute_maps(invalid),
        allow_reserved=st.booleans(),
        parent_run_id=optional(st.sampled_from((FOREIGN_RUN_ID, run_id))),
        deadline=optional(times(around, anywhere=invalid)),
        # Queue fields go together (a priority or a dedup id needs a queue): drawn as a whole.
    ).flatmap(lambda create: _on_queue(create, invalid))


def _on_queue(create: CreateRun, invalid: bool) -> st.SearchStrategy[CreateRun]:
    """`create` on no queue, or on one with a priority and a deduplication id (with `invalid`,
    sometimes a priority out of range, or one or a dedup id without a queue)."""
    priorities = st.sampled_from((0, 1, 7))
    if invalid:
        priorities = weighted((8, priorities), (1, st.sampled_from((-1, 2**31, 2**63, True))))
    queued = st.builds(
        attrs.evolve,
        st.just(create),
        queue_name=ids(("emails", "reports"), invalid),
        priority=priorities,
        dedup_id=optional(ids(("d-1", "d-2"), invalid)),
    )
    choices = [(3, st.just(create)), (1, queued)]
    if invalid:
        lonely = st.builds(
            attrs.evolve, st.just(create), priority=priorities, dedup_id=ids(("d-1",), invalid)
        )
        choices.append((1, lonely))
    return weighted(*choices)


def _command_strategies(
    run_id: str, around: datetime, invalid: bool
) -> dict[type[Command], st.SearchStrategy[Command]]:
    steps, waits, hooks = ids(STEP_IDS, invalid), ids(WAIT_IDS, invalid), ids(HOOK_IDS, invalid)
    payload, text, time = payloads(invalid), texts(invalid), times(around, anywhere=invalid)
    reasons = st.sampled_from(REASONS)
    levels = st.sampled_from(("info", "warning", "error", "debug") if invalid else ("info",))
    tokens = ids(TOKENS, False)
    owners = ids(OWNER_IDS, invalid)
    if invalid:
        tokens = weighted((12, tokens), (1, st.sampled_from(("", "t" * 1025, "\ud800"))))
    ints = st.integers(-1, 4)
    create_run = create_runs(run_id, around, invalid)
    return {
        CreateRun: create_run,
        StartRun: st.builds(StartRun, create=optional(create_run)),
        CompleteRun: st.builds(CompleteRun, output=payload),
        FailRun: st.builds(FailRun, error=payload, error_code=optional(ids(("boom",), invalid))),
        RequestCancel: st.builds(RequestCancel, reason=reasons),
        CancelRun: st.builds(CancelRun, reason=reasons),
        TimeOutRun: st.builds(TimeOutRun, deadline=time, reason=reasons),
        SetAttributes: st.builds(
            SetAttributes,
            changes=attribute_changes(invalid),
            writer=writers(invalid),
            write_id=optional(ids(WRITE_IDS, invalid)),
            allow_reserved=st.booleans(),
        ),
        RecordProgress: st.builds(
            RecordProgress,
            progress_id=ids(PROGRESS_IDS, invalid),
            completed=ints,
            total=optional(ints),
            message=optional(text),
            details=optional(payload),
        ),
        LinkChild: st.builds(
            LinkChild,
            reference_id=ids(REFERENCE_IDS, invalid),
            kind=labels(invalid),
            operation_id=ids(("op-1", "op-2"), invalid),
            child_run_id=optional(ids((FOREIGN_RUN_ID, run_id), invalid)),
            metadata=optional(payload),
        ),
        RecordLog: st.builds(
            RecordLog,
            level=levels,
            message=text,
            step_id=optional(steps),
            data=optional(payload),
            log_id=optional(ids(("log-1", "log-2"), invalid)),
        ),
        CreateStep: st.builds(
            CreateStep,
            step_id=steps,
            step_name=labels(invalid),
            input=payload,
            retry=optional(retry_policies(invalid)),
        ),
        StartStep: st.one_of(
            st.builds(
                StartStep,
                step_id=steps,
                lazy=optional(lazy_steps(invalid)),
                start_id=optional(ids(("start-1", "start-2"), invalid)),
            ),
            st.builds(StartStep, step_id=steps, retry=retry_policies(invalid)),
        ),
        CompleteStep: st.builds(CompleteStep, step_id=steps, output=payload),
        FailStep: st.builds(FailStep, step_id=steps, error=payload, retryable=st.booleans()),
        RetryStep: st.builds(RetryStep, step_id=steps, error=payload, retry_after=optional(time)),
        CancelStep: st.builds(CancelStep, step_id=steps, reason=reasons),
        CreateWait: st.builds(CreateWait, wait_id=waits, resume_at=time),
        CompleteWait: st.builds(CompleteWait, wait_id=waits),
        CreateHook: st.builds(
            CreateHook,
            hook_id=hooks,
            token=tokens,
            metadata=optional(payload),
            is_webhook=st.booleans(),
            retain_token_until=optional(time),
        ),
        ReceiveHook: st.builds(
            ReceiveHook,
            hook_id=hooks,
            payload=payload,
            delivery_id=optional(ids(DELIVERY_IDS, invalid)),
        ),
        DisposeHook: st.builds(DisposeHook, hook_id=hooks),
        ClaimRun: st.builds(
            ClaimRun, owner_id=owners, displacing=optional(ids(OWNER_IDS, invalid))
        ),
        ReleaseRun: st.builds(ReleaseRun, owner_id=owners),
    }


_JUNK: tuple[object, ...] = (
    None,
    0,
    -1,
    2**70,
    1.5,
    float("nan"),
    True,
    "",
    "s0",
    b"",
    b"s0",
    [],
    {},
    (),
    ("s0",),
    {"k0": 1},
    object(),
    datetime(2026, 1, 1),
    timedelta(days=1),
    WorkflowWriter(),
)
"""Values of the wrong type for some field or other (shared: never mutated by the kernel)."""


def _malform(draw: st.DrawFn, value: Any, depth: int = 0) -> Any:
    """A copy of the attrs instance `value` with one (possibly nested) field of the wrong type.

    Fields are replaced with `object.__setattr__`, past converters, the way a deserializer or a
    caller ignoring the type hints would hand a command to `decide`.
    """
    fields = attrs.fields(type(value))
    if not fields:
        return value
    field = draw(st.sampled_from(fields))
    current = getattr(value, field.name)
    replacement: Any
    if depth < 2 and attrs.has(type(current)) and draw(st.booleans()):
        replacement = _malform(draw, current, depth + 1)
    elif (
        depth < 2
        and isinstance(current, tuple)
        and current
        and attrs.has(type(current[0]))
        and draw(st.booleans())
    ):
        index = draw(st.integers(0, len(current) - 1))
        inner = _malform(draw, current[index], depth + 1)
        replacement = (*current[:index], inner, *current[index + 1 :])
    else:
        replacement = draw(st.sampled_from(_JUNK))
    changed = copy.copy(value)
    object.__setattr__(changed, field.name, replacement)
    return changed


@st.composite
def _malformed(draw: st.DrawFn, base: st.SearchStrategy[Command]) -> Command:
    command: Command = _malform(draw, draw(base))
    return command


def commands(
    run_id: str = DEFAULT_RUN_ID,
    *,
    around: datetime = START,
    invalid: bool = True,
    malformed: bool = False,
    types: Collection[type[Command]] | None = None,
) -> st.SearchStrategy[Command]:
    """Arbitrary commands of every class.

    Ids come from the small module pools (`STEP_IDS`, `HOOK_IDS`, `TOKENS`, …), so commands hit the
    entities `valid_histories()` creates as well as unknown ones. Datetimes are timezone-aware
    (UTC and fixed offsets), mostly near `around` (so retries are due or not, retention is within
    30 days or not) and sometimes anywhere in 1970-9999. `run_id` is used where a command names a
    run (parent and child run ids), so self-references are exercised.

    `invalid=True` (the default) mixes in values the rules refuse (empty, over-long and
    control-character ids, lone surrogates, oversized payloads, bad retry policies, attribute
    limits); `malformed=True` also yields (mostly) commands that are valid but for one field of
    the wrong type (naive datetimes, ints for strings, lists for bytes, …), which may be nested
    in `create`/`lazy`/`retry`/`writer`/`changes`.
    `types` restricts the draw to those command classes (all by default).
    """

    def chosen(invalid: bool) -> st.SearchStrategy[Command]:
        every = _command_strategies(run_id, around, invalid)
        if types is not None:
            unknown = set(types) - set(every)
            if unknown or not types:
                raise ValueError(f"no strategy for command classes {sorted(map(str, unknown))}")
            every = {cls: every[cls] for cls in types}
        return st.one_of(list(every.values()))

    base = chosen(invalid)
    if not malformed:
        return base
    # One wrong-typed field in an otherwise valid command, so that field's check is reached.
    return weighted((1, base), (3, _malformed(chosen(False))))
