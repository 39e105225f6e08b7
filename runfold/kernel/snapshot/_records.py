"""The fold's private records of a run's entities, and how each becomes its frozen state.

A fold keeps each step, wait and hook as a small slotted, mutable record, not as its frozen
`StepState`/`WaitState`/`HookState`: an event changes a field or two of one entity, and
changing a record in place costs far less than building a new frozen state per event. A record
belongs to one fold until that fold publishes it in a snapshot; a later fold clones it before
changing it (copy on write), so a published record never changes, and its frozen state is
built once, when first read (`empty_records` gives the snapshot mappings that do it).
"""

from __future__ import annotations

from datetime import datetime
from sys import intern
from typing import Any

import attrs

from runfold.kernel._pmap import PView
from runfold.kernel.events import HookCreated, RetryPolicy
from runfold.kernel.fast import filling_twin, frozen_factory
from runfold.kernel.snapshot.states import (
    Delivery,
    HookState,
    HookStatus,
    StepState,
    StepStatus,
    WaitState,
    WaitStatus,
)

__all__ = [
    "HookRecord",
    "StepRecord",
    "WaitRecord",
    "WideStepRecord",
    "empty_records",
    "empty_values",
]


class _Record:
    # `frozen` caches the public state of a published record (None until first asked): a fold
    # clones a record before it changes it (`Builder.step` …), so a published one never
    # changes. Subclasses list their fields in their own `__slots__`, which `clone` walks
    # (`_slots`: a base record's too, without `frozen`); `freeze` walks `_fields`, the public
    # class's fields in order (set by `_public_factory`).
    __slots__ = ("frozen",)
    frozen: Any
    public: Any
    _fields: tuple[str, ...]
    _make: Any

    def clone(self) -> Any:
        """A copy for a fold to change, with lists of its own and no cached frozen state."""
        # Replaced per record class by `_compiled_copies` (straight-line code, no loop over
        # the slots): a fold clones a record per entity an event changes.
        raise NotImplementedError

    def freeze(self) -> Any:
        """A new frozen public state of this record, its lists made tuples."""
        raise NotImplementedError  # replaced per record class by `_compiled_copies`


class StepRecord(_Record):
    """A step while folds change it: the fields of its `StepState`, mutable.

    The fields most steps never set (`start_id`, `retry_after`, `error`) are not slots here
    but None on the class, a slot fewer each per step a run holds: a fold that sets one gives
    the step a `WideStepRecord` first (`Builder.wide_step`), and setting one here raises.
    """

    __slots__ = (
        "attempt",
        "completed_at",
        "created_at",
        "input",
        "output",
        "retry",
        "started_at",
        "status",
        "step_id",
        "step_name",
        "updated_at",
    )
    public = StepState
    status: StepStatus
    attempt: int
    retry: RetryPolicy | None
    started_at: datetime | None
    output: bytes | None
    completed_at: datetime | None
    updated_at: datetime
    start_id: str | None = None
    retry_after: datetime | None = None
    error: bytes | None = None

    def __init__(
        self, step_id: str, step_name: str, input: bytes, retry: RetryPolicy | None, at: datetime
    ) -> None:
        self.frozen = None
        self.step_id = step_id
        self.step_name = intern(step_name)  # a run repeats a few names thousands of times
        self.status = "pending"
        self.input = input
        self.retry = retry
        self.attempt = 0
        self.output = None
        self.created_at = at
        self.started_at = None
        self.completed_at = None
        self.updated_at = at

    def widened(self) -> WideStepRecord:
        """A copy for a fold to change that has slots for the fields most steps never set."""
        wide: WideStepRecord = object.__new__(WideStepRecord)
        wide.frozen = wide.start_id = wide.retry_after = wide.error = None
        for name in StepRecord.__slots__:
            setattr(wide, name, getattr(self, name))
        return wide


class WideStepRecord(StepRecord):
    """A `StepRecord` with slots for `start_id`, `retry_after` and `error`, once one is set."""

    __slots__ = ("error", "retry_after", "start_id")


class WaitRecord(_Record):
    """A wait while folds change it: the fields of its `WaitState`, mutable."""

    __slots__ = ("completed_at", "created_at", "resume_at", "status", "wait_id")
    public = WaitState
    status: WaitStatus
    completed_at: datetime | None

    def __init__(self, wait_id: str, resume_at: datetime, at: datetime) -> None:
        self.frozen = None
        self.wait_id = wait_id
        self.status = "waiting"
        self.resume_at = resume_at
        self.created_at = at
        self.completed_at = None


class HookRecord(_Record):
    """A hook while folds change it: the fields of its `HookState`, deliveries in a list."""

    __slots__ = (
        "created_at",
        "deliveries",
        "hook_id",
        "is_webhook",
        "metadata",
        "retain_token_until",
        "status",
        "token",
    )
    public = HookState
    status: HookStatus
    deliveries: list[Delivery]

    def __init__(self, ev: HookCreated, at: datetime) -> None:
        self.frozen = None
        self.hook_id = ev.hook_id
        self.token = ev.token
        self.status = "active"
        self.metadata = ev.metadata
        self.is_webhook = ev.is_webhook
        self.retain_token_until = ev.retain_token_until
        self.created_at = at
        self.deliveries = []


def _public_factory(record: type[_Record]) -> None:
    """Give `record` the positional constructor of its public class, that class's field order
    (the record's slots hold those names, but for fields None on its class), and its compiled
    `clone` and `freeze`."""
    fields = tuple(field.name for field in attrs.fields(record.public))
    slots = set(_slots(record))  # a field not among them is None on the class
    assert slots <= set(fields), record
    assert all(getattr(record, name) is None for name in set(fields) - slots), record
    record._fields = fields
    record._make = staticmethod(frozen_factory(record.public))
    _compiled_copies(record, fields)


def _compiled_copies(record: type[_Record], fields: tuple[str, ...]) -> None:
    """`clone` and `freeze` of `record` as straight-line code over its fields.

    The fields annotated as lists (a hook's deliveries) are copied by `clone` and
    made tuples by `freeze`, as the loops these replace did for any list value; a field with
    no slot (None on the class) is a constant None in `freeze`.
    """
    annotations = getattr(record, "__annotations__", {})
    lists = {name for name in fields if str(annotations.get(name, "")).startswith("list[")}

    def copied(name: str) -> str:
        return f"self.{name}.copy()" if name in lists else f"self.{name}"

    slots = _slots(record)

    def frozen(name: str) -> str:
        if name not in slots:
            return "None"  # no slot: None on the class
        return f"tuple(self.{name})" if name in lists else f"self.{name}"

    clone = "\n".join(
        ["def clone(self):", "    copy = new(cls)", "    copy.frozen = None"]
        + [f"    copy.{name} = {copied(name)}" for name in slots]
        + ["    return copy"]
    )
    # The public state filled as its twin, each field read off the record and stored: no call
    # of as many arguments as it has fields (a step's state is made twice a step).
    twin = filling_twin(record.public)
    if twin is None:
        freeze = f"def freeze(self):\n    return make({', '.join(frozen(n) for n in fields)})\n"
    else:
        freeze = "\n".join(
            ["def freeze(self):", "    made = new(twin)"]
            + [f"    made.{name} = {frozen(name)}" for name in fields]
            + ["    made.__class__ = public", "    return made", ""]
        )
    namespace: dict[str, Any] = {
        "new": object.__new__,
        "cls": record,
        "make": record._make,
        "twin": twin,
        "public": record.public,
    }
    exec(compile(clone + "\n" + freeze, f"<runfold record {record.__name__}>", "exec"), namespace)
    for name in ("clone", "freeze"):
        made = namespace[name]
        made.__doc__ = getattr(_Record, name).__doc__
        made.__qualname__ = f"{record.__name__}.{name}"
        setattr(record, name, made)


def _slots(record: type[_Record]) -> tuple[str, ...]:
    """The fields `record` keeps in slots, its base classes' too, without `frozen`."""
    return tuple(
        name
        for cls in reversed(record.__mro__)
        if issubclass(cls, _Record) and cls is not _Record
        for name in cls.__dict__.get("__slots__", ())
    )


for _record in (StepRecord, WideStepRecord, WaitRecord, HookRecord):
    _public_factory(_record)


def _public_record(record: Any) -> Any:
    frozen = record.frozen
    if frozen is None:
        record.frozen = frozen = record.freeze()
    return frozen


def empty_records() -> PView[Any, Any]:
    """An empty mapping of records that reads each as its frozen state, built once and kept."""
    return PView({}, _public_record)


def empty_values() -> PView[Any, Any]:
    """An empty mapping of values that are already frozen (events, sequences)."""
    return PView({})
