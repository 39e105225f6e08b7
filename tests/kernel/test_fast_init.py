"""The kernel and engine classes whose `__init__` `fast.fast_init` wrote: same signature and
same result as attrs' own, and still frozen."""

from __future__ import annotations

import inspect
from typing import Any, cast

import attrs
import pytest
from hypothesis import given

from runfold.conformance.strategies import events
from runfold.engine import runtime as runtime_module
from runfold.kernel import EVENT_TYPES, Envelope, Event
from runfold.kernel import commands as commands_module
from runfold.kernel import index as index_module
from runfold.kernel.batch import BatchDecision
from runfold.kernel.fast import fast_init, frozen_factory


def _fast(cls: type[Any]) -> bool:
    return "fast_init" in cls.__init__.__code__.co_filename


CLASSES = sorted(
    {
        cls
        for cls in [
            *EVENT_TYPES.values(),
            Envelope,
            BatchDecision,
            *(getattr(commands_module, name) for name in dir(commands_module)),
            *(getattr(index_module, name) for name in dir(index_module)),
            *(getattr(runtime_module, name) for name in dir(runtime_module)),
        ]
        if isinstance(cls, type) and attrs.has(cls) and _fast(cls)
    },
    key=lambda cls: cls.__name__,
)


def test_the_hot_kernel_classes_have_one() -> None:
    names = {cls.__name__ for cls in CLASSES}
    assert {"StepStarted", "StepCompleted", "StartStep", "Decision", "RunSummary"} <= names
    assert {"BatchDecision", "Envelope", "ScheduleStep", "StepInvocation"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_its_signature_is_the_attrs_fields(cls: type[Any]) -> None:
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = attrs.fields(cls)
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields, strict=True):
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        expected = inspect.Parameter.empty if field.default is attrs.NOTHING else field.default
        assert parameter.default is expected


@given(events())
def test_an_event_built_again_is_equal_and_frozen(event: Event) -> None:
    cls = type(event)
    values = {f.name: getattr(event, f.name) for f in attrs.fields(cast(Any, cls))}
    built = cls(**values)
    converted = any(f.converter is not None for f in attrs.fields(cast(Any, cls)))
    made = [] if converted else [frozen_factory(cls)(*values.values())]
    for one in (built, *made):
        assert type(one) is cls  # filled as its twin, then made a `cls`
        assert one == event
        assert {name: getattr(one, name) for name in values} == values
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            one.anything = 1  # type: ignore[attr-defined]
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(one, next(iter(values), "x"), 1)


def test_missing_and_unknown_arguments_are_refused_as_attrs_does() -> None:
    from runfold.kernel import StepStarted

    with pytest.raises(TypeError, match="attempt"):
        StepStarted(step_id="s")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        StepStarted(step_id="s", attempt=1, extra=2)  # type: ignore[call-arg]
    assert StepStarted(step_id="s", attempt=1).after_interruption is False


def test_a_class_it_cannot_take_is_refused() -> None:
    @attrs.frozen(kw_only=True)
    class Checked:
        value: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen(kw_only=True)
    class Made:
        values: list[int] = attrs.Factory(list)

    for cls in (Checked, Made):
        with pytest.raises(TypeError):
            fast_init(cls)


def test_a_subclass_instance_keeps_its_class() -> None:
    @fast_init
    @attrs.frozen(kw_only=True)
    class Point:
        x: int
        y: int
        z: int = 0

    class Named(Point):
        __slots__ = ()

    assert type(Point(x=1, y=2)) is Point
    named = Named(x=1, y=2, z=3)
    assert type(named) is Named
    assert (named.x, named.y, named.z) == (1, 2, 3)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        named.x = 5  # type: ignore[misc]
