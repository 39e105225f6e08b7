"""How events travel: the CBOR primitives and each event class's layout on the wire.

`EventCodec` (`runfold.kernel.codec`) owns the catalogue, the schema versions and the
upcasters; this module holds what it builds on: strict reading of CBOR items (`one_item`,
`load_payloads`), the cattrs converter with runfold's hooks (times and durations as integer
microseconds, a `Writer` as a small tagged map, no silent coercion), and `Layout`, one event
class's positional and by-name forms.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import UnionType
from typing import Any

import attrs
import cattrs
import cbor2

from runfold.kernel.events import Event, StepWriter, WorkflowWriter, Writer

__all__ = [
    "REQUIRED",
    "Layout",
    "compile_fields",
    "compile_wire",
    "load_payloads",
    "make_converter",
    "one_item",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_loads = cbor2.loads
_MICROSECOND = timedelta(microseconds=1)
_SEPARATOR = b"\xf7"
"""CBOR `undefined`, written after each payload of a bulk decode: no event field is ever
undefined, so finding it after every item, and only there, shows that the payloads split
where the rows do."""
_UNDEFINED = cbor2.undefined
_MARK = os.urandom(16)
_AFTER_ITEM = cbor2.dumps(_MARK)


def one_item(*parts: bytes) -> Any:
    """The one CBOR item that `parts`, joined, hold, read strictly.

    cbor2 stops at the end of the first item and ignores what follows, and keeps the last of
    duplicate map keys. Here a duplicate key raises `CBORDecodeError`, and the bytes are read
    as the first of a two-item array whose second is a random marker of this process: bytes
    after the item are read in the marker's place (or make the marker unreadable), so anything
    but exactly one item raises `ValueError`. No stored payload can hold a marker drawn at
    start. (The parts are joined with the wrapper at once: a read's buffer is copied once.)
    """
    both = _loads(b"".join((b"\x82", *parts, _AFTER_ITEM)), allow_duplicate_keys=False)
    if both[1] != _MARK:
        raise ValueError("has bytes after its CBOR item")
    return both[0]


def _time_to_wire(value: datetime) -> int:
    return (value - _EPOCH) // _MICROSECOND


def _time_from_wire(value: Any, _: Any) -> datetime:
    if type(value) is not int:
        raise TypeError(f"time must be integer microseconds, not {type(value).__name__}")
    return _EPOCH + timedelta(0, 0, value)


def _duration_from_wire(value: Any, _: Any) -> timedelta:
    if type(value) is not int:
        raise TypeError(f"duration must be integer microseconds, not {type(value).__name__}")
    return timedelta(0, 0, value)


def _exact(kind: type) -> Callable[[Any, Any], Any]:
    """A structure hook that accepts only values already of `kind` (no silent coercion)."""

    def structure(value: Any, _: Any) -> Any:
        if type(value) is not kind:
            raise TypeError(f"expected {kind.__name__}, found {type(value).__name__}")
        return value

    return structure


def _float_from_wire(value: Any, _: Any) -> float:
    if type(value) is float or type(value) is int:
        return float(value)
    raise TypeError(f"expected float, found {type(value).__name__}")


def _writer_to_wire(value: Writer) -> dict[str, Any]:
    if isinstance(value, StepWriter):
        return {"kind": "step", "step_id": value.step_id, "attempt": value.attempt}
    return {"kind": "workflow"}


def _writer_from_wire(value: Any, _: Any) -> Writer:
    kind = value.get("kind") if isinstance(value, dict) else None
    if kind == "workflow":
        return WorkflowWriter()
    if kind == "step" and type(value.get("step_id")) is str and type(value.get("attempt")) is int:
        return StepWriter(step_id=value["step_id"], attempt=value["attempt"])
    raise TypeError("writer must be {kind: workflow} or {kind: step, step_id, attempt}")


def _is_str_mapping(kind: Any) -> bool:
    return bool(kind == Mapping[str, str])


def make_converter() -> cattrs.Converter:
    """A cattrs converter with runfold's wire hooks: exact scalars, times, durations, writers."""
    converter = cattrs.Converter(detailed_validation=False)
    converter.register_unstructure_hook(datetime, _time_to_wire)
    converter.register_structure_hook(datetime, _time_from_wire)
    converter.register_unstructure_hook(timedelta, lambda d: d // _MICROSECOND)
    converter.register_structure_hook(timedelta, _duration_from_wire)
    for kind in (str, bytes, int, bool):
        converter.register_structure_hook(kind, _exact(kind))
    converter.register_structure_hook(float, _float_from_wire)
    converter.register_unstructure_hook(Writer, _writer_to_wire)
    converter.register_structure_hook(Writer, _writer_from_wire)
    converter.register_unstructure_hook_factory(_is_str_mapping, lambda _: dict)
    return converter


_AS_IS = frozenset({str, bytes, int, bool, type(None)})
"""Field types that travel as they are: cattrs' unstructure hook for each is the identity."""


def _travels_as_is(hint: Any) -> bool:
    if hint in _AS_IS:
        return True
    return type(hint) is UnionType and all(arg in _AS_IS for arg in typing.get_args(hint))


def compile_fields(
    cls: type[Event], hints: Mapping[str, Any], hook: Callable[[Any], Callable[[Any], Any]]
) -> Callable[[Event], list[Any]]:
    """`event -> [field, …]` in declaration order, each unstructured as cattrs would.

    Written out once per class, because the encode of every append runs it: a field of a type
    that travels as it is is read straight off the event; any other goes through the
    converter's hook for its type (the one cattrs' own unstructure of the class calls).
    """
    namespace: dict[str, Any] = {}
    items = []
    for number, field in enumerate(attrs.fields(cls)):  # type: ignore[arg-type]
        hint = hints[field.name]
        if _travels_as_is(hint):
            items.append(f"e.{field.name}")
        else:
            namespace[f"h{number}"] = hook(hint)
            items.append(f"h{number}(e.{field.name})")
    source = f"def fields(e):\n    return [{', '.join(items)}]\n"
    exec(compile(source, f"<runfold encoder {cls.__name__}>", "exec"), namespace)
    return namespace["fields"]  # type: ignore[no-any-return]


REQUIRED: Any = object()
"""The wire default of a field that has none: no value a field can hold equals it."""


def compile_wire(
    cls: type[Event],
    hints: Mapping[str, Any],
    hook: Callable[[Any], Callable[[Any], Any]],
    wire_defaults: Sequence[Any],
) -> Callable[[Event], list[Any]]:
    """`event -> [field, …]` as `compile_fields` gives it, trailing defaults left out.

    The positional wire form, written out once per class as straight-line code: each trailing
    field that may hold its default is compared with it (same type, equal) from the last one
    back, and the list is built as long as the first that differs, so an append's encode runs
    no loop and trims no list.
    """
    fields = attrs.fields(cls)  # type: ignore[arg-type]
    namespace: dict[str, Any] = {}
    lines = ["def wire(e):"]
    for number, field in enumerate(fields):
        if _travels_as_is(hints[field.name]):
            lines.append(f"    a{number} = e.{field.name}")
        else:
            namespace[f"h{number}"] = hook(hints[field.name])
            lines.append(f"    a{number} = h{number}(e.{field.name})")
    count = len(fields)
    while count and wire_defaults[count - 1] is not REQUIRED:
        default = wire_defaults[count - 1]
        name = f"a{count - 1}"
        if default is None or type(default) is bool:
            differs = f"{name} is not {default!r}"  # the one value of its type that is equal
        else:
            namespace[f"d{count - 1}"], namespace[f"t{count - 1}"] = default, type(default)
            differs = f"type({name}) is not t{count - 1} or {name} != d{count - 1}"
        lines.append(f"    if {differs}:")
        lines.append(f"        return [{', '.join(f'a{n}' for n in range(count))}]")
        count -= 1
    lines.append(f"    return [{', '.join(f'a{n}' for n in range(count))}]")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<runfold wire {cls.__name__}>", "exec"), namespace)
    return namespace["wire"]  # type: ignore[no-any-return]


@attrs.frozen
class Layout:
    """What the codec knows of one event class: its wire forms and how to build it from each."""

    cls: type[Event]
    unstructure: Callable[[Event], dict[str, Any]]
    by_name: Callable[[Any], Event]
    by_position: Callable[[Any], Event]
    wire_defaults: tuple[Any, ...]
    """Each field's default as it travels (`REQUIRED` for a field without one)."""
    fields: Callable[[Event], list[Any]]
    """The event's fields as they travel, in order (`compile_fields`)."""
    positional: Callable[[Event], list[Any]]
    """The same without the trailing fields that hold their defaults (`compile_wire`)."""

    def encode(self, event: Event) -> Any:
        """The event's wire form: a list of its fields (trailing defaults left out) or a map."""
        if not self.cls.positional:
            return self.unstructure(event)
        return self.positional(event)

    def structure(self, data: Any) -> Event:
        """The event that a wire form (a map by field name or a list by position) holds."""
        return self.by_name(data) if type(data) is dict else self.by_position(data)


def load_payloads(payloads: Sequence[bytes]) -> list[Any]:
    """The CBOR items of `payloads`, read in one call of the CBOR decoder.

    Each item is a payload's unstructured form, not yet upcast or structured.

    Raises `ValueError` when a payload is not exactly one CBOR item, and what the CBOR decoder
    raises for bytes that are not CBOR or a map naming a key twice.
    """
    count = len(payloads)
    items = one_item(b"\x9f", _SEPARATOR.join(payloads), _SEPARATOR + b"\xff")  # strictly
    if len(items) != 2 * count or items[1::2].count(_UNDEFINED) != count:
        raise ValueError("the payloads did not split where the rows do")
    return items[0::2]  # type: ignore[no-any-return]
