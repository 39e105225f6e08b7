"""Hypothesis strategies for runtime authors: commands, histories, snapshots and events.

- `commands()`: arbitrary commands of every class (or of `types`), with ids from small pools so
  they hit the entities `valid_histories()` creates; valid and invalid field values
  (`malformed=True` adds a field of the wrong type, for "decide raises only `Rejection`").
- `valid_histories()`: histories built by deciding commands with `decide` on the current snapshot,
  so always valid; they reach retries, cancellation, late step outcomes, retained hooks, deliveries.
- `invalid_histories()`: a valid history with one defect and the sequence `HistoryError` names.
- `histories()`: both, for error-path tests.
- `snapshots()`: `project_run` of `valid_histories()` (or of one of their prefixes).
- `events()`: arbitrary event instances of every type, for codec round trips.

Everything is deterministic given hypothesis' choices: no clock, no randomness of its own.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Literal, TypeAlias, TypeVar, get_args

import attrs
from hypothesis import strategies as st

from runfold.kernel import (
    EVENT_TYPES,
    AttributeChange,
    AttributesSet,
    CancelRequested,
    CancelRun,
    CancelStep,
    ChildLinked,
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
    HookConflict,
    HookCreated,
    HookDisposed,
    HookHolder,
    HookReceived,
    LazyStep,
    Limits,
    LinkChild,
    LogRecorded,
    ProgressRecorded,
    ReceiveHook,
    RecordLog,
    RecordProgress,
    Rejection,
    RequestCancel,
    RetryPolicy,
    RetryStep,
    RunCancelled,
    RunCompleted,
    RunCreated,
    RunFailed,
    RunStarted,
    RunTimedOut,
    SetAttributes,
    Snapshot,
    StartRun,
    StartStep,
    StepCancelled,
    StepCompleted,
    StepCreated,
    StepFailed,
    StepRetrying,
    StepStarted,
    StepWriter,
    TimeOutRun,
    WaitCompleted,
    WaitCreated,
    WorkflowWriter,
    apply,
    decide,
    project_run,
)

__all__ = [
    "ATTRIBUTE_KEYS",
    "DEFAULT_RUN_ID",
    "DELIVERY_IDS",
    "FOREIGN_RUN_ID",
    "HOOK_IDS",
    "INVALID_HISTORY_KINDS",
    "PROGRESS_IDS",
    "REFERENCE_IDS",
    "START",
    "STEP_IDS",
    "TOKENS",
    "WAIT_IDS",
    "WRITE_IDS",
    "InvalidHistory",
    "InvalidHistoryKind",
    "commands",
    "events",
    "histories",
    "invalid_histories",
    "snapshots",
    "valid_histories",
]

T = TypeVar("T")

DEFAULT_RUN_ID = "run-1"
"""The run id histories and snapshots use unless told otherwise."""
FOREIGN_RUN_ID = "run-2"
"""Another run: holder of conflicting hook tokens, parent of children, intruder in histories."""
START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
"""When generated histories begin, and what `commands()` draws its near times around."""

# Id pools. `valid_histories()` names new entities `s0, s1, …`, `w0, …`, `h0, …` in creation order,
# so `commands()` drawing from these pools hits existing entities as well as unknown ones.
STEP_IDS = ("s0", "s1", "s2", "s3")
"""Step ids `commands()` draws; `valid_histories()` creates `s0, s1, …` in that order."""
WAIT_IDS = ("w0", "w1", "w2")
"""Wait ids `commands()` draws; `valid_histories()` creates `w0, w1, …` in that order."""
HOOK_IDS = ("h0", "h1", "h2")
"""Hook ids `commands()` draws; `valid_histories()` creates `h0, h1, …` in that order."""
TOKENS = ("tok-0", "tok-1", "tok-2")
"""Hook tokens both strategies draw, so hooks contend for the same tokens."""
PROGRESS_IDS = ("p0", "p1")
"""Progress ids `commands()` draws."""
REFERENCE_IDS = ("c0", "c1")
"""Child reference ids `commands()` draws."""
WRITE_IDS = ("wr0", "wr1")
"""Attribute write ids `commands()` draws."""
DELIVERY_IDS = ("d0", "d1")
"""Hook delivery ids `commands()` draws."""
ATTRIBUTE_KEYS = ("k0", "k1", "k2", "$sys")
"""Attribute keys `commands()` draws, `$sys` among them for the reserved prefix."""
_REASONS: tuple[str | None, ...] = (None, "user", "shutdown")
_DEFAULT_LIMITS = Limits()

_UTC_MIN = datetime(1970, 1, 1)
_UTC_MAX = datetime(9999, 12, 31, 23, 59, 59, 999999)
_OFFSETS = (
    UTC,
    timezone(timedelta(hours=5, minutes=30)),
    timezone(timedelta(hours=-8)),
    timezone(timedelta(hours=14)),
)


def _weighted(*options: tuple[int, st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """Draw from one of `options` with the given integer weights (shrinks towards the first)."""
    # Sampling indices, not the strategies themselves: a table of repeated strategies would
    # repeat their reprs too, and nested weights made reports of hundreds of kB.
    strategies = [strategy for _, strategy in options]
    table = [n for n, (weight, _) in enumerate(options) for _ in range(weight)]
    return st.sampled_from(table).flatmap(strategies.__getitem__)


def _choose(draw: st.DrawFn, options: Sequence[tuple[int, str]]) -> str:
    """Pick one name from `(weight, name)` pairs (shrinks towards the first)."""
    total = sum(weight for weight, _ in options)
    index = draw(st.integers(0, total - 1))
    for weight, name in options:
        if index < weight:
            return name
        index -= weight
    raise AssertionError("unreachable")


def _optional(strategy: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    return _weighted((1, st.none()), (2, strategy))


# --- field values -------------------------------------------------------------------------------

_SAFE_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
"""Text without lone surrogates: NUL, control characters, astral characters included."""
_ASTRAL = st.sampled_from(("😀", "𝄞", "\U0010ffff", "\U00020000"))
_ANY_TEXT = _weighted(
    (6, _SAFE_TEXT),
    (2, st.text(st.one_of(st.characters(codec="utf-8"), _ASTRAL, st.just("\x00")), max_size=40)),
    (1, st.just("")),
    (1, st.sampled_from((65_537, 300_000)).map(lambda n: ("x" * n) + "😀")),
)
"""Event text: anything encodable, from empty to large."""

_LARGE_BYTES = bytes(range(256)) * (2 * 1024 * 1024 // 256 + 1)
_ANY_BYTES = _weighted(
    (6, st.binary(max_size=64)),
    (2, st.just(b"")),
    (1, st.integers(1, 512).map(lambda n: b"\x00" * n)),
    (
        1,
        st.sampled_from((65_536, 1024 * 1024 + 3, 2 * 1024 * 1024)).map(lambda n: _LARGE_BYTES[:n]),
    ),
)
"""Event payloads: NUL bytes, empty, and large (up to 2 MiB)."""

_UTC_TIMES = st.datetimes(min_value=_UTC_MIN, max_value=_UTC_MAX, timezones=st.just(UTC))
"""Aware UTC datetimes from 1970 to the end of year 9999, microsecond precision."""


def _ids(pool: Sequence[str], invalid: bool) -> st.SearchStrategy[str]:
    valid = st.sampled_from(pool)
    if not invalid:
        return valid
    unusual = st.sampled_from(("ü-id", "😀", "x" * 256, "a b"))
    broken = st.sampled_from(("", "x" * 257, "bad\x00id", "tab\tid", "\x85", "\ud800"))
    return _weighted((12, valid), (1, unusual), (1, broken))


def _labels(invalid: bool) -> st.SearchStrategy[str]:
    return _ids(("fetch", "send", "charge"), invalid)


def _payloads(invalid: bool) -> st.SearchStrategy[bytes]:
    valid = _weighted(
        (3, st.sampled_from((b"", b"x", b"\x00", b"\x00\xff\x00"))), (1, st.binary(max_size=16))
    )
    if not invalid:
        return valid
    # Over-limit values are built by `.map`: as literals they would sit in the strategy's
    # repr, which hypothesis prints in reports (and warns about past 30 kB).
    too_big = st.just(_DEFAULT_LIMITS.max_payload_bytes + 1).map(bytes)
    return _weighted((20, valid), (1, too_big))


def _texts(invalid: bool) -> st.SearchStrategy[str]:
    valid = _weighted((3, st.sampled_from(("", "why", "😀 astral", "nul\x00"))), (1, _SAFE_TEXT))
    if not invalid:
        return valid
    broken = st.just("\ud800") | st.just(_DEFAULT_LIMITS.max_payload_bytes + 1).map("x".__mul__)
    return _weighted((15, valid), (1, broken))


def _times(around: datetime, anywhere: bool = True) -> st.SearchStrategy[datetime]:
    """Aware datetimes: mostly near `around` (both sides), sometimes anywhere in 1970-9999."""
    near = st.builds(
        lambda seconds, tz: (around + timedelta(seconds=seconds)).astimezone(tz),
        st.integers(-3 * 86_400, 40 * 86_400),
        st.sampled_from(_OFFSETS),
    )
    exact = st.sampled_from((around, around + timedelta(days=30), around + timedelta(days=31)))
    # Local times up to the end of 9999: with a negative offset the instant can lie past it.
    far = st.datetimes(min_value=_UTC_MIN, max_value=_UTC_MAX, timezones=st.sampled_from(_OFFSETS))
    if not anywhere:
        return _weighted((6, near), (2, exact))
    return _weighted((6, near), (2, exact), (2, far))


def _retry_policies(invalid: bool) -> st.SearchStrategy[RetryPolicy]:
    valid = st.builds(
        RetryPolicy,
        max_attempts=st.integers(1, 4),
        initial_interval=st.sampled_from((timedelta(0), timedelta(seconds=1))),
        backoff_coefficient=st.sampled_from((1.0, 2.0)),
        max_interval=st.none() | st.just(timedelta(minutes=1)),
        non_retryable_error_codes=st.sampled_from(((), ("bad_input",))),
    )
    if not invalid:
        return valid
    broken = st.sampled_from(
        (
            RetryPolicy(max_attempts=0),
            RetryPolicy(max_attempts=-1),
            RetryPolicy(initial_interval=timedelta(seconds=-1)),
            RetryPolicy(max_interval=timedelta(seconds=-1)),
            RetryPolicy(backoff_coefficient=0.5),
            RetryPolicy(backoff_coefficient=float("nan")),
            RetryPolicy(backoff_coefficient=float("inf")),
            RetryPolicy(non_retryable_error_codes=("",)),
        )
    )
    return _weighted((8, valid), (1, broken))


def _attribute_changes(invalid: bool) -> st.SearchStrategy[tuple[AttributeChange, ...]]:
    value = _optional(st.sampled_from(("v", "", "ü" * 128)))
    keys = st.sampled_from(ATTRIBUTE_KEYS)
    if invalid:
        value = _weighted((12, value), (1, st.just("x" * 257)), (1, st.just("\ud800")))
        keys = _weighted((12, keys), (1, st.sampled_from(("", "k" * 257, "\ud800"))))
    change = st.builds(AttributeChange, key=keys, value=value)
    batch = st.lists(change, max_size=4, unique_by=(lambda c: c.key) if not invalid else None)
    many = st.just(tuple(AttributeChange(key=f"bulk{i}", value="v") for i in range(65)))
    if not invalid:
        return batch.map(tuple)
    return _weighted((15, batch.map(tuple)), (1, many))


def _attribute_maps(invalid: bool) -> st.SearchStrategy[dict[str, str]]:
    keys = ATTRIBUTE_KEYS if invalid else ATTRIBUTE_KEYS[:3]
    valid = st.dictionaries(st.sampled_from(keys), st.sampled_from(("v", "")), max_size=3)
    if not invalid:
        return valid
    too_many = st.just({f"bulk{i}": "v" for i in range(65)})
    broken = st.sampled_from(({"": "v"}, {"k0": "x" * 257}, {"k" * 257: "v"}))
    return _weighted((12, valid), (1, too_many), (1, broken))


# --- commands -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _create_runs(run_id: str, around: datetime, invalid: bool) -> st.SearchStrategy[CreateRun]:
    return st.builds(
        CreateRun,
        workflow_name=_labels(invalid),
        input=_payloads(invalid),
        workflow_version=_optional(st.sampled_from(("v1", "v2"))),
        deployment_id=_optional(st.sampled_from(("dep-1",))),
        context=_optional(_payloads(invalid)),
        attributes=_attribute_maps(invalid),
        allow_reserved=st.booleans(),
        parent_run_id=_optional(st.sampled_from((FOREIGN_RUN_ID, run_id))),
        deadline=_optional(_times(around, anywhere=invalid)),
    )


def _lazy_steps(invalid: bool) -> st.SearchStrategy[LazyStep]:
    return st.builds(
        LazyStep,
        step_name=_labels(invalid),
        input=_payloads(invalid),
        retry=_optional(_retry_policies(invalid)),
    )


def _writers(invalid: bool) -> st.SearchStrategy[WorkflowWriter | StepWriter]:
    step_writer = st.builds(StepWriter, step_id=_ids(STEP_IDS, invalid), attempt=st.integers(0, 3))
    return st.one_of(st.just(WorkflowWriter()), step_writer)


def _command_strategies(
    run_id: str, around: datetime, invalid: bool
) -> dict[type[Command], st.SearchStrategy[Command]]:
    steps, waits, hooks = _ids(STEP_IDS, invalid), _ids(WAIT_IDS, invalid), _ids(HOOK_IDS, invalid)
    payload, text, time = _payloads(invalid), _texts(invalid), _times(around, anywhere=invalid)
    reasons = st.sampled_from(_REASONS)
    levels = st.sampled_from(("info", "warning", "error", "debug") if invalid else ("info",))
    tokens = _ids(TOKENS, False)
    if invalid:
        tokens = _weighted((12, tokens), (1, st.sampled_from(("", "t" * 1025, "\ud800"))))
    ints = st.integers(-1, 4)
    create_run = _create_runs(run_id, around, invalid)
    return {
        CreateRun: create_run,
        StartRun: st.builds(StartRun, create=_optional(create_run)),
        CompleteRun: st.builds(CompleteRun, output=payload),
        FailRun: st.builds(FailRun, error=payload, error_code=_optional(_ids(("boom",), invalid))),
        RequestCancel: st.builds(RequestCancel, reason=reasons),
        CancelRun: st.builds(CancelRun, reason=reasons),
        TimeOutRun: st.builds(TimeOutRun, deadline=time, reason=reasons),
        SetAttributes: st.builds(
            SetAttributes,
            changes=_attribute_changes(invalid),
            writer=_writers(invalid),
            write_id=_optional(_ids(WRITE_IDS, invalid)),
            allow_reserved=st.booleans(),
        ),
        RecordProgress: st.builds(
            RecordProgress,
            progress_id=_ids(PROGRESS_IDS, invalid),
            completed=ints,
            total=_optional(ints),
            message=_optional(text),
            details=_optional(payload),
        ),
        LinkChild: st.builds(
            LinkChild,
            reference_id=_ids(REFERENCE_IDS, invalid),
            kind=_labels(invalid),
            operation_id=_ids(("op-1", "op-2"), invalid),
            child_run_id=_optional(_ids((FOREIGN_RUN_ID, run_id), invalid)),
            metadata=_optional(payload),
        ),
        RecordLog: st.builds(
            RecordLog,
            level=levels,
            message=text,
            step_id=_optional(steps),
            data=_optional(payload),
        ),
        CreateStep: st.builds(
            CreateStep,
            step_id=steps,
            step_name=_labels(invalid),
            input=payload,
            retry=_optional(_retry_policies(invalid)),
        ),
        StartStep: st.one_of(
            st.builds(StartStep, step_id=steps, lazy=_optional(_lazy_steps(invalid))),
            st.builds(StartStep, step_id=steps, retry=_retry_policies(invalid)),
        ),
        CompleteStep: st.builds(CompleteStep, step_id=steps, output=payload),
        FailStep: st.builds(FailStep, step_id=steps, error=payload, retryable=st.booleans()),
        RetryStep: st.builds(RetryStep, step_id=steps, error=payload, retry_after=_optional(time)),
        CancelStep: st.builds(CancelStep, step_id=steps, reason=reasons),
        CreateWait: st.builds(CreateWait, wait_id=waits, resume_at=time),
        CompleteWait: st.builds(CompleteWait, wait_id=waits),
        CreateHook: st.builds(
            CreateHook,
            hook_id=hooks,
            token=tokens,
            metadata=_optional(payload),
            is_webhook=st.booleans(),
            retain_token_until=_optional(time),
        ),
        ReceiveHook: st.builds(
            ReceiveHook,
            hook_id=hooks,
            payload=payload,
            delivery_id=_optional(_ids(DELIVERY_IDS, invalid)),
        ),
        DisposeHook: st.builds(DisposeHook, hook_id=hooks),
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
    return _weighted((1, base), (3, _malformed(chosen(False))))


# --- valid histories ----------------------------------------------------------------------------

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
    (6, "arbitrary"),
    (12, "create_step"),
)
"""What a live run is asked, by weight: a run usually lives ~20 commands before it ends. Hypothesis
draws the bounds of an integer range more often than the rest, so the first and last entries are
harmless and the run-ending kinds sit in the middle."""


def _ids_where(mapping: Any, predicate: Callable[[Any], bool]) -> list[str]:
    return [key for key, state in mapping.items() if predicate(state)]


def _pick(draw: st.DrawFn, preferred: list[str], fallback: Sequence[str]) -> str:
    return draw(st.sampled_from(preferred if preferred else fallback))


def _fresh(prefix: str, taken: Collection[str]) -> str:
    return f"{prefix}{len(taken)}"


_SMALL = st.sampled_from((b"", b"x", b"\x00\xff"))
_GUIDED_RETRY = _optional(_retry_policies(False))
_GUIDED_CHANGES = _attribute_changes(False)
_GUIDED_WRITERS = _writers(False)
_GUIDED_METADATA = _optional(_SMALL)


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
    running = _ids_where(snap.steps, lambda s: s.status == "running")
    live_steps = _ids_where(snap.steps, lambda s: s.status in ("pending", "running"))
    active = _ids_where(snap.hooks, lambda h: h.status == "active")
    waiting = _ids_where(snap.waits, lambda w: w.status == "waiting")
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
    kind = _choose(draw, kinds)
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
            return StartStep(step_id=draw(st.sampled_from(live_steps)), retry=retry), None
        lazy = LazyStep(step_name="lazy", input=b"", retry=draw(_GUIDED_RETRY))
        return StartStep(step_id=_fresh("s", snap.steps), lazy=lazy), None
    if kind in ("complete_step", "fail_step", "cancel_step"):
        # Outcomes go mostly to running steps (pending ones get an instant outcome).
        targets = running if running and kind != "cancel_step" and draw(st.booleans()) else []
        step_id = _pick(draw, targets or live_steps, STEP_IDS)
        if kind == "complete_step":
            return CompleteStep(step_id=step_id, output=draw(small)), None
        if kind == "fail_step":
            return FailStep(step_id=step_id, error=draw(small), retryable=draw(st.booleans())), None
        return CancelStep(step_id=step_id, reason=draw(st.sampled_from(_REASONS))), None
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
        return RecordLog(level="info", message="hello", step_id=log_step), None
    if kind == "request_cancel":
        return RequestCancel(reason=draw(st.sampled_from(_REASONS))), None
    if kind == "complete_run":
        return CompleteRun(output=draw(small)), None
    if kind == "fail_run":
        return FailRun(error=draw(small), error_code=draw(st.sampled_from((None, "boom")))), None
    if kind == "cancel_run":
        return CancelRun(reason=draw(st.sampled_from(_REASONS))), None
    if kind == "time_out":
        return TimeOutRun(deadline=snap.deadline or now, reason="deadline"), None
    return draw(arbitrary), None


def _envelopes(run_id: str, after: int, events: Sequence[Event], at: datetime) -> list[Envelope]:
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
    create = definition.apply(draw(_create_runs(run_id, start, invalid=False)))
    try:
        opening = draw(st.sampled_from((create, StartRun(create=create))))
        first = decide(None, opening, now=now, limits=limits)
    except Rejection:  # tight `limits` may refuse the two events of a resilient start
        first = decide(None, create, now=now, limits=limits)
    history = _envelopes(run_id, 0, first.events, now)
    snap = project_run(history, limits=limits)
    arbitrary = _cached_commands(run_id, start)
    count = _weighted((1, st.integers(0, max_commands)), (2, st.just(max_commands)))
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
            new = _envelopes(run_id, snap.last_sequence, decision.events, now)
            # A HistoryError here would break the closure law; it propagates on purpose.
            snap = apply(snap, new, limits=limits)
            history.extend(new)
    return history


def valid_histories(
    run_id: str = DEFAULT_RUN_ID,
    *,
    max_commands: int = 40,
    start: datetime = START,
    limits: Limits = _DEFAULT_LIMITS,
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
    cut = draw(_weighted((1, st.integers(1, len(history))), (1, st.just(len(history)))))
    return project_run(history[:cut], limits=limits)


def snapshots(
    run_id: str = DEFAULT_RUN_ID,
    *,
    max_commands: int = 40,
    start: datetime = START,
    limits: Limits = _DEFAULT_LIMITS,
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


# --- invalid histories --------------------------------------------------------------------------

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
        return h + _envelopes(run_id, n, extra, at), n + len(extra)
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
        return h + _envelopes(run_id, n, extra, at), n + 2
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
        return h + _envelopes(run_id, n, [event], at), n + 1
    if kind == "outcome_after_outcome":
        done = _ids_where(project_run(h).steps, lambda s: s.status not in ("pending", "running"))
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
        return h + _envelopes(run_id, n, [event], at), n + 1
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


# --- events -------------------------------------------------------------------------------------


def _event_strategies() -> dict[type[Event], st.SearchStrategy[Event]]:
    text, data, time, ints = _ANY_TEXT, _ANY_BYTES, _UTC_TIMES, st.integers()
    opt_text, opt_data, opt_time = _optional(text), _optional(data), _optional(time)
    retry = st.builds(
        RetryPolicy,
        max_attempts=ints,
        initial_interval=st.timedeltas(),
        backoff_coefficient=st.floats(allow_nan=False),
        max_interval=_optional(st.timedeltas()),
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
            total=_optional(ints),
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
        ),
        StepCreated: st.builds(
            StepCreated, step_id=text, step_name=text, input=data, retry=_optional(retry)
        ),
        StepStarted: st.builds(
            StepStarted,
            step_id=text,
            attempt=ints,
            after_interruption=st.booleans(),
            retry=_optional(retry),
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
