"""Field values, from the ones the kernel's rules accept to the hostile ones they must survive.

Commands and events are built from these. With `invalid=False` a value is one the rules accept,
drawn from the small pools so that commands hit existing entities. With `invalid=True` the
values the rules refuse are mixed in: empty, over-long and control-character ids, lone
surrogates, oversized payloads, bad retry policies, too many attributes. `ANY_TEXT`, `ANY_BYTES`
and `UTC_TIMES` go further, to anything a field's type allows (NUL and astral characters, 2 MiB
payloads, the years 1970 to 9999), for codec and store round trips.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import strategies as st

from runfold.conformance.strategies._odds import optional, weighted
from runfold.conformance.strategies._pools import ATTRIBUTE_KEYS, STEP_IDS
from runfold.kernel import AttributeChange, LazyStep, RetryPolicy, StepWriter, WorkflowWriter
from runfold.kernel.limits import DEFAULT_LIMITS

__all__ = [
    "ANY_BYTES",
    "ANY_TEXT",
    "UTC_TIMES",
    "attribute_changes",
    "attribute_maps",
    "ids",
    "labels",
    "lazy_steps",
    "payloads",
    "retry_policies",
    "texts",
    "times",
    "writers",
]

_UTC_MIN = datetime(1970, 1, 1)
_UTC_MAX = datetime(9999, 12, 31, 23, 59, 59, 999999)
_OFFSETS = (
    UTC,
    timezone(timedelta(hours=5, minutes=30)),
    timezone(timedelta(hours=-8)),
    timezone(timedelta(hours=14)),
)

# --- anything the field types allow -------------------------------------------------------------

_SAFE_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
"""Text without lone surrogates: NUL, control characters, astral characters included."""
_ASTRAL = st.sampled_from(("😀", "𝄞", "\U0010ffff", "\U00020000"))
ANY_TEXT = weighted(
    (6, _SAFE_TEXT),
    (2, st.text(st.one_of(st.characters(codec="utf-8"), _ASTRAL, st.just("\x00")), max_size=40)),
    (1, st.just("")),
    (1, st.sampled_from((65_537, 300_000)).map(lambda n: ("x" * n) + "😀")),
)
"""Event text: anything encodable, from empty to large."""

_LARGE_BYTES = bytes(range(256)) * (2 * 1024 * 1024 // 256 + 1)
ANY_BYTES = weighted(
    (6, st.binary(max_size=64)),
    (2, st.just(b"")),
    (1, st.integers(1, 512).map(lambda n: b"\x00" * n)),
    (
        1,
        st.sampled_from((65_536, 1024 * 1024 + 3, 2 * 1024 * 1024)).map(lambda n: _LARGE_BYTES[:n]),
    ),
)
"""Event payloads: NUL bytes, empty, and large (up to 2 MiB)."""

UTC_TIMES = st.datetimes(min_value=_UTC_MIN, max_value=_UTC_MAX, timezones=st.just(UTC))
"""Aware UTC datetimes from 1970 to the end of year 9999, microsecond precision."""

# --- values the rules accept, and (invalid=True) values they refuse ------------------------------


def ids(pool: Sequence[str], invalid: bool) -> st.SearchStrategy[str]:
    """Ids from `pool`; with `invalid`, sometimes unusual ones and ones the rules refuse."""
    valid = st.sampled_from(pool)
    if not invalid:
        return valid
    unusual = st.sampled_from(("ü-id", "😀", "x" * 256, "a b"))
    broken = st.sampled_from(("", "x" * 257, "bad\x00id", "tab\tid", "\x85", "\ud800"))
    return weighted((12, valid), (1, unusual), (1, broken))


def labels(invalid: bool) -> st.SearchStrategy[str]:
    """Workflow, step and child kind names, as `ids` draws them."""
    return ids(("fetch", "send", "charge"), invalid)


def payloads(invalid: bool) -> st.SearchStrategy[bytes]:
    """Small payloads (NUL bytes included); with `invalid`, sometimes one over the size limit."""
    valid = weighted(
        (3, st.sampled_from((b"", b"x", b"\x00", b"\x00\xff\x00"))), (1, st.binary(max_size=16))
    )
    if not invalid:
        return valid
    # Over-limit values are built by `.map`: as literals they would sit in the strategy's
    # repr, which hypothesis prints in reports (and warns about past 30 kB).
    too_big = st.just(DEFAULT_LIMITS.max_payload_bytes + 1).map(bytes)
    return weighted((20, valid), (1, too_big))


def texts(invalid: bool) -> st.SearchStrategy[str]:
    """Messages; with `invalid`, sometimes a lone surrogate or one over the size limit."""
    valid = weighted((3, st.sampled_from(("", "why", "😀 astral", "nul\x00"))), (1, _SAFE_TEXT))
    if not invalid:
        return valid
    broken = st.just("\ud800") | st.just(DEFAULT_LIMITS.max_payload_bytes + 1).map("x".__mul__)
    return weighted((15, valid), (1, broken))


def times(around: datetime, anywhere: bool = True) -> st.SearchStrategy[datetime]:
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
        return weighted((6, near), (2, exact))
    return weighted((6, near), (2, exact), (2, far))


def retry_policies(invalid: bool) -> st.SearchStrategy[RetryPolicy]:
    """Retry policies; with `invalid`, sometimes one the rules refuse (no attempts, NaN, …)."""
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
    return weighted((8, valid), (1, broken))


def attribute_changes(invalid: bool) -> st.SearchStrategy[tuple[AttributeChange, ...]]:
    """Batches of attribute changes; with `invalid`, bad keys and values, repeats, too many."""
    value = optional(st.sampled_from(("v", "", "ü" * 128)))
    keys = st.sampled_from(ATTRIBUTE_KEYS)
    if invalid:
        value = weighted((12, value), (1, st.just("x" * 257)), (1, st.just("\ud800")))
        keys = weighted((12, keys), (1, st.sampled_from(("", "k" * 257, "\ud800"))))
    change = st.builds(AttributeChange, key=keys, value=value)
    batch = st.lists(change, max_size=4, unique_by=(lambda c: c.key) if not invalid else None)
    many = st.just(tuple(AttributeChange(key=f"bulk{i}", value="v") for i in range(65)))
    if not invalid:
        return batch.map(tuple)
    return weighted((15, batch.map(tuple)), (1, many))


def attribute_maps(invalid: bool) -> st.SearchStrategy[dict[str, str]]:
    """A new run's attributes; with `invalid`, reserved, empty or over-long ones, or too many."""
    keys = ATTRIBUTE_KEYS if invalid else ATTRIBUTE_KEYS[:3]
    valid = st.dictionaries(st.sampled_from(keys), st.sampled_from(("v", "")), max_size=3)
    if not invalid:
        return valid
    too_many = st.just({f"bulk{i}": "v" for i in range(65)})
    broken = st.sampled_from(({"": "v"}, {"k0": "x" * 257}, {"k" * 257: "v"}))
    return weighted((12, valid), (1, too_many), (1, broken))


def lazy_steps(invalid: bool) -> st.SearchStrategy[LazyStep]:
    """The step a `StartStep` creates as it starts it."""
    return st.builds(
        LazyStep,
        step_name=labels(invalid),
        input=payloads(invalid),
        retry=optional(retry_policies(invalid)),
    )


def writers(invalid: bool) -> st.SearchStrategy[WorkflowWriter | StepWriter]:
    """Who sets attributes: the workflow, or an attempt of a step from `STEP_IDS`."""
    step_writer = st.builds(StepWriter, step_id=ids(STEP_IDS, invalid), attempt=st.integers(0, 3))
    return st.one_of(st.just(WorkflowWriter()), step_writer)
