"""The wire format: cattrs unstructures an event, cbor2 encodes it.

A stored event is `(type, schema_version, payload)`. Times travel as integer microseconds since
the Unix epoch (exact, and faster than CBOR's date tags); durations as integer microseconds; a
`Writer` as a small tagged map. Upcasters lift a payload written at an older `schema_version` of
its type, one version at a time, before it is structured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

import attrs
import cattrs
import cbor2

from runfold.kernel._fast import compile_decoder
from runfold.kernel.errors import EventDecodeError
from runfold.kernel.events import (
    EVENT_TYPES,
    AttributesSet,
    ChildLinked,
    Event,
    HookConflict,
    HookCreated,
    HookDisposed,
    HookReceived,
    LogRecorded,
    ProgressRecorded,
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
    Writer,
)

__all__ = [
    "EventCodec",
    "Upcaster",
    "correlation_id",
    "decode_event",
    "default_codec",
    "encode_event",
]

Upcaster: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns the unstructured payload of schema version N into that of version N + 1."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_loads = cbor2.loads
_MICROSECOND = timedelta(microseconds=1)


def _time_to_wire(value: datetime) -> int:
    return (value - _EPOCH) // _MICROSECOND


def _time_from_wire(value: Any, _: Any) -> datetime:
    if type(value) is not int:
        raise TypeError(f"time must be integer microseconds, not {type(value).__name__}")
    return _EPOCH + timedelta(microseconds=value)


def _duration_from_wire(value: Any, _: Any) -> timedelta:
    if type(value) is not int:
        raise TypeError(f"duration must be integer microseconds, not {type(value).__name__}")
    return timedelta(microseconds=value)


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


def _make_converter() -> cattrs.Converter:
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


class EventCodec:
    """Encodes and decodes events; holds the upcaster registry.

    Most users need only the module functions `encode_event`/`decode_event`, which use
    `default_codec`. A runtime that evolves an event's schema registers an upcaster there.
    """

    def __init__(self, event_types: Mapping[str, type[Event]] = EVENT_TYPES) -> None:
        self._types = dict(event_types)
        self._converter = _make_converter()
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._unstructure = {
            cls: self._converter.get_unstructure_hook(cls) for cls in self._types.values()
        }
        self._structure = {name: (cls, self._decoder_for(cls)) for name, cls in self._types.items()}
        # The hot path: payloads written at the current schema version of their type.
        self._current = {
            (name, cls.schema_version): decoder for name, (cls, decoder) in self._structure.items()
        }

    def _decoder_for(self, cls: type[Event]) -> Callable[[dict[str, Any]], Event]:
        fields = attrs.fields(cls)  # type: ignore[arg-type]
        post = {f.name: f.converter for f in fields if callable(f.converter)}
        return compile_decoder(cls, self._converter.get_structure_hook, post)

    def register_upcaster(self, event_type: str, from_version: int, upcaster: Upcaster) -> None:
        """Register how to lift `event_type` payloads from `from_version` to `from_version + 1`."""
        if event_type not in self._types:
            raise ValueError(f"unknown event type {event_type!r}")
        if from_version < 1 or from_version >= self._types[event_type].schema_version:
            raise ValueError(
                f"{event_type}: an upcaster lifts a version below the current "
                f"{self._types[event_type].schema_version}, not {from_version}"
            )
        self._upcasters[(event_type, from_version)] = upcaster

    def encode(self, event: Event) -> tuple[str, int, bytes]:
        """`(type, schema_version, payload)` of an event."""
        cls = type(event)
        unstructure = self._unstructure.get(cls)
        if unstructure is None:
            raise TypeError(f"not a registered event: {cls.__name__}")
        return cls.event_type, cls.schema_version, cbor2.dumps(unstructure(event))

    def decode(self, event_type: str, schema_version: int, payload: bytes) -> Event:
        """The event stored as `(event_type, schema_version, payload)`.

        Raises `EventDecodeError` for an unknown type, a version newer than this runfold, or a
        payload that is not the CBOR map of that type.
        """
        current = self._current.get((event_type, schema_version))
        if current is not None:
            try:
                return current(_loads(payload))
            except Exception:
                pass  # the checked path below says precisely what is wrong
        found = self._structure.get(event_type)
        if found is None:
            raise EventDecodeError(event_type, schema_version, "unknown event type")
        cls, structure = found
        try:
            data = cbor2.loads(payload)
        except Exception as exc:  # cbor2 raises several unrelated classes on bad input
            raise EventDecodeError(event_type, schema_version, f"not CBOR: {exc}") from None
        if type(data) is not dict:
            raise EventDecodeError(event_type, schema_version, "payload is not a map")
        if schema_version != cls.schema_version:
            data = self._upcast(event_type, schema_version, cls.schema_version, data)
        try:
            event: Event = structure(data)
        except KeyError as exc:
            raise EventDecodeError(event_type, schema_version, f"missing field {exc}") from None
        except Exception as exc:  # a field hook (cattrs) refused a value
            raise EventDecodeError(event_type, schema_version, str(exc) or repr(exc)) from None
        return event

    def _upcast(
        self, event_type: str, version: int, current: int, data: dict[str, Any]
    ) -> dict[str, Any]:
        if version > current:
            raise EventDecodeError(
                event_type, version, f"written by a newer runfold (this one reads up to {current})"
            )
        if version < 1:
            raise EventDecodeError(event_type, version, "schema versions start at 1")
        while version < current:
            upcaster = self._upcasters.get((event_type, version))
            if upcaster is None:
                raise EventDecodeError(event_type, version, f"no upcaster from version {version}")
            try:
                data = upcaster(data)
            except Exception as exc:  # an old payload the upcaster cannot lift is undecodable
                raise EventDecodeError(
                    event_type, version, f"upcaster from version {version} failed: {exc!r}"
                ) from exc
            if type(data) is not dict:
                raise EventDecodeError(
                    event_type, version, f"upcaster from version {version} did not return a map"
                )
            version += 1
        return data


default_codec = EventCodec()
"""The codec `encode_event`, `decode_event` and every runfold store use."""


def encode_event(event: Event) -> tuple[str, int, bytes]:
    """`(type, schema_version, payload)` of an event, with the default codec."""
    return default_codec.encode(event)


decode_event = default_codec.decode
"""Decode a stored event with the default codec: `decode_event(type, schema_version, payload)`.

Raises `EventDecodeError` for bytes that do not decode into that type and version.
"""


_CORRELATION_FIELDS: dict[type[Event], str] = {
    StepCreated: "step_id",
    StepStarted: "step_id",
    StepCompleted: "step_id",
    StepFailed: "step_id",
    StepRetrying: "step_id",
    StepCancelled: "step_id",
    LogRecorded: "step_id",
    WaitCreated: "wait_id",
    WaitCompleted: "wait_id",
    HookCreated: "hook_id",
    HookReceived: "hook_id",
    HookDisposed: "hook_id",
    HookConflict: "hook_id",
    AttributesSet: "write_id",
    ProgressRecorded: "progress_id",
    ChildLinked: "reference_id",
}


def correlation_id(event: Event) -> str | None:
    """The entity id an event belongs to, or None for run-level events.

    That is the step, wait, hook, attribute write, progress or child id; a log line belongs to
    its step.
    """
    name = _CORRELATION_FIELDS.get(type(event))
    return None if name is None else getattr(event, name)
